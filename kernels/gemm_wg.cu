// gemm_wg.cu -- a decode step's gate_up projection with SwiGLU as its epilogue, on Hopper's wgmma with TMA loads
// (sm_90a only): out[m, i] = swiglu(T(x[m] . w[i]), T(x[m] . w[I + i])) for x T[M, K], w = gate_up T[2I, K],
// out T[M, I]. The bits silu_mul writes from a gate_up product rounded to T (elementwise.cuh's swiglu), so the
// [M, 2I] gate_up is never written and silu_mul never launched. With `parts`, silu_mul_scaled's bits instead
// (GwScale: the RMSNorm scale a gemm_skinny_norm o projection left to apply).
//
// Where it runs (toolkit/model/plan.py, WG_DECODE_ROWS): a decode step's rows. There the weights set the time: the
// producer's TMA ring keeps STAGES boxes of them in flight an SM, and launched with PDL it starts streaming them
// while the kernel before still runs (GwRing::produce). It was first built for a prompt's rows, where SwiGLU was 9%
// of a 4,096-token prefill; there it reached 51-56% of the tensor cores' peak against cuBLAS's 72-82% and lost
// (experiments/NOTEBOOK.md).
//
// Why not cuBLAS: cuBLAS(Lt) has no SwiGLU epilogue (its epilogues are per element of one output; SwiGLU pairs
// column i with column I + i). So this kernel is a whole GEMM, built the way FlashAttention-3 and CUTLASS's Hopper
// GEMMs are:
//   * Warp specialisation. Warpgroup 0 is the producer: one thread issues the TMA copies (cp.async.bulk.tensor) of
//     each k-step's tiles into a ring of STAGES shared-memory stages and arms the stage's "full" mbarrier with the
//     bytes to expect. Warpgroups 1 and 2 are the consumers: each waits on "full", runs its 64 rows of the 128-row
//     tile through wgmma (A = x's tile, B = the gate and the up tiles, both K-major, 128-byte swizzled as the TMA
//     writes them: wgmma.cuh), keeps one wgmma group in flight, and releases the stage it finished on "empty". So
//     loads, math and the producer's waits overlap without a block-wide barrier in the loop.
//   * setmaxnreg: the producer drops to 40 registers (24 at two blocks an SM), the consumers rise to 232 (104), for
//     the accumulators (a consumer holds 64 x BNH of gate and 64 x BNH of up in fp32: BNH registers a thread).
//   * Persistent blocks: CTAS an SM, walking tiles blockIdx.x, + gridDim.x, ...; m fastest, so the blocks in flight
//     share a few gate/up weight tiles and all of x (L2). The producer runs into the next tile while the consumers
//     store this one, so a tile's pipeline fill is hidden; with two blocks an SM, one's epilogue (SwiGLU's exp and
//     division, about 2 us of a 128 x 128 tile's ~10) also runs beside the other's GEMM.
//   * The epilogue in registers: a thread's accumulator element (row, col) of gate and of up sit at the same index
//     of its two arrays (wgmma.cuh's layout), so SwiGLU needs no exchange; each thread stores pairs of columns.
// Tile: 128 rows x BNH output columns (2 * BNH weight rows) x 64 of K a stage. Any M, I and K with I % 8 == 0 and
// K % 8 == 0 (TMA's 16-byte row strides; the wrapper checks) and x, w 16-byte aligned: the copies fill what lies past
// the matrix with zeros (rows past M, columns past K: they add nothing), and the last column tile's gate rows past I
// are up's first rows, computed and not stored, like rows past M.
// Arguments: the two TMA descriptors (in device memory: toolkit/backends/cuda_wg.py makes them), out, M, I, K, and
// GwScale's parts (or null), tiles, H (= 16 tiles) and eps.
// Launch: grid min(tiles, CTAS x SMs), block 384, dynamic smem STAGES * (128 + 2 * BNH) * 128 bytes + 16 * STAGES
// (the barriers) + 1 KB (alignment).
#include "dtype.cuh"
#include "elementwise.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

