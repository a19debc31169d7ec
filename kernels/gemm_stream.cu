// gemm_stream.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for 2-32 rows m, with the weights streamed into shared
// memory by the TMA unit (cp.async.bulk, Hopper+): the big projections of a decode step at batch 2-32, gate_up
// (with SwiGLU as its epilogue) and down (EngineOptions.stream_gemm; README, "Streaming the MLP weights through
// shared memory"). At 32 rows a weight byte is used 32 times, far too few to be compute-bound: the time is the
// time to read the weights, and what decides it is how many weight bytes are in flight and whether every SM
// streams the same number of them. gemm_skinny keeps its weights in flight in registers (about 4 KB a warp,
// 64 KB an SM) and hands out whole tiles (1.15 waves of them for gate_up at Qwen2.5-0.5B), and on the two MLP
// projections it measured slower than cuBLAS. So does this kernel, in the decode step (0.894 against 0.808 ms at
// batch 32, Qwen2.5-0.5B), so stream_gemm is off by default; it is kept as the measured alternative. Here:
//   - the grid is at most one block an SM, and block b of a slice owns tiles [b T / B, (b + 1) T / B): every SM
//     streams the same weight bytes, to within a tile;
//   - a producer warp copies each tile (16 weight rows of one slice of K) into a stage of shared memory, a bulk
//     copy a row, completing on the tile's mbarrier. NS stages are in flight (the launcher fits NS to the
//     shared memory: 5 x 29 KB for gate_up at Qwen2.5-0.5B, every tile of the block), and the first NS are
//     issued before the PDL wait, while the previous kernel still runs: the weights are constants;
//   - after the wait the 8 consumer warps copy this slice of x (at most 32 rows) into shared memory once, with
//     16-byte loads (as 4-byte fragment loads straight from L2 this took 9 of the kernel's 17 us at 32 rows);
//   - consumer warp w takes the block's tiles w, w + 8, ...: it waits for the tile's stage, runs its k-steps
//     (A and B by ldmatrix a k-step ahead, mma.m16n8k16, fp32 accumulators in two sets, even and odd k-steps,
//     to halve the dependent chain), frees the stage for the producer, and stores its 16 x 8 NT outputs from
//     registers: no block-wide barrier per tile. With S > 1 slices of K (the down projection: 56 tiles of 4,864
//     columns at Qwen2.5-0.5B, too few tiles for 132 SMs) it writes its slice's fp32 tile to ws and counts
//     itself in counters[tile]; the tile's last warp adds the S tiles in slice order. A fixed order: the same
//     bits on every launch, graph or eager.
// Shared-memory rows (stages and x) are LD elements, LD / 8 odd: the 8 rows of an ldmatrix matrix fall in 8
// different bank quads.
//
// SWIGLU (w = gate_up [2I, K], y [M, I]): tile t is gate rows 8t..8t+7 as the mma tile's rows 0-7 and up rows
// I + 8t.. as its rows 8-15, so a lane holds gate and up of the same (m, n) in accumulators r and r + 2, and
// writes swiglu(T(gate), T(up)): silu_mul's roundings.
//
// Layout: x T[M, K]; w T[N, K] (SWIGLU: [2N, K]); y T[M, N]; ws float[S, tiles, NT * 128] and counters[tiles]
// (zero, left zero) when S > 1. T is bf16 or fp16; N % 16 == 0 (SWIGLU: N % 8 == 0); K % (16 S) == 0. Grid:
// S * B blocks (B blocks a slice), block 288 threads (8 consumer warps, 1 producer); dynamic shared memory:
// NS stages of 16 LD elements, XR = 8 max(NT, 2) rows of x of LD elements, 2 ceil(T / B) mbarriers
// (cuda_gemm.py's stream_smem).
#include "dtype.cuh"
#include "elementwise.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "grid.cuh"

constexpr int STREAM_CW = 8;  // consumer warps; warp STREAM_CW is the producer

__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t@!p bra WAIT_%=;\n\t}"
                 ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

