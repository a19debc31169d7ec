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

template __global__ void silu_mul<float>(const float*, float*, int, int);
template __global__ void silu_mul<__half>(const __half*, __half*, int, int);
template __global__ void silu_mul<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int, int);
