// rope.cuh -- what every kernel that applies RoPE shares (rope.cu's rope_qkv, gemm_skinny.cu's RoPE epilogue):
// the rounding to T where HF holds a T tensor (rnd) and the rotation of one pair (rope_pair), so that all of them
// produce the same bits.
#pragma once

// Round an fp32 value to T and back: the value HF would hold in a T tensor at this point.
template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f32(from_f32<T>(x)); }

// One pair (a, b) = (x[i], x[i+D/2]) rotated by (c, s) = (cos, sin): a c - b s and b c + a s, in fp32 (rounded
// once, by the caller's store). Written with _rn intrinsics so that no call site is contracted into an FMA: the
// products round as the NumPy twin's do, and every kernel that rotates (rope_qkv, decode attention's rope variant,
// gemm_skinny_rope's epilogue) gives the same bits whatever the compiler fuses around it.
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
    const float x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    b = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = x;
}
