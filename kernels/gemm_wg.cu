// gemm_wg.cu -- a decode step's gate_up projection with SwiGLU as its epilogue, on Hopper's wgmma with TMA loads
// (sm_90a only): out[m, i] = swiglu(T(x[m] . w[i]), T(x[m] . w[I + i])) for x T[M, K] (M <= 128), w = gate_up
// T[2I, K], out T[M, I]. The bits silu_mul writes from a gate_up product rounded to T (elementwise.cuh's swiglu), so
// the [M, 2I] gate_up is never written and silu_mul never launched.
//
// Where it runs (toolkit/model/plan.py, WG_DECODE_ROWS): a pure decode step of 2-32 rows, where the weights set the
// time. Why not cuBLAS: cuBLAS(Lt) has no SwiGLU epilogue (its epilogues are per element of one output; SwiGLU pairs
// column i with column I + i). It is built the way FlashAttention-3 and CUTLASS's Hopper GEMMs are: a producer warp
// issues TMA copies (cp.async.bulk.tensor) into a ring of shared-memory stages, each with a "full" and an "empty"
// mbarrier, the consumer warpgroup runs wgmma on them, and SwiGLU runs on the accumulators in registers.
// (A first form put x's rows on wgmma's m side, 128 rows a tile, for a prompt's rows too: cooperative and ping-pong
// kernels, removed after they lost to cuBLAS + silu_mul at every row count: experiments/NOTEBOOK.md, "Removed
// variants".)
#include "dtype.cuh"
#include "elementwise.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

constexpr int GW_BK = 64;  // K a stage: one 128-byte swizzle row of 16-bit elements

// The operands swapped (y^T = W x^T, as gemm_skinny does on mma.sync): the weights are wgmma's m64 side and the
// step's rows its n side (NB = the rows padded to 8-128), so a stage is 8 KB of weights and NB x 128 bytes of x, and
// a tile of 32 output columns reads its 64 weight rows once. (With x on the m side, the removed kernels' way, a
// stage held a 128-row box of x whatever the batch, and the 0.5B's 4,864 columns were only 38-76 tiles: 31-38% of
// the H100's bandwidth on the small shapes.) Here:
//   * A stage's A tile is gate rows n0..n0+31 stacked over up rows I+n0..I+n0+31 (two TMA boxes of 32 rows, one
//     128-byte-swizzled 64-row tile), its B tile x's rows 0..NB-1 (rows past M are TMA's zeros). One m64nNBk16
//     wgmma a 16-wide k slice gives gate (accumulator rows 0-31: warps 0 and 1) and up (rows 32-63: warps 2, 3).
//   * STAGES covers much of K (the 0.5B's 14 k-steps: 8-11 stages at NB <= 32): a block has most of its tile's
//     weights in flight at once; two blocks an SM (about 110 KB of ring each, CTAS = 2), so the 0.5B's 152 tiles
//     are one wave on 132 SMs (the plan runs it only where a shape's tiles fit one wave: WG_ONE_WAVE).
//   * Warp 4 is the producer: launched with PDL (a decode step's chain, pdl.cuh), the first stages' weight boxes go
//     out before pdl_wait: the weights are constants, so they stream in while the kernel before still runs, and
//     only x (that kernel's output) waits. Only this warp waits: the consumers read nothing but the stages.
//   * Epilogue: warps 2, 3 leave up, rounded to T, in shared memory; warps 0, 1 apply SwiGLU and store
//     out[row][n0 + column], 2 bytes a store (M x 32 a tile).
// One tile a block: grid ceil(I / 32), block 160. Any I and K with I % 8 == 0 and K % 8 == 0 (TMA's 16-byte row
// strides; the wrapper checks) and x, w 16-byte aligned: the copies fill what lies past the matrix with zeros (rows
// past M, columns past K: they add nothing); the last tile's gate rows past I are up's first rows, computed and not
// stored, like rows past M.
// The two tensor maps come by value, as __grid_constant__ kernel parameters (CUTLASS's way): the copies read them
// from the parameter space, so no map lives in global memory, where a map written by a host copy needs a proxy
// fence before use and the bench's engine died with CUDA_ERROR_ILLEGAL_INSTRUCTION (session 23 and 24) while every
// test passed. CTAS: blocks an SM (STAGES sized to fit, toolkit/backends/cuda_wg.py: T2_STAGES).
constexpr int GWT_COLS = 32;  // output columns a tile (its A tile: 32 gate rows over 32 up rows)
struct alignas(64) TmaMap { unsigned long long v[16]; };  // CUtensorMap's 128 opaque bytes

