// pick.cuh -- choosing the best (value, index) candidate, shared by argmax.cu and sampler.cu.
// NaN beats every number (a NaN logit must surface as an error, never hide behind a real token), and among
// equal values the lowest index wins (torch.argmax's and NumPy's rule). `pack` turns a candidate into a 64-bit
// key whose unsigned order is `better`'s order, so blocks can merge with one atomicMax; it is never 0, so 0
// means "nothing yet" in a zeroed workspace.
#pragma once

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

// High word: the value's bits mapped to an unsigned order (NaN above +inf); low word: ~index.
__device__ __forceinline__ unsigned long long pack(float v, int i) {
    unsigned u = __float_as_uint(v);
    u = isnan(v) ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)(~i);
}
