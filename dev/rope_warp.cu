// dev/rope_warp.cu -- rope_qkv_warp: rope_qkv as the product ran it until session 17 (kernels/rope.cu at fa8bab4),
// kept to time today's kernel against (dev/rope.py appends this file to kernels/rope.cu's source). One warp per
// (token, head) item, lane l the pairs (i, i + D/2) for i = l, l + 32, ..., 2-byte loads and stores: a warp moves 256
// bytes a round trip, and a 4,096-token prefill of the 0.5B shape took 22.8 us a layer on an H100 where today's
// kernel (16-byte runs, several items a warp) takes 6.3 (experiments/NOTEBOOK.md, session 17). Launch: block 128
// threads = 4 warps, grid ceil(T*(Hq+2Hkv) / 4); arguments as rope_qkv's without lpi.

constexpr int MAX_PAIRS = 4;  // pairs per lane: D <= 2 * 32 * 4 = 256

// x = src[i], src[i + half] (+ bias at column col + i, rounded to T: HF's Linear output); unused pairs are 0.
template <typename T>
__device__ __forceinline__ void rope_load(const T* src, const T* bias, int col, int half, int lane,
                                          float (&x1)[MAX_PAIRS], float (&x2)[MAX_PAIRS]) {
#pragma unroll
    for (int k = 0; k < MAX_PAIRS; k++) {
        const int i = lane + 32 * k;
        x1[k] = x2[k] = 0.0f;
        if (i < half) {
            float a = to_f32(src[i]), b = to_f32(src[i + half]);
            if (bias) { a = rnd<T>(a + to_f32(bias[col + i])); b = rnd<T>(b + to_f32(bias[col + i + half])); }
            x1[k] = a; x2[k] = b;
        }
    }
}

// Per-head RMSNorm over D (Qwen3 q_norm / k_norm), fp32 statistics. Every lane of the warp must call it.
template <typename T>
__device__ __forceinline__ void rope_norm(const T* norm, float eps, int D, int lane, float (&x1)[MAX_PAIRS],
                                          float (&x2)[MAX_PAIRS]) {
    const int half = D / 2;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < MAX_PAIRS; k++) ss += x1[k] * x1[k] + x2[k] * x2[k];  // unused pairs are 0
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / (float)D + eps);
#pragma unroll
    for (int k = 0; k < MAX_PAIRS; k++) {
        const int i = lane + 32 * k;
        if (i < half) {
            x1[k] = rnd<T>(to_f32(norm[i]) * rnd<T>(x1[k] * inv));
            x2[k] = rnd<T>(to_f32(norm[i + half]) * rnd<T>(x2[k] * inv));
        }
    }
}

// Rotate in place at the position whose tables are cr, sr: out[i] = x[i] c - x[i+D/2] s, out[i+D/2] = x[i+D/2] c +
// x[i] s (rope_pair).
__device__ __forceinline__ void rope_rotate(const float* cr, const float* sr, int half, int lane,
                                            float (&x1)[MAX_PAIRS], float (&x2)[MAX_PAIRS]) {
#pragma unroll
    for (int k = 0; k < MAX_PAIRS; k++) {
        const int i = lane + 32 * k;
        if (i < half) rope_pair(x1[k], x2[k], cr[i], sr[i]);
    }
}

template <typename T>
__device__ __forceinline__ void rope_store(T* dst, int half, int lane, const float (&x1)[MAX_PAIRS],
                                           const float (&x2)[MAX_PAIRS]) {
#pragma unroll
    for (int k = 0; k < MAX_PAIRS; k++) {
        const int i = lane + 32 * k;
        if (i < half) { dst[i] = from_f32<T>(x1[k]); dst[i + half] = from_f32<T>(x2[k]); }
    }
}

template <typename T>
__global__ void __launch_bounds__(128)
rope_qkv_warp(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ q_norm,
         const T* __restrict__ k_norm, float eps, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
         const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n_tokens, int Hq, int Hkv,
         int D, int n_pos, int num_slots, T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    const int NH = Hq + 2 * Hkv;
    const int item = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (item >= n_tokens * NH) return;  // whole warp leaves together: no barrier below, only warp shuffles
    const int t = item / NH, head = item % NH;
    const int half = D / 2;
    const int col = head * D;  // column of this head in the fused row (and in the bias)
    // Issued before the row loads, consumed after them: the three global round trips overlap.
    const int p = positions[t];
    const int slot = head >= Hq ? slot_mapping[t] : 0;
    float x1[MAX_PAIRS], x2[MAX_PAIRS];
    rope_load(qkv + (size_t)t * NH * D + col, bias, col, half, lane, x1, x2);
    if ((unsigned)p >= (unsigned)n_pos) return;                              // outside the rope table
    if (head >= Hq && (unsigned)slot >= (unsigned)num_slots) return;         // padding row (or bad slot): no K/V

    if (head >= Hq + Hkv) {  // v head: straight to the cache, no norm, no rotation
        rope_store(v_cache + ((size_t)slot * Hkv + (head - Hq - Hkv)) * D, half, lane, x1, x2);
        return;
    }
    const bool is_q = head < Hq;
    const T* norm = is_q ? q_norm : k_norm;
    if (norm) rope_norm(norm, eps, D, lane, x1, x2);
    rope_rotate(cos_t + (size_t)p * half, sin_t + (size_t)p * half, half, lane, x1, x2);
    rope_store(is_q ? q_out + ((size_t)t * Hq + head) * D : k_cache + ((size_t)slot * Hkv + (head - Hq)) * D, half,
               lane, x1, x2);
}
