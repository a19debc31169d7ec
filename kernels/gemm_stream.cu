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
    const int cpr = KSL / 8;  // 16-byte chunks a row
    for (int i = threadIdx.x; i < XR * cpr; i += 32 * STREAM_CW) {
        const int r = i / cpr, q = i - r * cpr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);  // rows past M are zeros: their outputs are never stored
        if (r < M) v = __ldcg(reinterpret_cast<const uint4*>(x + (size_t)r * K + k0) + q);  // (L2: just written)
        *reinterpret_cast<uint4*>(xs + (size_t)r * LD + 8 * q) = v;
    }
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