template <typename T, int NB, int STAGES, int CTAS>
__global__ void __launch_bounds__(160, CTAS)
    gemm_wg_swiglu_t(const __grid_constant__ TmaMap tmx_map, const __grid_constant__ TmaMap tmw_map,
                     T* __restrict__ out, int M, int I, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const void* tmx = &tmx_map;
    const void* tmw = &tmw_map;
    constexpr int A_BYTES = 2 * GWT_COLS * GW_BK * 2, B_BYTES = NB * GW_BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    T* up = reinterpret_cast<T*>(smem + STAGES * STAGE_BYTES);  // [GWT_COLS][NB]: up, rounded to T
    unsigned long long* full = reinterpret_cast<unsigned long long*>(up + GWT_COLS * NB);
    unsigned long long* empty = full + STAGES;
    const int n0 = blockIdx.x * GWT_COLS, k_steps = (K + GW_BK - 1) / GW_BK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4);  // one arrive a consumer warp
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (warp == 4) {  // the producer
        if (lane == 0) {
            const int early = min(STAGES, k_steps);
            for (int kt = 0; kt < early; kt++) {
                unsigned char* a = smem + kt * STAGE_BYTES;
                mbar_expect_tx(&full[kt], STAGE_BYTES);
                tma_load_2d(a, tmw, kt * GW_BK, n0, &full[kt]);                              // gate rows
                tma_load_2d(a + A_BYTES / 2, tmw, kt * GW_BK, I + n0, &full[kt]);            // up rows
            }
            pdl_enter();
            for (int kt = 0; kt < k_steps; kt++) {
                const int st = kt % STAGES;
                unsigned char* a = smem + st * STAGE_BYTES;
                if (kt >= early) {
                    mbar_wait(&empty[st], (kt / STAGES - 1) & 1);
                    mbar_expect_tx(&full[st], STAGE_BYTES);
                    tma_load_2d(a, tmw, kt * GW_BK, n0, &full[st]);
                    tma_load_2d(a + A_BYTES / 2, tmw, kt * GW_BK, I + n0, &full[st]);
                }
                tma_load_2d(a + A_BYTES, tmx, kt * GW_BK, 0, &full[st]);                       // x's rows
            }
        }
        return;
    }
    // The consumer warpgroup (warps 0-3).
    const T* tag = nullptr;
    float d[NB / 2];
#pragma unroll
    for (int i = 0; i < NB / 2; i++) d[i] = 0.f;
    for (int kt = 0; kt < k_steps; kt++) {
        mbar_wait(&full[kt % STAGES], (kt / STAGES) & 1);
        const unsigned char* a = smem + kt % STAGES * STAGE_BYTES;
        const unsigned long long da = sw128_desc(a, 16), db = sw128_desc(a + A_BYTES, 16);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < GW_BK / 16; k++) wgmma_ss(d, da + 2 * k, db + 2 * k, 1, tag);
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
    }
    wgmma_wait<0>();
    wgmma_keep(d);
    // d[4n + e] = (row 16 warp + lane / 4 + 8 (e / 2), column 8n + 2 (lane % 4) + e % 2): row = output column n0 + r
    // (r < 32: gate, else up, r - 32), column = the step's row.
    const int g = lane / 4, c2 = 2 * (lane % 4);
    if (warp >= 2) {
#pragma unroll
        for (int n = 0; n < NB / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                up[(16 * (warp - 2) + g + 8 * (e / 2)) * NB + 8 * n + c2 + e % 2] = from_f32<T>(d[4 * n + e]);
    }
    asm volatile("bar.sync 1, 128;\n" ::: "memory");  // up is written (warps 2, 3); the consumer warps only
    if (warp < 2) {
#pragma unroll
        for (int n = 0; n < NB / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * warp + g + 8 * (e / 2), m = 8 * n + c2 + e % 2;
                if (m < M && n0 + r < I)
                    out[(size_t)m * I + n0 + r] = swiglu(from_f32<T>(d[4 * n + e]), up[r * NB + m]);
            }
    }
#endif
}