// Arm bar for 16 rows of `row_bytes` and copy them, row r from src(r) to dst + r * ld_bytes (one whole warp;
// lane r < 16 issues row r's copy).
template <typename Src>
__device__ __forceinline__ void copy_tile(unsigned char* dst, int ld_bytes, Src src, unsigned row_bytes,
                                          unsigned long long* bar, int lane) {
    if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                     "r"(16 * row_bytes) : "memory");
    __syncwarp();
    if (lane < 16)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(dst + lane * ld_bytes)), "l"(src(lane)), "r"(row_bytes), "r"(smem_addr(bar))
                     : "memory");
}

// Rows [0, XR) of src (row stride ld_src, `cols` columns) into shared rows of LD elements, zeros past row M, by
// the consumer warps: cp.async, so every 16-byte load is in flight at once (a loop of load-then-store kept one a
// thread in flight: staging 57 KB of x took 2-4 us of mlp_stream's 21, gemm_stream_dev.log), through L2 (the
// previous kernel, or this one's other blocks, wrote them). The caller waits for the consumers after it.
template <typename T>
__device__ __forceinline__ void stage_rows(T* xs, int LD, const T* src, size_t ld_src, int cols, int M, int XR) {
    const int cpr = cols / 8;
    for (int i = threadIdx.x; i < XR * cpr; i += 32 * STREAM_CW) {
        const int r = i / cpr, q = i - r * cpr;
        cp_async16(xs + (size_t)r * LD + 8 * q, src + (size_t)(r < M ? r : 0) * ld_src + 8 * q, r < M);
    }
    cp_async_commit();
    cp_async_wait<0>();
}

