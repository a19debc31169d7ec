// gemv.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for a handful of rows m < M <= 4: the projections of a decode
// step at batch 1-4, where every weight byte is read once and used M times, so the op is a pure weight stream.
// (cuBLAS is tuned for larger M; at M = 1 its kernels leave bandwidth unused on these shapes: bench_kernels.py
// compares both, and EngineOptions.small_batch_gemv switches between them.)
//
// Layout (row-major, HF's [out, in] weights): x T[M, K]; w T[N, K]; y TO[M, N] (TO = T, or float for logits).
// Requires K % (16 / sizeof(T)) == 0 and 16-byte aligned rows (the wrapper checks).
// Launch: block 256 = 8 warps, grid ceil(N / (8 / wpr)). Each output row n gets wpr warps (1, 2, 4 or 8: the
// wrapper's gemv_warps_per_row); lane l of the row's warp p reads 16-byte chunks p * 32 + l, + 32 * wpr, ... of
// w[n] (coalesced: a warp reads 512 contiguous bytes per step) and the same chunks of the M x rows (tiny,
// L1/L2-resident), accumulates in fp32, then the warp sums its lanes with xor shuffles and, with wpr > 1, warp 0
// of the row adds the row's wpr partial sums in order (deterministic).
// Why several warps a row: a warp keeps only a few 16-byte loads a lane in flight, so a long row (the down
// projection's K = 4,864) on one warp leaves too few bytes in flight to cover DRAM latency: 896 rows are 896 warps,
// under 7 an SM.
#include "dtype.cuh"
#include "elementwise.cuh"
#include "pdl.cuh"
#include "gemv.cuh"

template <typename T, typename TO, int M>
__global__ void __launch_bounds__(256, 1)
gemv(const T* __restrict__ x, const T* __restrict__ w, TO* __restrict__ y, int N, int K, int wpr) {
    constexpr int VEC = 16 / sizeof(T);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const RowPart r(warp, lane, wpr);
    if (wpr == 1 && r.n >= N) return;  // whole warp, and no barrier below when wpr == 1
    // With wpr > 1 a warp past the last row still reads a real row (N - 1) and reaches row_sums' barrier.
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)min(r.n, N - 1) * K);
    uint4 pre[GEMV_PF];
    w_prefetch(wr, K / VEC, r.c0, r.cs, pre);
    pdl_enter();  // x comes from the previous kernel
    float acc[M];
    warp_dots<T, M>(wr, K / VEC, r.c0, r.cs, pre,
                    [&](int m, int c) { return __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c); }, acc);
    if (!row_sums<M>(r, warp, lane, wpr, acc) || r.n >= N) return;
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == 0) y[(size_t)m * N + r.n] = from_f32<TO>(acc[m]);
}

// ---- gemv_swiglu: the gate_up projection with SwiGLU as its epilogue -------------------------------------------
// w is gate_up's [2I, K] (gate rows 0..I-1, then the up rows); out[m, j] = swiglu(T(x_m . w[j]), T(x_m . w[I + j])),
// the value gemv then silu_mul store (the same sums in the same order, the same roundings), without writing and
// re-reading the [M, 2I] gate_up row or launching silu_mul: one kernel a layer fewer in a batch-1 decode step.
// Units j < I take gemv's rows' place (wpr warps a unit); a warp streams both of its unit's rows, one x chunk for
// both. At batch 1 the grid (I / 8 blocks: 608 for Qwen2.5-0.5B) must fit the GPU in one wave: at 62 registers a
// thread only 4 blocks of 256 fit an SM (528 on an H200), and the last 80 blocks' weight loads started only when
// the first blocks finished. The launch bound (5 blocks an SM, <= 48 registers) keeps it to one wave; bf16 only,
// the dtype decode runs in (fp16 and fp32 would spill a register at 48).
template <typename T, int M> struct SwigluMinBlocks { static constexpr int v = 1; };
template <> struct SwigluMinBlocks<__nv_bfloat16, 1> { static constexpr int v = 5; };

