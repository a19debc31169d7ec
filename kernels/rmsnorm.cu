// rmsnorm.cu -- fused residual add + RMSNorm, one row per block:
//     if x:  residual = T(float(residual) + float(x))          (written back: the next layer continues from it)
//     out = T( float(w) * float(T(r * rsqrt(mean(r^2) + eps))) )  with r = float(residual)
// The double rounding matches Hugging Face for 16-bit T: the residual add happens in T, and RMSNorm rounds the
// normalised value to T before multiplying by the weight. For T = float both roundings are no-ops.
//
// Layout (row-major): x, residual, out T[rows, H]; weight T[H]. x may be nullptr (no residual add).
// Launch: grid (rows), block = a multiple of 32 (the wrapper sizes it so one pass covers the row in 16-byte
// chunks: 128 threads for H = 896 bf16). Math in fp32. Two passes over the row: the first adds and sums
// squares, the second re-reads the residual it just wrote (same thread, same addresses, so no barrier is
// needed), except the thread's first chunk, kept in registers (the only one at the wrapper's block size).
#include "dtype.cuh"
#include "elementwise.cuh"
#include "pdl.cuh"

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; }

// Sum over the block; every thread gets the result. Warp shuffles, then one value per warp through smem.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = (blockDim.x + 31) >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One element of pass 1: residual (+ x) rounded to T; returns the rounded value as float.
template <typename T>
__device__ __forceinline__ float add_one(T& r, const T* xe, int j) {
    float v = to_f32(r);
    if (xe) { v += to_f32(xe[j]); r = from_f32<T>(v); v = to_f32(r); }
    return v;
}

// Pass 2 over a row in 16-byte chunks, from this thread's first chunk i0: normalise, round to T, scale by the
// weight, round again. r0, w0: the residual and weight chunks at i0, already in registers (the residual chunk as
// pass 1 wrote it; rr is re-read where this thread wrote it, so no barrier is needed).
template <typename T>
__device__ __forceinline__ void rms_scale_row(const T* rr, const T* __restrict__ weight, T* orow, int H, int i0,
                                              const Chunk<T>& r0, const Chunk<T>& w0, float inv) {
    constexpr int VEC = 16 / sizeof(T);
    for (int i = i0; i < H; i += blockDim.x * VEC) {
        Chunk<T> rv = r0, wv = w0, ov;
        if (i != i0) {
            rv.u = *reinterpret_cast<const uint4*>(rr + i);
            wv.u = *reinterpret_cast<const uint4*>(weight + i);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++) ov.e[j] = rms_scale(to_f32(rv.e[j]), inv, wv.e[j]);
        *reinterpret_cast<uint4*>(orow + i) = ov.u;
    }
}

template <typename T>
__global__ void add_rmsnorm(const T* x, T* residual, const T* __restrict__ weight, T* out, float eps, int H) {
    // No __restrict__ on x/residual/out: callers may alias out with x or residual (each element is read before
    // the same thread writes it, so aliasing is safe as long as the compiler is not told otherwise).
    constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte chunk
    const size_t row = (size_t)blockIdx.x * H;
    const T* xr = x ? x + row : nullptr;
    T* rr = residual + row;
    T* orow = out + row;
    const bool vec = H % VEC == 0 && aligned16(rr) && aligned16(orow) && aligned16(weight) && (!xr || aligned16(xr));
    // The thread's first chunk (with the wrapper's block size, its only one): the weight is a constant, so it is
    // loaded before the wait (pdl.cuh), and the residual chunk stays in registers for pass 2. Same values, same bits.
    const int i0 = threadIdx.x * VEC;
    Chunk<T> w0, r0;
    if (vec && i0 < H) w0.u = __ldg(reinterpret_cast<const uint4*>(weight + i0));
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL

    // Pass 1: residual add, write back, sum of squares (of the rounded values, like HF's fp32 upcast of T).
    float ss = 0.0f;
    if (vec) {
        for (int i = i0; i < H; i += blockDim.x * VEC) {
            Chunk<T> rv, xv;
            rv.u = *reinterpret_cast<const uint4*>(rr + i);
            if (xr) xv.u = *reinterpret_cast<const uint4*>(xr + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) { float v = add_one(rv.e[j], xr ? xv.e : nullptr, j); ss += v * v; }
            if (xr) *reinterpret_cast<uint4*>(rr + i) = rv.u;
            if (i == i0) r0 = rv;
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) {
            T r = rr[i];
            float v = add_one(r, xr ? xr + i : nullptr, 0);
            if (xr) rr[i] = r;
            ss += v * v;
        }
    }
    const float inv = rsqrtf(block_sum(ss) / (float)H + eps);

    // Pass 2: normalise, round to T, scale by the weight, round again.
    if (vec) {
        rms_scale_row(rr, weight, orow, H, i0, r0, w0, inv);
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            orow[i] = rms_scale(to_f32(rr[i]), inv, weight[i]);
    }
}