template <typename T, int NT, bool SWIGLU>
__global__ void __launch_bounds__(32 * (STREAM_CW + 1), 1)
gemm_stream(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, float* __restrict__ ws,
            unsigned* __restrict__ counters, int M, int N, int K, int S, int NS) {
    constexpr int XR = 8 * (NT > 2 ? NT : 2);  // x rows in shared memory (ldmatrix.x4 reads two n-tiles)
    extern __shared__ __align__(128) unsigned char st_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int tiles = SWIGLU ? N / 8 : N / 16, B = gridDim.x / S;
    const int slice = blockIdx.x / B, b = blockIdx.x % B;
    const int t0 = (int)((long long)b * tiles / B), nt = (int)((long long)(b + 1) * tiles / B) - t0;
    const int KSL = K / S, k0 = slice * KSL, LD = KSL + ((KSL / 8) % 2 ? 0 : 8), nks = KSL / 16;
    T* stage = reinterpret_cast<T*>(st_smem);
    T* xs = stage + (size_t)NS * 16 * LD;
    // An mbarrier a tile for its copy (full) and one for its release (done), each completing once: with one a
    // stage, a warp waiting for a stage's second phase passed at once while its first was still pending.
    const int most = (tiles + B - 1) / B;  // tiles of the busiest block
    unsigned long long* full = reinterpret_cast<unsigned long long*>(xs + (size_t)XR * LD);
    unsigned long long* done = full + most;

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2 * most; s++) mbar_init(full + s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == STREAM_CW) {  // the producer: tile j into stage j % NS once its previous tile there is done
        for (int j = 0; j < nt; j++) {
            if (j >= NS) mbar_wait(done + j - NS, 0u);
            const int t = t0 + j;
            copy_tile(reinterpret_cast<unsigned char*>(stage + (size_t)(j % NS) * 16 * LD), LD * (int)sizeof(T),
                      [&](int r) {
                          const int row = SWIGLU ? (r < 8 ? 8 * t + r : N + 8 * t + r - 8) : 16 * t + r;
                          return w + (size_t)row * K + k0;
                      }, (unsigned)(KSL * sizeof(T)), full + j, lane);
        }
        return;  // (the first NS copies went out before any consumer passed its PDL wait)
    }

    pdl_enter();  // x comes from the previous kernel
    stage_rows(xs, LD, x + k0, (size_t)K, KSL, M, XR);  // (rows past M are zeros: their outputs are never stored)
    asm volatile("bar.sync 1, %0;" ::"n"(32 * STREAM_CW) : "memory");  // the consumers only

    // ldmatrix.x4 addresses: A = the stage's rows 0-15, k +0 / +8; B = x rows of n-tiles 2p, 2p + 1, k +0 / +8.
    const int a_off = (lane & 15) * LD + (lane >> 4) * 8;
    const int b_off = (((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
    for (int j = warp; j < nt; j += STREAM_CW) {
        mbar_wait(full + j, 0u);
        const T* st = stage + (size_t)(j % NS) * 16 * LD + a_off;
        // Software-pipelined: k-step ks + 1's fragments load before k-step ks's mma (ldmatrix is volatile asm,
        // so the compiler keeps the order it is written in).
        constexpr int NP = (NT + 1) / 2;  // ldmatrix.x4 of x: two n-tiles each
        struct Frag { unsigned a[4], b[NP][4]; };
        auto load = [&](Frag& f, int ks) {
            ldmatrix_x4(f.a, st + ks * 16);
#pragma unroll
            for (int p = 0; p < NP; p++) ldmatrix_x4(f.b[p], xs + (size_t)16 * p * LD + b_off + ks * 16);
        };
        auto math = [&](const Frag& f, float (&ac)[NT][4]) {
#pragma unroll
            for (int n = 0; n < NT; n++)
                mma(ac[n], f.a, f.b[n / 2][2 * (n & 1)], f.b[n / 2][2 * (n & 1) + 1], static_cast<const T*>(nullptr));
        };
        float acc[2][NT][4] = {};
        Frag f0, f1;
        load(f0, 0);
        for (int ks = 0; ks < nks; ks += 2) {
            if (ks + 1 < nks) load(f1, ks + 1);
            math(f0, acc[0]);
            if (ks + 1 < nks) {
                if (ks + 2 < nks) load(f0, ks + 2);
                math(f1, acc[1]);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(done + j);  // its stage is free for the producer
        const int t = t0 + j;
        float v[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) v[n][r] = acc[0][n][r] + acc[1][n][r];
        if (S > 1) {  // this slice's tile to ws; the tile's last warp adds the slices in order
            float* mine = ws + ((size_t)slice * tiles + t) * NT * 128 + lane;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int r = 0; r < 4; r++) mine[(n * 4 + r) * 32] = v[n][r];
            __threadfence();
            __syncwarp();
            unsigned last = 0;
            if (lane == 0) last = atomicAdd(counters + t, 1u) == (unsigned)S - 1;
            if (!__shfl_sync(0xffffffffu, last, 0)) continue;
            __threadfence();
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int r = 0; r < 4; r++) v[n][r] = 0.0f;
            for (int q = 0; q < S; q++) {  // L2 reads (__ldcg): other blocks wrote these
                const float* part = ws + ((size_t)q * tiles + t) * NT * 128 + lane;
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int r = 0; r < 4; r++) v[n][r] += __ldcg(part + (n * 4 + r) * 32);
            }
            if (lane == 0) counters[t] = 0u;  // ready for the next launch (graph replays included)
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int m = 8 * n + 2 * c + (r & 1);
                if (m >= M) continue;
                if constexpr (SWIGLU) {
                    if (r < 2) y[(size_t)m * N + 8 * t + g] = swiglu(from_f32<T>(v[n][r]), from_f32<T>(v[n][r + 2]));
                } else {
                    y[(size_t)m * N + 16 * t + g + 8 * (r >> 1)] = from_f32<T>(v[n][r]);
                }
            }
    }
}

// ---- mlp_stream: the MLP block of a 2-32-row decode step, out = W_down SwiGLU(W_gate_up x), in one kernel ----
// (EngineOptions.stream_gemm, where mlp_plan fits; README, "The MLP block in one kernel at 2-32 rows".) At batch 32
// cuBLAS's gate_up, silu_mul and cuBLAS's down are three dependent kernels, each of which drains the GPU, and
// neither GEMM reaches the bandwidth its bytes need (17.4 and 8.7 MB at Qwen2.5-0.5B). Here:
//   - phase 1 is gemm_stream's SWIGLU tiles over all G blocks (block b owns [b T1 / G, (b + 1) T1 / G)); act is
//     written to global memory; a grid barrier (grid.cuh); phase 2 is the down tiles of S slices of K = I, block
//     b in slice b / B2 owning that slice's tiles [..] as gemm_stream's blocks do;
//   - the producer streams the block's phase-1 tiles and then its phase-2 tiles through one ring of NS stages,
//     never waiting for the barrier: the down weights land while gate_up finishes, so the whole MLP's weights are
//     one stream of copies (the first NS issued before the PDL wait);
//   - the 8 consumer warps split every tile's k-steps (a tile's math on all four SM sub-partitions at once, so
//     the tile that lands last is done a few hundred cycles after it lands; a warp a tile, as in gemm_stream,
//     left that tile to one sub-partition), write their fp32 partial tiles to shared memory and add them in warp
//     order: the same bits on every launch. Split-K across blocks as in gemm_stream: each slice's fp32 tile to
//     ws, the tile's last block adds them in slice order.
// Layout: x T[M, H]; wgu T[2I, H]; wd T[H, I]; act T[M, I] (scratch, written); y T[M, H]; ws float[S, H / 16,
// NT * 128], counters u32[H / 16] (zero, left zero); bar u32[2] (grid.cuh). H % 16 == 0, I % (16 S) == 0. Grid
// S * B2 blocks, at most one an SM (all resident: the grid barrier), 288 threads; dynamic shared memory: NS stages
// of 16 LDS elements, XR rows of x (then of act's slice) of LDS elements, STREAM_CW partial tiles of NT * 128
// floats, 2 (most1 + most2) mbarriers (cuda_gemm.py's mlp_smem).
constexpr int MLP_MOST2 = 32;
#ifndef MLP_PRE
#define MLP_PRE 1000
#endif  // down tiles a block at most (cuda_gemm.mlp_plan)

// Per-block %globaltimer stamps of mlp_stream's phases, compiled in only with -DMLP_PROF (TOOLKIT_NVRTC_DEFINES;
// benchmarks/bench_mlp_stream.py --prof reads them).
#ifdef MLP_PROF
__device__ unsigned long long mlp_prof[1024 * 8];
#define PROF(i)                                                                                         \
    if (threadIdx.x == 0) {                                                                             \
        unsigned long long t_;                                                                          \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                          \
        mlp_prof[blockIdx.x * 8 + (i)] = t_;                                                            \
    }
#else
#define PROF(i)
#endif

// Output u of a down tile t (lane-major: u = (n-tile * 4 + accumulator) * 32 + lane), rounded into y[m, n].
template <typename T>
__device__ __forceinline__ void store_down(T* y, float v, int u, int t, int M, int H) {
    const int n = u >> 7, r = (u >> 5) & 3, ln = u & 31, m = 8 * n + 2 * (ln & 3) + (r & 1);
    if (m < M) y[(size_t)m * H + 16 * t + (ln >> 2) + 8 * (r >> 1)] = from_f32<T>(v);
}

__device__ __forceinline__ int stream_ld(int ksl) { return ksl + ((ksl / 8) % 2 ? 0 : 8); }

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(32 * STREAM_CW) : "memory");
}

