// dev/rope_runs.cu -- rope_qkv_runs, a dev variant of kernels/rope.cu's rope_qkv (appended to that file's source
// by dev/rope.py, so it uses rope.cuh's rnd and rope_pair and gives the same bits where there is no q/k norm).
//
// Why: rope_qkv gives one warp one (token, head) item with 2-byte accesses, so a warp moves 256 bytes per round trip
// (the row, then its cos/sin row), and a 4,096-token prefill of the 0.5B shape spent 24.7 us a layer where its 19 MB
// take 6 on an H100 (experiments/NOTEBOOK.md, session 16). Four items a warp with the same accesses did not help.
// Here a lane owns runs of V consecutive pairs (i, i + D/2), loads and stores a run of each half as one vector (16
// bytes at V = 8 in 16-bit), and rotates with no data from other lanes. `lpi` lanes (a power of two, <= 32) take one
// item, 32 / lpi items a warp; the per-head norm (Qwen3) sums over those lanes (another order than rope_qkv's warp
// sum: the same value up to fp32 rounding). KR: runs a lane. dev/rope.py's rope_layout picks V, lpi and KR: at D 64
// in bf16, V = 8, 4 lanes an item, 8 items a warp (2 KB a round trip), KR = 1. Launch: block 128 threads = 4 warps,
// grid ceil(T*(Hq+2Hkv) / (4 * 32/lpi)); arguments as rope_qkv's, with lpi before q_out.

// B bytes as one load/store: V elements of T.
template <int B> struct Raw;
template <> struct Raw<2> { using t = unsigned short; };
template <> struct Raw<4> { using t = unsigned int; };
template <> struct Raw<8> { using t = uint2; };
template <> struct Raw<16> { using t = uint4; };
template <typename T, int V> union Run { typename Raw<V * sizeof(T)>::t u; T e[V]; };

template <typename T, int V>
__device__ __forceinline__ Run<T, V> load_run(const T* p) {
    Run<T, V> r;
    r.u = *reinterpret_cast<const typename Raw<V * sizeof(T)>::t*>(p);
    return r;
}

// V fp32 table entries (cos or sin) from a row of D/2: float4 loads where V is a multiple of 4 (the row and the run
// are then 16-byte aligned: V divides D/2).
template <int V>
__device__ __forceinline__ void load_table(const float* p, float (&out)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            const float4 f = reinterpret_cast<const float4*>(p)[q];
            out[4 * q] = f.x; out[4 * q + 1] = f.y; out[4 * q + 2] = f.z; out[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < V; e++) out[e] = p[e];
    }
}

