// gemv.cuh -- the warp-level weight stream shared by gemv.cu's kernels and decode_mlp.cu: a warp's dot products
// of one weight row (or one part of it) with the M rows of x, fp32 accumulation, lane-strided 16-byte chunks.
// (After dtype.cuh and elementwise.cuh: kernel_source pastes headers in one level deep, so this one includes
// nothing itself.)
#ifndef TOOLKIT_GEMV_CUH
#define TOOLKIT_GEMV_CUH
// Weights are constants, so a kernel launched with PDL (pdl.cuh) loads the first GEMV_PF 16-byte chunks of each
// lane's weight row before it waits for the previous kernel: with K = 896 in bf16 that is the whole row (112
// chunks, 3.5 a lane), so the weight stream overlaps the previous kernel's tail. Launched normally it is the same
// loads, issued first.
#ifndef GEMV_PF
// -DGEMV_PF=8 (TOOLKIT_NVRTC_DEFINES) measured slower: 1.373 vs 1.312 ms at depth 4096 (bench_pdl_prefetch8.log).
#define GEMV_PF 4
#endif

// A lane's chunks are c0, c0 + cs, c0 + 2 cs, ... (c0 = part * 32 + lane, cs = 32 * wpr).
__device__ __forceinline__ void w_prefetch(const uint4* __restrict__ wr, int KC, int c0, int cs,
                                           uint4 (&pre)[GEMV_PF]) {
#pragma unroll
    for (int p = 0; p < GEMV_PF; p++) {
        const int c = c0 + cs * p;
        pre[p] = c < KC ? __ldg(wr + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// One warp's dot products of weight row wr with the M rows of x: the lane takes 16-byte chunks c0, c0 + cs, ...
// (the first GEMV_PF of them already in pre); x_chunk(m, c) gives chunk c of x row m (global memory for gemv,
// shared memory for gemv_fused's prologue). Returns, in every lane, the warp's sums (fp32, reduced over the warp
// by xor shuffles).
template <typename T, int M, typename XChunk>
__device__ __forceinline__ void warp_dots(const uint4* __restrict__ wr, int KC, int c0, int cs,
                                          const uint4 (&pre)[GEMV_PF], XChunk x_chunk, float (&acc)[M]) {
    constexpr int VEC = 16 / sizeof(T);
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    auto dot_chunk = [&](uint4 w, int c) {
        Chunk<T> wc;
        wc.u = w;
#pragma unroll
        for (int m = 0; m < M; m++) {
            Chunk<T> xc;
            xc.u = x_chunk(m, c);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[m] += to_f32(wc.e[e]) * to_f32(xc.e[e]);
        }
    };
#pragma unroll
    for (int p = 0; p < GEMV_PF; p++)
        if (c0 + cs * p < KC) dot_chunk(pre[p], c0 + cs * p);
    // Unrolled so each lane has several independent 16-byte weight loads in flight (latency hiding).
#pragma unroll 4
    for (int c = c0 + cs * GEMV_PF; c < KC; c += cs) dot_chunk(__ldg(wr + c), c);
#pragma unroll
    for (int m = 0; m < M; m++)
        for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
}

// Which row and which part of it this warp takes (wpr warps a row, 8 / wpr rows a block).
struct RowPart {
    int n, part, c0, cs;
    __device__ RowPart(int warp, int lane, int wpr)
        : n(blockIdx.x * (8 / wpr) + warp / wpr), part(warp % wpr), c0(part * 32 + lane), cs(32 * wpr) {}
};

// With wpr > 1, the row's first warp adds the row's partial sums, in part order, into acc (every warp of the
// block must call it: it has a barrier). Returns whether this warp holds the row's full sums.
template <int M>
__device__ __forceinline__ bool row_sums(const RowPart& r, int warp, int lane, int wpr, float (&acc)[M]) {
    if (wpr == 1) return true;
    __shared__ float s_part[8][M];
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == 0) s_part[warp][m] = acc[m];
    __syncthreads();
    if (r.part) return false;
#pragma unroll
    for (int m = 0; m < M; m++) {
        acc[m] = s_part[warp][m];
        for (int p = 1; p < wpr; p++) acc[m] += s_part[warp + p][m];
    }
    return true;
}
#endif