// This warp's share of a tile's nks k-steps (st: the stage's 16 rows, xs: the x rows, both of LD elements) into
// its fp32 partial tile red[warp][(n * 4 + r) * 32 + lane].
template <typename T, int NT>
__device__ __forceinline__ void ksplit_tile(const T* st, const T* xs, int LD, int nks, int warp, int lane,
                                            float* red) {
    constexpr int NP = (NT + 1) / 2;
    const T* a = st + (lane & 15) * LD + (lane >> 4) * 8;
    const T* b = xs + (((lane >> 4) << 3) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
    const int k0 = warp * nks / STREAM_CW, k1 = (warp + 1) * nks / STREAM_CW;
    struct Frag { unsigned a[4], b[NP][4]; };
    auto load = [&](Frag& f, int ks) {
        ldmatrix_x4(f.a, a + ks * 16);
#pragma unroll
        for (int p = 0; p < NP; p++) ldmatrix_x4(f.b[p], b + (size_t)16 * p * LD + ks * 16);
    };
    float acc[NT][4] = {};
    auto math = [&](const Frag& f) {
#pragma unroll
        for (int n = 0; n < NT; n++)
            mma(acc[n], f.a, f.b[n / 2][2 * (n & 1)], f.b[n / 2][2 * (n & 1) + 1], static_cast<const T*>(nullptr));
    };
    Frag f0, f1;
    if (k0 < k1) load(f0, k0);
    for (int ks = k0; ks < k1; ks += 2) {  // the next k-step's fragments load before this one's mma
        if (ks + 1 < k1) load(f1, ks + 1);
        math(f0);
        if (ks + 1 < k1) {
            if (ks + 2 < k1) load(f0, ks + 2);
            math(f1);
        }
    }
    float* mine = red + warp * NT * 128 + lane;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) mine[(n * 4 + r) * 32] = acc[n][r];
}