constexpr int GW_BM = 128;  // rows a tile (64 a consumer warpgroup)
constexpr int GW_BK = 64;   // K a stage: one 128-byte swizzle row of 16-bit elements

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The RMSNorm scale of a decode step whose o projection was gemm_skinny_norm (the plan's swiglu "scaled"): x is then
// h * w, and the gate_up product still needs inv = rsqrt(sum of h^2 / H + eps) a row, which silu_mul_scaled
// (activation.cu) applies as swiglu(T(inv * T(g)), T(inv * T(u))). parts float[tiles, M]: the row's sums of h^2, a
// 16-column tile each. Without parts, inv = 1: T(1 * T(v)) = T(v), silu_mul's roundings, so one epilogue serves both.
struct GwScale {
    const float* parts;
    int tiles, H;
    float eps;
    // inv of rows rw + lane / 4 and rw + lane / 4 + 8 (rw: the warp's first row, the same in every lane), each row
    // summed as silu_mul_scaled sums it (lane l adds tiles l, l + 32, ...; then the same shuffle tree), so its bits.
    __device__ __forceinline__ void rows(float (&inv)[2], int rw, int M, int lane) const {
        inv[0] = inv[1] = 1.f;
        if (parts == nullptr) return;
        for (int i = 0; i < 16 && rw + i < M; i++) {
            float ss = 0.0f;
            for (int q = lane; q < tiles; q += 32) ss += __ldcg(parts + (size_t)q * M + rw + i);
            for (int d = 16; d > 0; d >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, d);
            if (lane / 4 == i % 8) inv[i / 8] = rsqrtf(ss / (float)H + eps);
        }
    }
};

// SwiGLU of a warpgroup's 64 x 2BNH accumulator d (columns 0..BNH-1 gate, BNH..2BNH-1 up: one wgmma over the
// stage's gate rows and then its up rows) into out. d[4n + e] = (row 16 warp + lane / 4 + 8 (e / 2), column 8n +
// 2 (lane % 4) + e % 2) (wgmma.cuh), so gate column j and up column j sit BNH / 2 apart in the same thread. rw: the
// warp's first row; c0: this thread's first column. Rows past M and columns past I are not stored (I even: a pair is
// whole).
template <typename T, int BNH>
__device__ __forceinline__ void gw_store(const float (&d)[BNH], T* __restrict__ out, int rw, int c0, int M, int I,
                                         const GwScale& sc, int lane) {
    float inv[2];
    sc.rows(inv, rw, M, lane);
    const int r0 = rw + lane / 4;
    auto v = [&](float a, float s) { return from_f32<T>(s * to_f32(from_f32<T>(a))); };
#pragma unroll
    for (int n = 0; n < BNH / 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + 8 * h, e = 4 * n + 2 * h;
            if (r < M && c0 + 8 * n < I) {
                union { T v[2]; unsigned w; } p;
                p.v[0] = swiglu(v(d[e], inv[h]), v(d[e + BNH / 2], inv[h]));
                p.v[1] = swiglu(v(d[e + 1], inv[h]), v(d[e + 1 + BNH / 2], inv[h]));
                *reinterpret_cast<unsigned*>(out + (size_t)r * I + c0 + 8 * n) = p.w;
            }
        }
}

// The ring, its barriers and the tile walk, shared by both kernels. A stage: x's 128 x 64 box, then gate's and up's
// BNH x 64 boxes back to back (so one descriptor covers the 2BNH weight rows of [gate | up]).
template <int BNH, int STAGES>
struct GwRing {
    static constexpr int A_BYTES = GW_BM * GW_BK * 2, B_BYTES = BNH * GW_BK * 2, STAGE_BYTES = A_BYTES + 2 * B_BYTES;
    unsigned char* smem;
    unsigned long long *full, *empty;
    int m_tiles, tiles, k_steps;
    __device__ GwRing(unsigned char* raw, int M, int I, int K, unsigned consumers) {
        smem = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);  // 1,024-byte aligned
        full = reinterpret_cast<unsigned long long*>(smem + STAGES * STAGE_BYTES);
        empty = full + STAGES;
        m_tiles = (M + GW_BM - 1) / GW_BM;
        tiles = m_tiles * ((I + BNH - 1) / BNH);
        k_steps = (K + GW_BK - 1) / GW_BK;
        if (threadIdx.x == 0) {
            for (int s = 0; s < STAGES; s++) {
                mbar_init(&full[s], 1);            // the producer's arrive (with the bytes it expects)
                mbar_init(&empty[s], consumers);  // one arrive a consumer warp
            }
            fence_barrier_init();
        }
        __syncthreads();
    }
    __device__ int m0(int tile) const { return tile % m_tiles * GW_BM; }
    __device__ int n0(int tile) const { return tile / m_tiles * BNH; }
    // The producer (one thread): every k-step of the block's tiles, in order, into the ring. Launched with PDL
    // (a decode step's chain, pdl.cuh), the weight boxes of the ring's first stages go out before pdl_wait: the
    // weights are constants, so they stream in while the kernel before still runs, and only x (that kernel's
    // output) waits. The stage's "full" barrier counts the bytes of all three boxes, whichever order they come in.
    // Only this thread waits: the consumers read nothing but the stages, and store only after the stage holding x
    // is full, so after the wait. Launched normally, pdl_wait and pdl_launch_dependents are no-ops.
    __device__ void produce(const void* tmx, const void* tmw, int I) const {
        const int early = (int)blockIdx.x < tiles ? min(STAGES, k_steps) : 0;
        tmap_acquire(tmw);
        tmap_acquire(tmx);
        for (int kt = 0; kt < early; kt++) {
            unsigned char* a = smem + kt * STAGE_BYTES;
            mbar_expect_tx(&full[kt], STAGE_BYTES);
            tma_load_2d(a + A_BYTES, tmw, kt * GW_BK, n0(blockIdx.x), &full[kt]);
            tma_load_2d(a + A_BYTES + B_BYTES, tmw, kt * GW_BK, I + n0(blockIdx.x), &full[kt]);
        }
        pdl_enter();
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
            for (int kt = 0; kt < k_steps; kt++, it++) {
                const int st = it % STAGES;
                unsigned char* a = smem + st * STAGE_BYTES;
                if (it < early) {  // its weights are on the way: x only
                    tma_load_2d(a, tmx, kt * GW_BK, m0(tile), &full[st]);
                    continue;
                }
                if (it >= STAGES) mbar_wait(&empty[st], (it / STAGES - 1) & 1);
                mbar_expect_tx(&full[st], STAGE_BYTES);
                tma_load_2d(a, tmx, kt * GW_BK, m0(tile), &full[st]);
                tma_load_2d(a + A_BYTES, tmw, kt * GW_BK, n0(tile), &full[st]);                // gate rows
                tma_load_2d(a + A_BYTES + B_BYTES, tmw, kt * GW_BK, I + n0(tile), &full[st]);  // up rows
            }
    }
    // Consumer side of k-step it: wait for its stage; the stage's address.
    __device__ const unsigned char* take(int it) const {
        mbar_wait(&full[it % STAGES], (it / STAGES) & 1);
        return smem + it % STAGES * STAGE_BYTES;
    }
    __device__ void give_back(int it, int lane) const {
        if (lane == 0) mbar_arrive(&empty[it % STAGES]);
    }
};

