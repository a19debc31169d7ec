// elementwise.cuh -- the per-element arithmetic of SwiGLU (activation.cu) and RMSNorm's output (rmsnorm.cu),
// rounding for rounding, shared with the kernels that fold SwiGLU into their epilogue (gemv.cu, gemm_skinny.cu).
#ifndef TOOLKIT_ELEMENTWISE_CUH
#define TOOLKIT_ELEMENTWISE_CUH
// (after dtype.cuh: kernel_source pastes headers in one level deep, so this one includes nothing itself)

// silu(g) * u; for 16-bit T rounded as HF does (act_fn(gate) * up in T): s = T(silu(float(g))), T(float(s) * u).
template <typename T>
__device__ __forceinline__ T swiglu(T g, T u) {
    const float gf = to_f32(g);
    const T s = from_f32<T>(gf / (1.0f + expf(-gf)));  // g << 0: expf -> inf, g / inf = -0: right limit, no NaN
    return from_f32<T>(to_f32(s) * to_f32(u));
}

// RMSNorm's output element: the normalised value r * inv rounded to T, times the weight, rounded again (HF).
template <typename T>
__device__ __forceinline__ T rms_scale(float r, float inv, T w) {
    return from_f32<T>(to_f32(w) * to_f32(from_f32<T>(r * inv)));
}
#endif