template <typename T, int NT>
__global__ void __launch_bounds__(32 * (STREAM_CW + 1), 1)
mlp_stream(const T* __restrict__ x, const T* __restrict__ wgu, const T* __restrict__ wd, T* __restrict__ act,
           T* __restrict__ y, float* __restrict__ ws, unsigned* __restrict__ counters, unsigned* __restrict__ bar,
           int M, int H, int I, int S, int NS) {
    constexpr int XR = 8 * (NT > 2 ? NT : 2), F = NT * 128, CT = 32 * STREAM_CW;
    extern __shared__ __align__(128) unsigned char st_smem[];
    __shared__ unsigned last[MLP_MOST2];  // phase 2: whether this block adds up tile t2 + q
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int G = gridDim.x, B2 = G / S, T1 = I / 8, T2 = H / 16, KSL = I / S;
    const int t1 = (int)((long long)blockIdx.x * T1 / G), n1 = (int)((long long)(blockIdx.x + 1) * T1 / G) - t1;
    const int slice = blockIdx.x / B2, b2 = blockIdx.x % B2, k0 = slice * KSL;
    const int t2 = (int)((long long)b2 * T2 / B2), n2 = (int)((long long)(b2 + 1) * T2 / B2) - t2;
    const int LD1 = stream_ld(H), LD2 = stream_ld(KSL), LDS = LD1 > LD2 ? LD1 : LD2;
    T* stage = reinterpret_cast<T*>(st_smem);
    T* xs = stage + (size_t)NS * 16 * LDS;
    float* red = reinterpret_cast<float*>(xs + (size_t)XR * LDS);
    const int most = (T1 + G - 1) / G + (T2 + B2 - 1) / B2;  // the busiest block's copies
    unsigned long long* full = reinterpret_cast<unsigned long long*>(red + STREAM_CW * F);
    unsigned long long* done = full + most;
    unsigned long long* x_ready = done + most;  // x staged: the producer issues copies past `pre` after it

    PROF(0);
    if (tid == 0) {
        for (int s = 0; s < 2 * most + 1; s++) mbar_init(full + s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == STREAM_CW) {  // the producer: copy j (gate_up tiles, then down tiles) into stage j % NS
        for (int j = 0; j < n1 + n2; j++) {
            if (j == MLP_PRE) mbar_wait(x_ready, 0u);
            if (j >= NS) mbar_wait(done + j - NS, 0u);
            unsigned char* dst = reinterpret_cast<unsigned char*>(stage + (size_t)(j % NS) * 16 * LDS);
            if (j < n1) {
                const int t = t1 + j;
                copy_tile(dst, LD1 * (int)sizeof(T), [&](int r) {
                    return wgu + (size_t)(r < 8 ? 8 * t + r : I + 8 * t + r - 8) * H; }, (unsigned)(H * sizeof(T)),
                    full + j, lane);
            } else {
                const int t = t2 + j - n1;
                copy_tile(dst, LD2 * (int)sizeof(T), [&](int r) { return wd + (size_t)(16 * t + r) * I + k0; },
                          (unsigned)(KSL * sizeof(T)), full + j, lane);
            }
        }
        return;
    }

    pdl_enter();  // x comes from the previous kernel
    PROF(1);
    stage_rows(xs, LD1, x, (size_t)H, H, M, XR);
    consumers_sync();
    if (tid == 0) mbar_arrive(x_ready);
    PROF(2);
    // Phase 1: act = SwiGLU(gate_up x), tile t = gate rows 8t.. and up rows I + 8t.. (gemm_stream's SWIGLU tile).
    for (int j = 0; j < n1; j++) {
        mbar_wait(full + j, 0u);
        ksplit_tile<T, NT>(stage + (size_t)(j % NS) * 16 * LDS, xs, LD1, H / 16, warp, lane, red);
        consumers_sync();
        if (tid == 0) mbar_arrive(done + j);  // every warp has read the stage
        if (tid < NT * 64) {  // (n-tile, row half, lane): gate in accumulator r < 2, up in r + 2
            const int u = (tid >> 6) * 128 + ((tid >> 5) & 1) * 32 + (tid & 31);
            float gs = 0.0f, us = 0.0f;
#pragma unroll
            for (int w = 0; w < STREAM_CW; w++) {
                gs += red[w * F + u];
                us += red[w * F + u + 64];
            }
            const int m = 8 * (tid >> 6) + 2 * (tid & 3) + ((tid >> 5) & 1);
            if (m < M) act[(size_t)m * I + 8 * (t1 + j) + ((tid & 31) >> 2)] = swiglu(from_f32<T>(gs), from_f32<T>(us));
        }
        consumers_sync();  // red is free again
    }
    PROF(3);
    if (tid == 0) grid_arrive_and_wait(bar, bar + 1);  // every block's act is written (the sync above covers it)
    consumers_sync();
    PROF(4);

    // Phase 2: y = down act, this block's tiles of slice `slice` (K columns k0..k0 + KSL of act).
    stage_rows(xs, LD2, act + k0, (size_t)I, KSL, M, XR);
    consumers_sync();
    constexpr int PER = (F + CT - 1) / CT;  // outputs a thread adds up
    for (int q = 0; q < n2; q++) {
        const int j = n1 + q, t = t2 + q;
        mbar_wait(full + j, 0u);
        ksplit_tile<T, NT>(stage + (size_t)(j % NS) * 16 * LDS, xs, LD2, KSL / 16, warp, lane, red);
        consumers_sync();
        if (tid == 0) mbar_arrive(done + j);
#pragma unroll
        for (int e = 0; e < PER; e++) {
            const int u = tid + e * CT;
            if (u >= F) continue;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < STREAM_CW; w++) v += red[w * F + u];
            if (S > 1) ws[((size_t)slice * T2 + t) * F + u] = v;  // this slice's tile; added below
            else store_down(y, v, u, t, M, H);
        }
        consumers_sync();  // red is free again
    }
    PROF(5);
    if (S == 1) return;
    // The block's tiles counted at once (one fence, one round of atomics for all of them, not one a tile); each
    // tile's last block adds its S slices in slice order and resets the tile's counter for the next launch.
    __threadfence();
    consumers_sync();
    if (tid < n2) last[tid] = atomicAdd(counters + t2 + tid, 1u) == (unsigned)S - 1;
    consumers_sync();
    bool fenced = false;
    for (int q = 0; q < n2; q++) {
        if (!last[q]) continue;
        if (!fenced) __threadfence();
        fenced = true;
        const int t = t2 + q;
#pragma unroll
        for (int e = 0; e < PER; e++) {
            const int u = tid + e * CT;
            if (u >= F) continue;
            float v = 0.0f;
            for (int p = 0; p < S; p++) v += __ldcg(ws + ((size_t)p * T2 + t) * F + u);
            store_down(y, v, u, t, M, H);
        }
        if (tid == 0) counters[t] = 0u;
    }
    PROF(6);
}
