// gemv.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for a handful of rows m < M <= 4: the projections of a decode
// step at batch 1-4, where every weight byte is read once and used M times, so the op is a pure weight stream.
// (cuBLAS is tuned for larger M; at M = 1 its kernels leave bandwidth unused on these shapes: bench_kernels.py
// compares both, and EngineOptions.small_batch_gemv switches between them.)
//
// Layout (row-major, HF's [out, in] weights): x T[M, K]; w T[N, K]; y TO[M, N] (TO = T, or float for logits).
// Requires K % (16 / sizeof(T)) == 0 and 16-byte aligned rows (the wrapper checks).
// Launch: block 256 = 8 warps, one output row n per warp, grid ceil(N / 8). Lane l reads 16-byte chunks
// l, l + 32, ... of w[n] (coalesced: a warp reads 512 contiguous bytes per step) and the same chunks of the M
// x rows (tiny, L1/L2-resident), accumulates in fp32, then the warp sums its lanes with xor shuffles.
#include "dtype.cuh"

template <typename T, typename TO, int M>
__global__ void __launch_bounds__(256, 1)
gemv(const T* __restrict__ x, const T* __restrict__ w, TO* __restrict__ y, int N, int K) {
    constexpr int VEC = 16 / sizeof(T);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + warp;
    if (n >= N) return;  // whole warp: no barrier below, only shuffles
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)n * K);
    const int KC = K / VEC;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    // Unrolled so each lane has several independent 16-byte weight loads in flight (latency hiding).
#pragma unroll 4
    for (int c = lane; c < KC; c += 32) {
        Chunk<T> wc;
        wc.u = __ldg(wr + c);
#pragma unroll
        for (int m = 0; m < M; m++) {
            Chunk<T> xc;
            xc.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[m] += to_f32(wc.e[e]) * to_f32(xc.e[e]);
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = acc[m];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[(size_t)m * N + n] = from_f32<TO>(v);
    }
}

#define GEMV_M(T, TO)                                                                                      \
    template __global__ void gemv<T, TO, 1>(const T*, const T*, TO*, int, int);                            \
    template __global__ void gemv<T, TO, 2>(const T*, const T*, TO*, int, int);                            \
    template __global__ void gemv<T, TO, 3>(const T*, const T*, TO*, int, int);                            \
    template __global__ void gemv<T, TO, 4>(const T*, const T*, TO*, int, int);
GEMV_M(float, float) GEMV_M(__half, __half) GEMV_M(__half, float)
GEMV_M(__nv_bfloat16, __nv_bfloat16) GEMV_M(__nv_bfloat16, float)
