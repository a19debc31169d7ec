// rope.cuh -- one warp's share of RoPE for one (token, head) of the fused QKV row: the steps of rope.cu's rope_qkv;
// gemm_skinny.cu's RoPE epilogue uses its rounding (rnd) and rotation (rope_pair), so both produce the same bits.
// Lane l owns the pairs (i, i + D/2) for i = l, l+32, ... (at most MAX_PAIRS, so D <= 256): the per-head norm is a
// warp reduction and the rotation needs no data exchange. Values stay fp32 between the steps; each step rounds to T
// where HF holds a T tensor (see rope.cu).
#pragma once

// Round an fp32 value to T and back: the value HF would hold in a T tensor at this point.
template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f32(from_f32<T>(x)); }

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

// One pair (a, b) = (x[i], x[i+D/2]) rotated by (c, s) = (cos, sin): a c - b s and b c + a s, in fp32 (rounded
// once, by the caller's store). Written with _rn intrinsics so that no call site is contracted into an FMA: the
// products round as the NumPy twin's do, and every kernel that rotates (rope_qkv, decode attention's rope variant,
// gemm_skinny_rope's epilogue) gives the same bits whatever the compiler fuses around it.
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
    const float x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    b = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = x;
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