// add_rmsnorm_partials: the same, with x given as S fp32 partial products of a GEMM split over K (the down
// projection at 2-128 rows as one strided-batched cuBLAS call, CudaBackend.linear_partials): x = T(p[0] + ... +
// p[S-1]), added in slice order, then exactly add_rmsnorm's add and norm. That leaves out cuBLAS's own split-K
// reduce kernel, one launch a layer. parts: float[S][rows][H], slab after slab. Launch: as add_rmsnorm, H a
// multiple of the 16-byte chunk, 1 <= S <= PART_MAX (the wrapper checks).
#define PART_MAX 8
template <typename T>
__global__ void add_rmsnorm_partials(const float* parts, int S, T* residual, const T* __restrict__ weight, T* out,
                                     float eps, int H) {
    constexpr int VEC = 16 / sizeof(T);
    const size_t row = (size_t)blockIdx.x * H, slab = (size_t)gridDim.x * H;
    T* rr = residual + row;
    T* orow = out + row;
    const int i0 = threadIdx.x * VEC;
    Chunk<T> w0, r0;
    if (i0 < H) w0.u = __ldg(reinterpret_cast<const uint4*>(weight + i0));
    pdl_enter();
    float ss = 0.0f;
    for (int i = i0; i < H; i += blockDim.x * VEC) {
        // Every slice's loads first, then the adds in slice order: one L2 round trip for up to PART_MAX slices.
        float4 v[PART_MAX][VEC / 4];
#pragma unroll
        for (int s = 0; s < PART_MAX; s++)
            if (s < S)
#pragma unroll
                for (int q = 0; q < VEC / 4; q++) v[s][q] = reinterpret_cast<const float4*>(parts + s * slab + row + i)[q];
        float x[VEC];
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            x[4 * q] = v[0][q].x; x[4 * q + 1] = v[0][q].y; x[4 * q + 2] = v[0][q].z; x[4 * q + 3] = v[0][q].w;
        }
#pragma unroll
        for (int s = 1; s < PART_MAX; s++)
            if (s < S)
#pragma unroll
                for (int q = 0; q < VEC / 4; q++) {
                    x[4 * q] += v[s][q].x; x[4 * q + 1] += v[s][q].y; x[4 * q + 2] += v[s][q].z;
                    x[4 * q + 3] += v[s][q].w;
                }
        Chunk<T> rv;
        rv.u = *reinterpret_cast<const uint4*>(rr + i);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const T xt = from_f32<T>(x[j]);  // the GEMM's output, rounded to T as cuBLAS writes it
            float v = add_one(rv.e[j], &xt, 0);
            ss += v * v;
        }
        *reinterpret_cast<uint4*>(rr + i) = rv.u;
        if (i == i0) r0 = rv;
    }
    rms_scale_row(rr, weight, orow, H, i0, r0, w0, rsqrtf(block_sum(ss) / (float)H + eps));
}

template __global__ void add_rmsnorm<float>(const float*, float*, const float*, float*, float, int);
template __global__ void add_rmsnorm<__half>(const __half*, __half*, const __half*, __half*, float, int);
template __global__ void add_rmsnorm<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                                    __nv_bfloat16*, float, int);
template __global__ void add_rmsnorm_partials<float>(const float*, int, float*, const float*, float*, float, int);
template __global__ void add_rmsnorm_partials<__half>(const float*, int, __half*, const __half*, __half*, float, int);
template __global__ void add_rmsnorm_partials<__nv_bfloat16>(const float*, int, __nv_bfloat16*, const __nv_bfloat16*,
                                                             __nv_bfloat16*, float, int);