#endif

// Cooperative: both consumer warpgroups on each tile, 64 rows each.
template <typename T, int BNH, int STAGES, int CTAS>
__global__ void __launch_bounds__(384, CTAS)
    gemm_wg_swiglu(const void* __restrict__ tmx, const void* __restrict__ tmw, T* __restrict__ out, int M, int I,
                   int K, const float* __restrict__ parts, int tiles, int H, float eps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    using Ring = GwRing<BNH, STAGES>;
    const Ring ring(smem_raw, M, I, K, 8);
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(CTAS == 1 ? 40 : 24));
        if (threadIdx.x == 0) ring.produce(tmx, tmw, I);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CTAS == 1 ? 232 : 104));
        const int cw = wg - 1, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
        const T* tag = nullptr;
        float d[BNH];
        int it = 0;
        for (int tile = blockIdx.x; tile < ring.tiles; tile += gridDim.x) {
#pragma unroll
            for (int i = 0; i < BNH; i++) d[i] = 0.f;
            for (int kt = 0; kt < ring.k_steps; kt++, it++) {
                const unsigned char* a = ring.take(it);
                const unsigned long long da = sw128_desc(a + cw * 64 * 128, 16), db = sw128_desc(a + Ring::A_BYTES, 16);
                wgmma_fence();
#pragma unroll
                for (int k = 0; k < GW_BK / 16; k++)  // 16 of K = 32 bytes along the swizzled row: +2 in the desc
                    wgmma_ss(d, da + 2 * k, db + 2 * k, 1, tag);
                wgmma_commit();
                wgmma_wait<1>();  // the previous k-step's group is done: its stage goes back to the producer
                if (kt > 0) ring.give_back(it - 1, lane);
            }
            wgmma_wait<0>();
            wgmma_keep(d);
            ring.give_back(it - 1, lane);
            gw_store<T, BNH>(d, out, ring.m0(tile) + cw * 64 + warp * 16, ring.n0(tile) + 2 * (lane % 4), M, I,
                             GwScale{parts, tiles, H, eps}, lane);
        }
    }
#endif
}