template <typename T, int M>
__global__ void __launch_bounds__(256, SwigluMinBlocks<T, M>::v)
gemv_swiglu(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, int I, int K, int wpr) {
    constexpr int VEC = 16 / sizeof(T);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, KC = K / VEC;
    const RowPart r(warp, lane, wpr);
    if (wpr == 1 && r.n >= I) return;  // whole warp, and no barrier below when wpr == 1
    const int j = min(r.n, I - 1);
    const uint4* wg = reinterpret_cast<const uint4*>(w + (size_t)j * K);
    const uint4* wu = reinterpret_cast<const uint4*>(w + (size_t)(I + j) * K);
    uint4 pg[GEMV_PF], pu[GEMV_PF];
    w_prefetch(wg, KC, r.c0, r.cs, pg);
    w_prefetch(wu, KC, r.c0, r.cs, pu);
    pdl_enter();  // x comes from the previous kernel
    // acc[m] = gate row . x_m, acc[M + m] = up row . x_m: each summed in warp_dots' order (chunk by chunk, element
    // by element, then the same shuffles), so the bits are gemv's.
    float acc[2 * M];
#pragma unroll
    for (int m = 0; m < 2 * M; m++) acc[m] = 0.0f;
    auto dot2 = [&](uint4 g, uint4 u, int c) {
        Chunk<T> gc, uc;
        gc.u = g, uc.u = u;
#pragma unroll
        for (int m = 0; m < M; m++) {
            Chunk<T> xc;
            xc.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[m] += to_f32(gc.e[e]) * to_f32(xc.e[e]);
#pragma unroll
            for (int e = 0; e < VEC; e++) acc[M + m] += to_f32(uc.e[e]) * to_f32(xc.e[e]);
        }
    };
#pragma unroll
    for (int p = 0; p < GEMV_PF; p++)
        if (r.c0 + r.cs * p < KC) dot2(pg[p], pu[p], r.c0 + r.cs * p);
#pragma unroll 4
    for (int c = r.c0 + r.cs * GEMV_PF; c < KC; c += r.cs) dot2(__ldg(wg + c), __ldg(wu + c), c);
#pragma unroll
    for (int m = 0; m < 2 * M; m++)
        for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    if (!row_sums<2 * M>(r, warp, lane, wpr, acc) || r.n >= I) return;
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == 0) out[(size_t)m * I + r.n] = swiglu(from_f32<T>(acc[m]), from_f32<T>(acc[M + m]));
}

// ---- gemv_fused: the same weight stream with the work around it folded in -------------------------------------
// A decode step at batch 1 is launch-bound: each small kernel between two GEMVs costs a launch and a drain
// for a few KB of data. gemv_fused moves that work into the GEMV that consumes or produces it:
//   PRO = GF_NORM:   x = RMSNorm(h) * norm_w (h T[M, K], read-only here): the qkv and gate_up projections
//   PRO = GF_SWIGLU: x = silu(gate) * up (gate_up T[M, 2K]):              the down projection
//   PRO = GF_NONE:   x as given:                                          the o projection
//   ADD:  y[m, n] = T(y[m, n] + T(acc)) in place, i.e. y is the residual h: o and down add into it
// Every block computes the whole prologue into shared memory (K values a row; the inputs are a few KB in L2),
// then streams its 8 / wpr weight rows as gemv does. The roundings are those of the unfused kernels (elementwise.cuh,
// then a T result added in T), so only the order of the sum of squares differs.
// ADD is race-free: element (m, n) is read and written by lane 0 of row n's first warp only, and no prologue reads y.
// Each warp issues its first weight loads (w_prefetch) before the prologue, so the prologue runs while they fly.
constexpr int GF_NONE = 0, GF_NORM = 1, GF_SWIGLU = 2;

template <typename T, int M, int PRO, bool ADD>
__global__ void __launch_bounds__(256, 1)
gemv_fused(const T* __restrict__ x, const T* __restrict__ norm_w, float eps, const T* __restrict__ w, T* y,
           int N, int K, int wpr) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(16) unsigned char gf_smem[];
    T* xs = reinterpret_cast<T*>(gf_smem);  // [M][K]: the prologue's output (PRO != GF_NONE)
    __shared__ float s_ss[8][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, KC = K / VEC;
    const RowPart r(warp, lane, wpr);
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)min(r.n, N - 1) * K);
    uint4 pre[GEMV_PF];
    w_prefetch(wr, KC, r.c0, r.cs, pre);  // before the prologue and the wait: the weights do not depend on them
    pdl_enter();
    if (PRO == GF_SWIGLU) {
        for (int c = threadIdx.x; c < M * KC; c += blockDim.x) {
            const int m = c / KC, k = (c % KC) * VEC;
            Chunk<T> g, u, o;
            g.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * 2 * K + k));
            u.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * 2 * K + K + k));
