// embedding.cu -- token embedding lookup: out[t, :] = table[ids[t], :]
//
// Layout (row-major): ids int32[T]; table T[V, H]; out T[T, H]; T = float | __half | __nv_bfloat16.
// Launch: grid (T), block 128: one block copies one row. A row is only H * sizeof(T) bytes (1792 for
// Qwen2.5-0.5B in bf16), so the copy moves 16-byte chunks (one uint4 per thread) whenever the row length
// and both pointers allow it; otherwise it falls back to element copies. The kernel does no arithmetic,
// which is why it is dtype-agnostic apart from the element size.
#include "dtype.cuh"
#include "pdl.cuh"

template <typename T>
__global__ void embedding(const int* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                          int V, int H) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    const int t = blockIdx.x;
    const int id = ids[t];
    T* dst = out + (size_t)t * H;
    // An out-of-range id is a bug upstream; writing zeros keeps it from reading outside the table
    // (which could fault or leak another tensor's bytes) without a host round trip to report it.
    const bool valid = id >= 0 && id < V;
    const T* src = table + (size_t)(valid ? id : 0) * H;

    const size_t row_bytes = (size_t)H * sizeof(T);
    const bool vec = row_bytes % 16 == 0 && reinterpret_cast<size_t>(src) % 16 == 0 &&
                     reinterpret_cast<size_t>(dst) % 16 == 0;
    if (vec) {
        const int n = (int)(row_bytes / 16);
        const uint4* s4 = reinterpret_cast<const uint4*>(src);
        uint4* d4 = reinterpret_cast<uint4*>(dst);
        for (int i = threadIdx.x; i < n; i += blockDim.x) d4[i] = valid ? s4[i] : make_uint4(0, 0, 0, 0);
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = valid ? src[i] : T(0.0f);
    }
}

// Explicit instantiations: the same names the wrapper requests, so the compile check builds them.
template __global__ void embedding<float>(const int*, const float*, float*, int, int);
template __global__ void embedding<__half>(const int*, const __half*, __half*, int, int);
template __global__ void embedding<__nv_bfloat16>(const int*, const __nv_bfloat16*, __nv_bfloat16*, int, int);