// Ping-pong (CUTLASS's name): each consumer warpgroup takes whole tiles, the block's even tiles warpgroup 1's and
// the odd ones warpgroup 2's, and the two take turns at the tensor cores (named barriers 1 and 2): one runs its
// k-loop while the other runs its SwiGLU and stores, so the epilogue leaves the tensor cores idle only at the
// block's first and last tile. A warpgroup's tile is 128 rows: two m64 wgmmas a 16-wide k slice, 2BNH registers.
template <typename T, int BNH, int STAGES>
__global__ void __launch_bounds__(384, 1)
    gemm_wg_swiglu_pp(const void* __restrict__ tmx, const void* __restrict__ tmw, T* __restrict__ out, int M, int I,
                      int K, const float* __restrict__ parts, int tiles, int H, float eps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    using Ring = GwRing<BNH, STAGES>;
    const Ring ring(smem_raw, M, I, K, 4);
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) ring.produce(tmx, tmw, I);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
        const int mine = (ring.tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;  // this block's tiles
        const T* tag = nullptr;
        float d0[BNH], d1[BNH];  // rows 0-63 and 64-127 of the tile
        for (int i = cw; i < mine; i += 2) {
            const int tile = blockIdx.x + i * gridDim.x;
#pragma unroll
            for (int j = 0; j < BNH; j++) d0[j] = d1[j] = 0.f;
            if (i > 0) {  // wait for the turn the other warpgroup gives after its k-loop
                if (cw == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
                else asm volatile("bar.sync 2, 256;\n" ::: "memory");
            }
            int it = i * ring.k_steps;
            for (int kt = 0; kt < ring.k_steps; kt++, it++) {
                const unsigned char* a = ring.take(it);
                const unsigned long long da = sw128_desc(a, 16), db = sw128_desc(a + Ring::A_BYTES, 16);
                wgmma_fence();
#pragma unroll
                for (int k = 0; k < GW_BK / 16; k++) {
                    wgmma_ss(d0, da + 2 * k, db + 2 * k, 1, tag);
                    wgmma_ss(d1, da + 64 * 128 / 16 + 2 * k, db + 2 * k, 1, tag);  // rows 64-127: 8 KB further
                }
                wgmma_commit();
                wgmma_wait<1>();
                if (kt > 0) ring.give_back(it - 1, lane);
            }
            if (i + 1 < mine) {  // the other warpgroup's turn (its tile i + 1 is next in the ring)
                if (cw == 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
                else asm volatile("bar.arrive 1, 256;\n" ::: "memory");
            }
            wgmma_wait<0>();
            wgmma_keep(d0);
            wgmma_keep(d1);
            ring.give_back(it - 1, lane);
            const int rw = ring.m0(tile) + warp * 16, c0 = ring.n0(tile) + 2 * (lane % 4);
            const GwScale sc{parts, tiles, H, eps};
            gw_store<T, BNH>(d0, out, rw, c0, M, I, sc, lane);
            gw_store<T, BNH>(d1, out, rw + 64, c0, M, I, sc, lane);
        }
    }
#endif
}

// A decode step's gate_up, the operands swapped (y^T = W x^T, as gemm_skinny does on mma.sync): the weights are
// wgmma's m64 side and the step's rows its n side (NB = the rows padded to 8-128), so a stage is 8 KB of weights and
// NB x 128 bytes of x, and a tile of 32 output columns reads its 64 weight rows once. The cooperative and ping-pong
// kernels above put x on the m side: a 128-row box a stage whatever the batch (at BNH 32, 16 KB of x for each 8 KB
// of weights), and at BNH 64-128 the 0.5B's 4,864 columns are only 38-76 tiles (session 23 measured them at 31-38%
// of the H100's bandwidth on the small shapes, experiments/NOTEBOOK.md). Here:
//   * A stage's A tile is gate rows n0..n0+31 stacked over up rows I+n0..I+n0+31 (two TMA boxes of 32 rows, one
//     128-byte-swizzled 64-row tile), its B tile x's rows 0..NB-1 (rows past M are TMA's zeros). One m64nNBk16
//     wgmma a 16-wide k slice gives gate (accumulator rows 0-31: warps 0 and 1) and up (rows 32-63: warps 2, 3).
//   * STAGES covers most or all of K (the 0.5B's 14 k-steps at NB <= 32): a block has its tile's weights in flight
//     at once, one DRAM round trip, not K / STAGES of them; one block an SM (about 210 KB of ring).
//   * Warp 4 is the producer: the first stages' weight boxes go out before pdl_wait (as GwRing::produce).
//   * Epilogue: warps 2, 3 leave up, rounded to T, in shared memory; warps 0, 1 apply SwiGLU (and GwScale's inv, a
//     step row's, which the producer warp sums into shared memory once its copies are out, while the k-loop runs)
//     and store out[row][n0 + column], 2 bytes a store (M x 32 a tile).
// One tile a block: grid ceil(I / 32), block 160. Arguments as gemm_wg_swiglu's.
// The two tensor maps come by value, as __grid_constant__ kernel parameters (CUTLASS's way): the copies read them
// from the parameter space, so no map lives in global memory, where a map written by a host copy needs a proxy
// fence before use and the bench's engine died with CUDA_ERROR_ILLEGAL_INSTRUCTION (session 23 and 24) while every
// test passed. CTAS: blocks an SM (STAGES sized to fit, toolkit/backends/cuda_wg.py: T_STAGES).
constexpr int GWT_COLS = 32;  // output columns a tile (its A tile: 32 gate rows over 32 up rows)
struct alignas(64) TmaMap { unsigned long long v[16]; };  // CUtensorMap's 128 opaque bytes

template <typename T, int NB, int STAGES, int CTAS>
__global__ void __launch_bounds__(160, CTAS)
    gemm_wg_swiglu_t(const __grid_constant__ TmaMap tmx_map, const __grid_constant__ TmaMap tmw_map,
                     T* __restrict__ out, int M, int I, int K, const float* __restrict__ parts, int tiles, int H,
                     float eps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const void* tmx = &tmx_map;
    const void* tmw = &tmw_map;
    constexpr int A_BYTES = 2 * GWT_COLS * GW_BK * 2, B_BYTES = NB * GW_BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    T* up = reinterpret_cast<T*>(smem + STAGES * STAGE_BYTES);             // [GWT_COLS][NB]: up, rounded to T
    float* inv = reinterpret_cast<float*>(up + GWT_COLS * NB);             // [NB]: GwScale's inv of each row
    unsigned long long* full = reinterpret_cast<unsigned long long*>(inv + NB);
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
        __syncwarp();
        // Then GwScale's inv of each step row, while the consumers run the k-loop: without parts 1 (a lane a row);
        // with them (after a gemm_skinny_norm o: up to 32 rows) summed as silu_mul_scaled sums a row (lane l adds
        // tiles l, l + 32, ..., then the same shuffle tree), so its bits. parts come from the kernels before: wait.
        // GW_INV_ROWS rows at once, their loads issued together: a row at a time was a dependent L2 round trip or
        // two a row, about 17 us a layer at 32 rows (session 25, an H100: 1,222 against 801 us for the 0.5B's step).
        if (parts == nullptr) {
            for (int m = lane; m < NB; m += 32) inv[m] = 1.f;
        } else {
            constexpr int GW_INV_ROWS = 8;
            const int rows = min(M, NB);
            pdl_wait();
            for (int m0 = 0; m0 < rows; m0 += GW_INV_ROWS) {
                float ss[GW_INV_ROWS];
#pragma unroll
                for (int j = 0; j < GW_INV_ROWS; j++) ss[j] = 0.0f;
                for (int q = lane; q < tiles; q += 32) {  // each row's tiles in silu_mul_scaled's order
                    const float* pq = parts + (size_t)q * M + m0;
#pragma unroll
                    for (int j = 0; j < GW_INV_ROWS; j++)
                        if (m0 + j < rows) ss[j] += __ldcg(pq + j);
                }
#pragma unroll
                for (int j = 0; j < GW_INV_ROWS; j++) {
                    for (int o = 16; o > 0; o >>= 1) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
                    if (lane == 0 && m0 + j < rows) inv[m0 + j] = rsqrtf(ss[j] / (float)H + eps);
                }
            }
        }
        asm volatile("bar.arrive 1, 160;\n" ::: "memory");  // inv is written (the consumers' epilogue barrier)
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
    asm volatile("bar.sync 1, 160;\n" ::: "memory");  // up (warps 2, 3) and inv (the producer warp) are written
    if (warp < 2) {
#pragma unroll
        for (int n = 0; n < NB / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * warp + g + 8 * (e / 2), m = 8 * n + c2 + e % 2;
                if (m < M && n0 + r < I) {
                    const float s = inv[m];
                    const T gt = from_f32<T>(s * to_f32(from_f32<T>(d[4 * n + e])));
                    const T ut = from_f32<T>(s * to_f32(up[r * NB + m]));
                    out[(size_t)m * I + n0 + r] = swiglu(gt, ut);
                }
            }
    }
#endif
}
