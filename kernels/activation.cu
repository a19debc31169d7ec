// activation.cu -- SwiGLU: out[t, i] = silu(gate[t, i]) * up[t, i],  silu(g) = g / (1 + exp(-g)).
// For 16-bit T the rounding follows HF (act_fn(gate) * up in T): s = T(silu(float(g))); out = T(float(s)*float(up)).
// expf, not __expf: no fast math anywhere, so the fp32 path agrees with the CPU twin to a few ulp.
//
// Layout (row-major): gate_up T[T, 2I] = gate (first I columns) then up (last I columns); out T[T, I].
// Launch: 1-D grid-stride loop, block 256. Each thread handles one 16-byte chunk of the output (8 bf16 / 4 fp32
// elements) when I and the pointers allow it, else single elements. Memory-bound: 3 * T * I * sizeof(T) bytes.
#include "dtype.cuh"
#include "elementwise.cuh"
#include "pdl.cuh"

template <typename T>
__global__ void silu_mul(const T* __restrict__ gate_up, T* __restrict__ out, int n_tokens, int I) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    constexpr int VEC = 16 / sizeof(T);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool vec = I % VEC == 0 && reinterpret_cast<size_t>(gate_up) % 16 == 0 &&
                     reinterpret_cast<size_t>(out) % 16 == 0;
    if (vec) {
        const int per_row = I / VEC;
        const size_t n = (size_t)n_tokens * per_row;
        for (size_t c = first; c < n; c += stride) {
            const size_t t = c / per_row;
            const int i = (int)(c % per_row) * VEC;
            const T* g = gate_up + t * 2 * I + i;
            Chunk<T> gv, uv, ov;
            gv.u = *reinterpret_cast<const uint4*>(g);
            uv.u = *reinterpret_cast<const uint4*>(g + I);
#pragma unroll
            for (int j = 0; j < VEC; j++) ov.e[j] = swiglu(gv.e[j], uv.e[j]);
            *reinterpret_cast<uint4*>(out + t * I + i) = ov.u;
        }
    } else {
        const size_t n = (size_t)n_tokens * I;
        for (size_t c = first; c < n; c += stride) {
            const size_t t = c / I, i = c % I;
            out[c] = swiglu(gate_up[t * 2 * I + i], gate_up[t * 2 * I + I + i]);
        }
    }
}

// silu_mul_scaled: SwiGLU on a gate_up product whose RMSNorm scale is still to apply (the plan's skinny_norm o:
// gemm_skinny_norm left gate_up = W (h * w) and the sums of h^2 in parts, tile by tile). For row t, inv = rsqrt(
// (parts[0][t] + ... + parts[tiles-1][t]) / H + eps), add_rmsnorm's formula; then out = swiglu(T(inv * g),
// T(inv * u)), silu_mul's roundings on the scaled values. Grid (blocks a row, rows), block 256: warp 0 adds the
// row's tiles (lane l takes tiles l, l + 32, ...; then a shuffle tree: a fixed order, so every launch gives the same
// bits), then every thread takes 16-byte chunks of the row. I % VEC == 0, 16-byte aligned rows (the wrapper checks).
template <typename T>
__global__ void silu_mul_scaled(const T* __restrict__ gate_up, T* __restrict__ out, int I,
                                const float* __restrict__ parts, int tiles, int M, int H, float eps) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float s_inv;
    const int t = blockIdx.y;
    const int per_row = I / VEC;
    const T* g = gate_up + (size_t)t * 2 * I;
    T* o = out + (size_t)t * I;
    const int c0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    pdl_enter();
    Chunk<T> gv, uv;  // the first chunk's loads go out before warp 0 sums the row's tiles
    if (c0 < per_row) {
        gv.u = *reinterpret_cast<const uint4*>(g + c0 * VEC);
        uv.u = *reinterpret_cast<const uint4*>(g + I + c0 * VEC);
    }
    if (threadIdx.x < 32) {
        float ss = 0.0f;
        for (int q = threadIdx.x; q < tiles; q += 32) ss += __ldcg(parts + (size_t)q * M + t);
        for (int d = 16; d > 0; d >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, d);
        if (threadIdx.x == 0) s_inv = rsqrtf(ss / (float)H + eps);
    }
    __syncthreads();
    const float inv = s_inv;
    for (int c = c0; c < per_row; c += stride) {
        if (c != c0) {
            gv.u = *reinterpret_cast<const uint4*>(g + c * VEC);
            uv.u = *reinterpret_cast<const uint4*>(g + I + c * VEC);
        }
        Chunk<T> ov;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            ov.e[j] = swiglu(from_f32<T>(inv * to_f32(gv.e[j])), from_f32<T>(inv * to_f32(uv.e[j])));
        *reinterpret_cast<uint4*>(o + c * VEC) = ov.u;
    }
}

template __global__ void silu_mul<float>(const float*, float*, int, int);
template __global__ void silu_mul<__half>(const __half*, __half*, int, int);
template __global__ void silu_mul<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int, int);
template __global__ void silu_mul_scaled<float>(const float*, float*, int, const float*, int, int, int, float);
template __global__ void silu_mul_scaled<__half>(const __half*, __half*, int, const float*, int, int, int, float);
template __global__ void silu_mul_scaled<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int, const float*, int,
                                                        int, int, float);
