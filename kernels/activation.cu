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

// silu_mul_partials: the same, with gate_up given as S fp32 partial products of a GEMM split over K (the gate_up
// projection at 2-128 rows as one strided-batched cuBLAS call, CudaBackend.linear_partials): gate_up = T(p[0] + ...
// + p[S-1]), added in slice order and rounded to T as cuBLAS writes its output, then exactly silu_mul's SwiGLU.
// parts: float[S][T][2I], slab after slab. Launch: as silu_mul, each thread 4 outputs (I % 4 == 0, 1 <= S <=
// SILU_PART_MAX; the wrapper checks).
#define SILU_PART_MAX 8
template <typename T>
struct alignas(4 * sizeof(T)) Four {
    T e[4];
};

template <typename T>
__global__ void silu_mul_partials(const float* __restrict__ parts, int S, T* __restrict__ out, int n_tokens, int I) {
    pdl_enter();
    const size_t slab = (size_t)n_tokens * 2 * I, stride = (size_t)gridDim.x * blockDim.x;
    const int per_row = I / 4;
    const size_t n = (size_t)n_tokens * per_row;
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < n; c += stride) {
        const size_t t = c / per_row;
        const int i = (int)(c % per_row) * 4;
        const float* p = parts + t * 2 * I + i;
        // Every slice's loads first, then the adds in slice order (as add_rmsnorm_partials).
        float4 g[SILU_PART_MAX], u[SILU_PART_MAX];
#pragma unroll
        for (int s = 0; s < SILU_PART_MAX; s++)
            if (s < S) {
                g[s] = *reinterpret_cast<const float4*>(p + s * slab);
                u[s] = *reinterpret_cast<const float4*>(p + s * slab + I);
            }
        float4 gs = g[0], us = u[0];
#pragma unroll
        for (int s = 1; s < SILU_PART_MAX; s++)
            if (s < S) {
                gs.x += g[s].x; gs.y += g[s].y; gs.z += g[s].z; gs.w += g[s].w;
                us.x += u[s].x; us.y += u[s].y; us.z += u[s].z; us.w += u[s].w;
            }
        Four<T> o;
        o.e[0] = swiglu(from_f32<T>(gs.x), from_f32<T>(us.x));
        o.e[1] = swiglu(from_f32<T>(gs.y), from_f32<T>(us.y));
        o.e[2] = swiglu(from_f32<T>(gs.z), from_f32<T>(us.z));
        o.e[3] = swiglu(from_f32<T>(gs.w), from_f32<T>(us.w));
        *reinterpret_cast<Four<T>*>(out + t * I + i) = o;
    }
}

template __global__ void silu_mul<float>(const float*, float*, int, int);
template __global__ void silu_mul<__half>(const __half*, __half*, int, int);
template __global__ void silu_mul<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int, int);
template __global__ void silu_mul_partials<float>(const float*, int, float*, int, int);
template __global__ void silu_mul_partials<__half>(const float*, int, __half*, int, int);
template __global__ void silu_mul_partials<__nv_bfloat16>(const float*, int, __nv_bfloat16*, int, int);
