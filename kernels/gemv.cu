// gemv.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for a handful of rows m < M <= 4: the projections of a decode
// step at batch 1-4, where every weight byte is read once and used M times, so the op is a pure weight stream.
// (cuBLAS is tuned for larger M; at M = 1 its kernels leave bandwidth unused on these shapes: bench_kernels.py
// compares both, and the step plan, toolkit/model/plan.py, picks this kernel for a 1-row step.)
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
#include "rope.cuh"

// Weights are constants, so a kernel launched with PDL (pdl.cuh) loads the first GEMV_PF 16-byte chunks of each
// lane's weight row before it waits for the previous kernel: with K = 896 in bf16 that is the whole row (112
// chunks, 3.5 a lane), so the weight stream overlaps the previous kernel's tail. Launched normally it is the same
// loads, issued first. (8 measured slower: 1.373 against 1.312 ms at depth 4096, bench_pdl_prefetch8.log.)
constexpr int GEMV_PF = 4;

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
// (the first GEMV_PF of them already in pre); x_chunk(m, c) gives chunk c of x row m. Returns, in every lane, the
// warp's sums (fp32, reduced over the warp by xor shuffles).
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

// ---- gemv_rope: the qkv projection with rope_qkv's work as its epilogue (the plan's gemv_rope, batch 1) ---------
// RoPE pairs dims i and i + D/2 of a head, so a block's 8 / wpr rows are 4 / wpr pairs (wpr <= 4): local row r is
// member r & 1 of the block's pair r >> 1, weight row h D + i or h D + D/2 + i for pair P = h D/2 + i. Each row's
// sums are gemv's (warp_dots and row_sums, the same order), then the epilogue is rope.cu's value for value, as
// gemm_skinny_rope's: T(y), + bias rounded to T, the rotation at positions[m] (rope_pair), q to q_out, k and v to
// the caches at slot_mapping[m], with rope_qkv's skips (a position outside the table: no write; a padding slot: q
// only). So qkv is never written and rope_qkv never launched: one kernel a layer fewer in a batch-1 step. Not for
// Qwen3's q/k norms, which need the whole head. The positions, slots, cos/sin and bias are staged before the step,
// so, like the weights, they are read before the PDL wait.
// x T[M, K]; w T[(Hq + 2 Hkv) D, K]; bias T[that] or null; cos, sin float[n_pos, D/2]; positions, slot_mapping
// int[M]; q_out T[M, Hq, D]; k_cache, v_cache T[num_slots, Hkv, D]. Grid ceil(pairs / (4 / wpr)), block 256.
template <typename T, int M>
__global__ void __launch_bounds__(256, 1)
gemv_rope(const T* __restrict__ x, const T* __restrict__ w, int K, int wpr, const T* __restrict__ bias,
          const float* __restrict__ cos_t, const float* __restrict__ sin_t, const int* __restrict__ positions,
          const int* __restrict__ slot_mapping, int Hq, int Hkv, int D, int n_pos, int num_slots,
          T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache) {
    constexpr int VEC = 16 / sizeof(T);
    __shared__ float s_sum[8][M];  // each local row's sums
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, KC = K / VEC, half = D / 2;
    const int ppb = 4 / wpr, pairs = (Hq + 2 * Hkv) * half, lr = warp / wpr, part = warp % wpr;
    // A pair past the last reads a real one (pairs - 1) and reaches the barriers; it writes nothing.
    const int pc = min(blockIdx.x * ppb + (lr >> 1), pairs - 1);
    const uint4* wr = reinterpret_cast<const uint4*>(w + ((size_t)(pc / half) * D + pc % half + (lr & 1) * half) * K);
    const int c0 = part * 32 + lane, cs = 32 * wpr;
    uint4 pre[GEMV_PF];
    w_prefetch(wr, KC, c0, cs, pre);
    // The epilogue's thread (pair t / M of the block, row t % M) loads its step constants before the wait too.
    const int t = threadIdx.x, pair = blockIdx.x * ppb + t / M, m = t % M;
    const bool mine = t < ppb * M && pair < pairs;
    int pos = -1, slot = -1;
    float c = 0.0f, sn = 0.0f, ba = 0.0f, bb = 0.0f;
    if (mine) {
        const int p = positions[m], i = pair % half, col = pair / half * D + i;
        if ((unsigned)p < (unsigned)n_pos) {
            pos = p, slot = slot_mapping[m];
            c = cos_t[(size_t)p * half + i], sn = sin_t[(size_t)p * half + i];
            if (bias) ba = to_f32(bias[col]), bb = to_f32(bias[col + half]);
        }
    }
    pdl_enter();  // x comes from the previous kernel
    float acc[M];
    warp_dots<T, M>(wr, KC, c0, cs, pre,
                    [&](int mm, int cc) { return __ldg(reinterpret_cast<const uint4*>(x + (size_t)mm * K) + cc); },
                    acc);
    const RowPart r(warp, lane, wpr);  // (only its part: row_sums reads r.part)
    if (row_sums<M>(r, warp, lane, wpr, acc) && lane == 0) {
#pragma unroll
        for (int mm = 0; mm < M; mm++) s_sum[lr][mm] = acc[mm];
    }
    __syncthreads();
    if (!mine || pos < 0) return;  // past the pairs or the batch; a position outside the table writes nothing
    const int head = pair / half, i = pair % half;
    float a = rnd<T>(s_sum[2 * (t / M)][m]), b = rnd<T>(s_sum[2 * (t / M) + 1][m]);  // the Linear output, in T
    if (bias) { a = rnd<T>(a + ba); b = rnd<T>(b + bb); }  // then its bias, rounded to T (rope.cu)
    T* dst;
    if (head < Hq) {
        dst = q_out + ((size_t)m * Hq + head) * D;
    } else {
        if ((unsigned)slot >= (unsigned)num_slots) return;  // a padding row (or a bad slot): q only
        const int kv = head - Hq;
        dst = (kv < Hkv ? k_cache : v_cache) + ((size_t)slot * Hkv + kv % Hkv) * D;
    }
    if (head < Hq + Hkv) rope_pair(a, b, c, sn);  // v heads are not rotated
    dst[i] = from_f32<T>(a);
    dst[half + i] = from_f32<T>(b);
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
#define GEMV_ROPE(T)                                                                                       \
    template __global__ void gemv_rope<T, 1>(const T*, const T*, int, int, const T*, const float*, const float*, \
                                             const int*, const int*, int, int, int, int, int, T*, T*, T*);   \
    template __global__ void gemv_rope<T, 2>(const T*, const T*, int, int, const T*, const float*, const float*, \
                                             const int*, const int*, int, int, int, int, int, T*, T*, T*);   \
    template __global__ void gemv_rope<T, 3>(const T*, const T*, int, int, const T*, const float*, const float*, \
                                             const int*, const int*, int, int, int, int, int, T*, T*, T*);   \
    template __global__ void gemv_rope<T, 4>(const T*, const T*, int, int, const T*, const float*, const float*, \
                                             const int*, const int*, int, int, int, int, int, T*, T*, T*);
GEMV_ROPE(__half) GEMV_ROPE(__nv_bfloat16)