#pragma unroll
            for (int e = 0; e < VEC; e++) o.e[e] = swiglu(g.e[e], u.e[e]);
            *reinterpret_cast<uint4*>(xs + m * K + k) = o.u;
        }
        __syncthreads();
    } else if (PRO == GF_NORM) {
        // Pass 1: each row's sum of squares (per thread, per warp by shuffles, per block through s_ss).
        float ss[M];
#pragma unroll
        for (int m = 0; m < M; m++) ss[m] = 0.0f;
        for (int c = threadIdx.x; c < M * KC; c += blockDim.x) {
            const int m = c / KC;
            Chunk<T> h;
            h.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c % KC);
            float a = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) a += to_f32(h.e[e]) * to_f32(h.e[e]);
#pragma unroll
            for (int r = 0; r < M; r++) if (r == m) ss[r] += a;  // unrolled: ss stays in registers
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            for (int o = 16; o > 0; o >>= 1) ss[m] += __shfl_xor_sync(0xffffffffu, ss[m], o);
            if (lane == 0) s_ss[warp][m] = ss[m];
        }
        __syncthreads();
        // Pass 2: normalise, round to T, scale by the weight, round again (rmsnorm.cu's order).
        for (int c = threadIdx.x; c < M * KC; c += blockDim.x) {
            const int m = c / KC, k = (c % KC) * VEC;
            float tot = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) tot += s_ss[i][m];
            const float inv = rsqrtf(tot / (float)K + eps);
            Chunk<T> h, nw, o;
            h.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K + k));
            nw.u = __ldg(reinterpret_cast<const uint4*>(norm_w + k));
#pragma unroll
            for (int e = 0; e < VEC; e++) o.e[e] = rms_scale(to_f32(h.e[e]), inv, nw.e[e]);
            *reinterpret_cast<uint4*>(xs + m * K + k) = o.u;
        }
        __syncthreads();
    }
    if (wpr == 1 && r.n >= N) return;  // whole warp, after the block's prologue barriers (row_sums has none then)
    float acc[M];
    warp_dots<T, M>(wr, KC, r.c0, r.cs, pre, [&](int m, int c) {
        return PRO == GF_NONE ? __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c)
                              : *reinterpret_cast<const uint4*>(xs + m * K + c * VEC);
    }, acc);
    if (!row_sums<M>(r, warp, lane, wpr, acc) || r.n >= N) return;
#pragma unroll
    for (int m = 0; m < M; m++) {
        if (lane == 0) {
            T* yp = y + (size_t)m * N + r.n;
            *yp = ADD ? from_f32<T>(to_f32(*yp) + to_f32(from_f32<T>(acc[m]))) : from_f32<T>(acc[m]);
        }
    }
}

#define GEMV_M(T, TO)                                                                                      \
    template __global__ void gemv<T, TO, 1>(const T*, const T*, TO*, int, int, int);                       \
    template __global__ void gemv<T, TO, 2>(const T*, const T*, TO*, int, int, int);                       \
    template __global__ void gemv<T, TO, 3>(const T*, const T*, TO*, int, int, int);                       \
    template __global__ void gemv<T, TO, 4>(const T*, const T*, TO*, int, int, int);
GEMV_M(float, float) GEMV_M(__half, __half) GEMV_M(__half, float)
GEMV_M(__nv_bfloat16, __nv_bfloat16) GEMV_M(__nv_bfloat16, float)
#define GEMV_SWIGLU(T)                                                                                     \
    template __global__ void gemv_swiglu<T, 1>(const T*, const T*, T*, int, int, int);                        \
    template __global__ void gemv_swiglu<T, 2>(const T*, const T*, T*, int, int, int);                        \
    template __global__ void gemv_swiglu<T, 3>(const T*, const T*, T*, int, int, int);                        \
    template __global__ void gemv_swiglu<T, 4>(const T*, const T*, T*, int, int, int);
GEMV_SWIGLU(float) GEMV_SWIGLU(__half) GEMV_SWIGLU(__nv_bfloat16)
#define GF_ARGS(T) const T*, const T*, float, const T*, T*, int, int, int
#define GEMV_FUSED_M(T, M)                                                                                 \
    template __global__ void gemv_fused<T, M, GF_NORM, false>(GF_ARGS(T));                                   \
    template __global__ void gemv_fused<T, M, GF_NONE, true>(GF_ARGS(T));                                    \
    template __global__ void gemv_fused<T, M, GF_SWIGLU, true>(GF_ARGS(T));
#define GEMV_FUSED(T) GEMV_FUSED_M(T, 1) GEMV_FUSED_M(T, 2) GEMV_FUSED_M(T, 3) GEMV_FUSED_M(T, 4)
GEMV_FUSED(float) GEMV_FUSED(__half) GEMV_FUSED(__nv_bfloat16)