template <typename T, int V, int KR>
__global__ void __launch_bounds__(128)
rope_qkv_runs(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ q_norm,
         const T* __restrict__ k_norm, float eps, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
         const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n_tokens, int Hq, int Hkv,
         int D, int n_pos, int num_slots, int lpi, T* __restrict__ q_out, T* __restrict__ k_cache,
         T* __restrict__ v_cache) {
    // KR: runs a lane, ceil(D/2 / V / lpi): 1 where lpi takes them all (D 64 and 128 at V = 8), at most 2 (4 at V = 1,
    // D 256), lpi being the largest power of two up to D/2 / V.
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    const int NH = Hq + 2 * Hkv, half = D / 2, lane = threadIdx.x & 31;
    const int ipw = 32 / lpi, sub = lane / lpi, gl = lane % lpi;  // item of the warp, lane of the item
    const int item = (blockIdx.x * 4 + (threadIdx.x >> 5)) * ipw + sub;
    if (sub >= ipw || item >= n_tokens * NH) return;  // an item's lanes leave together: shuffles stay within them
    const unsigned group = lpi == 32 ? 0xffffffffu : ((1u << lpi) - 1) << (sub * lpi);
    const int t = item / NH, head = item % NH;
    const int col = head * D;  // column of this head in the fused row (and in the bias)
    // Issued before the row loads, consumed after them: the global round trips overlap.
    const int p = positions[t];
    const int slot = head >= Hq ? slot_mapping[t] : 0;
    float x1[KR][V], x2[KR][V];  // pairs (i, i + D/2), i = (gl + lpi k) V + e; runs past D/2 hold 0
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const int i = (gl + lpi * k) * V;
#pragma unroll
        for (int e = 0; e < V; e++) x1[k][e] = x2[k][e] = 0.0f;
        if (i < half) {
            const Run<T, V> a = load_run<T, V>(qkv + (size_t)t * NH * D + col + i);
            const Run<T, V> b = load_run<T, V>(qkv + (size_t)t * NH * D + col + half + i);
            if (bias) {  // rounded to T: HF's Linear output
                const Run<T, V> ba = load_run<T, V>(bias + col + i), bb = load_run<T, V>(bias + col + half + i);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    x1[k][e] = rnd<T>(to_f32(a.e[e]) + to_f32(ba.e[e]));
                    x2[k][e] = rnd<T>(to_f32(b.e[e]) + to_f32(bb.e[e]));
                }
            } else {
#pragma unroll
                for (int e = 0; e < V; e++) { x1[k][e] = to_f32(a.e[e]); x2[k][e] = to_f32(b.e[e]); }
            }
        }
    }
    if ((unsigned)p >= (unsigned)n_pos) return;                              // outside the rope table
    if (head >= Hq && (unsigned)slot >= (unsigned)num_slots) return;         // padding row (or bad slot): no K/V

    T* dst;
    if (head >= Hq + Hkv) {  // v head: straight to the cache, no norm, no rotation
        dst = v_cache + ((size_t)slot * Hkv + (head - Hq - Hkv)) * D;
    } else {
        const T* norm = head < Hq ? q_norm : k_norm;
        if (norm) {  // per-head RMSNorm over D (Qwen3), fp32 statistics over the item's lanes
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < KR; k++)
#pragma unroll
                for (int e = 0; e < V; e++) ss += x1[k][e] * x1[k][e] + x2[k][e] * x2[k][e];  // unused runs are 0
            for (int o = lpi / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(group, ss, o);
            const float inv = rsqrtf(ss / (float)D + eps);
#pragma unroll
            for (int k = 0; k < KR; k++) {
                const int i = (gl + lpi * k) * V;
                if (i < half)
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        x1[k][e] = rnd<T>(to_f32(norm[i + e]) * rnd<T>(x1[k][e] * inv));
                        x2[k][e] = rnd<T>(to_f32(norm[i + e + half]) * rnd<T>(x2[k][e] * inv));
                    }
            }
        }
#pragma unroll
        for (int k = 0; k < KR; k++) {
            const int i = (gl + lpi * k) * V;
            if (i < half) {
                float c[V], sn[V];
                load_table<V>(cos_t + (size_t)p * half + i, c);
                load_table<V>(sin_t + (size_t)p * half + i, sn);
#pragma unroll
                for (int e = 0; e < V; e++) rope_pair(x1[k][e], x2[k][e], c[e], sn[e]);
            }
        }
        dst = head < Hq ? q_out + ((size_t)t * Hq + head) * D : k_cache + ((size_t)slot * Hkv + (head - Hq)) * D;
    }
#pragma unroll
    for (int k = 0; k < KR; k++) {
        const int i = (gl + lpi * k) * V;
        if (i < half) {
            Run<T, V> a, b;
#pragma unroll
            for (int e = 0; e < V; e++) { a.e[e] = from_f32<T>(x1[k][e]); b.e[e] = from_f32<T>(x2[k][e]); }
            *reinterpret_cast<typename Raw<V * sizeof(T)>::t*>(dst + i) = a.u;
            *reinterpret_cast<typename Raw<V * sizeof(T)>::t*>(dst + half + i) = b.u;
        }
    }
}
