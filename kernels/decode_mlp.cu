// decode_mlp.cu -- the whole MLP block of a batch-1 decode step in one persistent kernel:
//     h' = T(h + attn)                                          (the residual add of add_rmsnorm)
//     x  = RMSNorm(h') * norm_w                                 (rmsnorm.cu's roundings)
//     act[j] = swiglu(T(x . w_gu[j]), T(x . w_gu[I + j]))       (gemv_swiglu's sums and roundings)
//     h[n] = T(h'[n] + T(act . w_down[n]))                      (the next add_rmsnorm's residual add)
// so h leaves the kernel holding both of the layer's residual adds, and the next layer's RMSNorm adds nothing.
// Why one kernel: at batch 1 the unfused block is 3-4 small dependent kernels (add_rmsnorm, the gate_up GEMV,
// the down GEMV) and each boundary costs a drain, a launch and a DRAM round trip for its first weight bytes.
// Here the down projection's weights (8.7 MB for Qwen2.5-0.5B) are copied into shared memory by the TMA unit
// (cp.async.bulk) from the kernel's first instruction, while the gate_up rows stream through registers; one grid
// barrier separates act (written by every block) from the down projection, which then reads its weights from
// shared memory. It measured slower than the kernels it replaces (README, "One kernel for the MLP block"), so
// EngineOptions.mlp_kernel is off by default.
//
// Layout: h, attn T[H] (h in place); norm_w T[H]; w_gu T[2I, H] (gate rows, then up rows); w_down T[H, I];
// act T[I] (scratch, written); bar u32[2] (grid barrier count and generation: zero once; the kernel leaves the
// count at zero, so launches can be captured in a CUDA graph and replayed).
// Launch: grid = the number of SMs (every block must be resident: one block an SM, by its shared memory), block
// 512 = 16 warps, dynamic smem = rpb * I * sizeof(T), rpb = ceil(H / grid) down rows a block (the wrapper checks
// that it fits, and H * sizeof(T) <= 8 KB: step 3 covers the row in one pass, as add_rmsnorm does). H and I are
// multiples of 16 bytes' worth of elements. wpr_gu, wpr_down: gemv.cu's warps per row for rows of H and of I
// elements (gemv_warps_per_row); the sums are added in gemv's order, so the kernel's bits are those of
// add_rmsnorm, gemv_swiglu, gemv and the next add_rmsnorm's residual add.
#include "dtype.cuh"
#include "elementwise.cuh"
#include "pdl.cuh"
#include "gemv.cuh"

constexpr int MLP_WARPS = 16;

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Every block of the grid waits here until all have arrived. A generation counter makes it reusable: the last
// block to arrive resets the count, then bumps the generation the others spin on. A block reads the generation
// before it arrives, and the generation cannot move before every block (this one included) has arrived.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
        __threadfence();  // this block's writes (act) are visible to every block that passes the barrier
        if (atomicAdd(count, 1u) == gridDim.x - 1u) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            unsigned now;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(gen) : "memory");
            } while (now == g);
        }
        __threadfence();
    }
    __syncthreads();
}

// One warp's dot product of row wr (global memory, or shared) with x, summed exactly as gemv.cu's kernels sum it
// with wpr warps a row (gemv_warps_per_row): part p takes chunks p * 32 + lane, + 32 * wpr, ..., in order; each
// part is reduced over the warp by xor shuffles; the parts are added in order. So the results are gemv's bits.
// x_shared false: x is act, written by this kernel, so it is read through L2 (ld.global.cg), never a stale L1 line.
template <typename T>
__device__ __forceinline__ float part_dots(const uint4* wr, const T* x, int KC, int wpr, int lane, bool x_shared) {
    constexpr int VEC = 16 / sizeof(T);
    float sum = 0.0f;
    for (int p = 0; p < wpr; p++) {
        float a = 0.0f;
        for (int c = p * 32 + lane; c < KC; c += 32 * wpr) {
            Chunk<T> wc, xc;
            wc.u = wr[c];
            xc.u = x_shared ? *reinterpret_cast<const uint4*>(x + c * VEC)
                            : __ldcg(reinterpret_cast<const uint4*>(x) + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) a += to_f32(wc.e[e]) * to_f32(xc.e[e]);
        }
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        sum = p ? sum + a : a;
    }
    return sum;
}

template <typename T>
__global__ void __launch_bounds__(512, 1)
decode_mlp(T* h, const T* attn, const T* __restrict__ norm_w, float eps, const T* __restrict__ w_gu,
           const T* __restrict__ w_down, T* act, unsigned* bar, int H, int I, int wpr_gu, int wpr_down) {
    constexpr int VEC = 16 / sizeof(T);
    extern __shared__ __align__(128) unsigned char mlp_smem[];
    T* s_down = reinterpret_cast<T*>(mlp_smem);   // [rpb][I]: this block's rows of w_down
    __shared__ __align__(16) T s_x[8192 / sizeof(T)];  // the normalised row (H / VEC <= 512: one pass of 512)
    __shared__ float s_red[MLP_WARPS];             // the sum of squares, a warp's part each
    __shared__ __align__(8) unsigned long long s_bar; // the mbarrier the TMA copies complete on
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int HC = H / VEC, IC = I / VEC;
    const int rpb = (H + gridDim.x - 1) / gridDim.x, r0 = blockIdx.x * rpb;
    const int nrows = max(0, min(rpb, H - r0));

    // 1. The down rows of this block into shared memory, asynchronously (weights: no need to wait for anything).
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&s_bar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (nrows) {
            const unsigned row_bytes = (unsigned)I * sizeof(T);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                         ::"r"(smem_u32(&s_bar)), "r"(row_bytes * nrows) : "memory");
            for (int r = 0; r < nrows; r++)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(smem_u32(s_down + (size_t)r * I)), "l"(w_down + (size_t)(r0 + r) * I),
                             "r"(row_bytes), "r"(smem_u32(&s_bar)) : "memory");
        }
    }
    // 2. This warp's first gate/up unit: its weight chunks load before the wait, as in gemv_swiglu.
    const int gw = blockIdx.x * MLP_WARPS + warp, n_gw = gridDim.x * MLP_WARPS;
    uint4 pg[GEMV_PF], pu[GEMV_PF];
    if (gw < I) {
        w_prefetch(reinterpret_cast<const uint4*>(w_gu + (size_t)gw * H), HC, lane, 32, pg);
        w_prefetch(reinterpret_cast<const uint4*>(w_gu + (size_t)(I + gw) * H), HC, lane, 32, pu);
    }
    pdl_enter();  // h and attn come from the previous kernels

    // 3. x = RMSNorm(T(h + attn)) into s_x, in every block (H values from L2; add_rmsnorm's roundings).
    float ss = 0.0f;
    for (int c = threadIdx.x; c < HC; c += blockDim.x) {
        Chunk<T> hv, av;
        hv.u = __ldcg(reinterpret_cast<const uint4*>(h) + c);
        av.u = __ldcg(reinterpret_cast<const uint4*>(attn) + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            hv.e[e] = from_f32<T>(to_f32(hv.e[e]) + to_f32(av.e[e]));
            const float v = to_f32(hv.e[e]);
            ss += v * v;
        }
        *reinterpret_cast<uint4*>(s_x + c * VEC) = hv.u;  // h' for now; normalised below
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) s_red[warp] = ss;
    __syncthreads();
    // rmsnorm.cu's block_sum, tree for tree (its warps past the row's chunks, like ours, add zeros).
    float tot = lane < MLP_WARPS ? s_red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
    const float inv = rsqrtf(tot / (float)H + eps);
    for (int c = threadIdx.x; c < HC; c += blockDim.x) {
        Chunk<T> xv, nw;
        xv.u = *reinterpret_cast<const uint4*>(s_x + c * VEC);
        nw.u = __ldg(reinterpret_cast<const uint4*>(norm_w) + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) xv.e[e] = rms_scale(to_f32(xv.e[e]), inv, nw.e[e]);
        *reinterpret_cast<uint4*>(s_x + c * VEC) = xv.u;
    }
    __syncthreads();

    // 4. act = SwiGLU(gate, up) for units j = gw, gw + n_gw, ...; with one part a row (K = 896 in bf16) the next
    //    unit's chunks load before this one's dot products (a two-deep pipeline through pg/pu).
    auto x_chunk = [&](int, int c) { return *reinterpret_cast<const uint4*>(s_x + c * VEC); };
    for (int j = gw; j < I; j += n_gw) {
        const uint4* wg = reinterpret_cast<const uint4*>(w_gu + (size_t)j * H);
        const uint4* wu = reinterpret_cast<const uint4*>(w_gu + (size_t)(I + j) * H);
        float g, u;
        if (wpr_gu == 1) {
            uint4 cg[GEMV_PF], cu[GEMV_PF];
#pragma unroll
            for (int p = 0; p < GEMV_PF; p++) { cg[p] = pg[p]; cu[p] = pu[p]; }
            const int jn = j + n_gw;
            if (jn < I) {
                w_prefetch(reinterpret_cast<const uint4*>(w_gu + (size_t)jn * H), HC, lane, 32, pg);
                w_prefetch(reinterpret_cast<const uint4*>(w_gu + (size_t)(I + jn) * H), HC, lane, 32, pu);
            }
            float ag[1], au[1];
            warp_dots<T, 1>(wg, HC, lane, 32, cg, x_chunk, ag);
            warp_dots<T, 1>(wu, HC, lane, 32, cu, x_chunk, au);
            g = ag[0];
            u = au[0];
        } else {
            g = part_dots<T>(wg, s_x, HC, wpr_gu, lane, true);
            u = part_dots<T>(wu, s_x, HC, wpr_gu, lane, true);
        }
        if (lane == 0) act[j] = swiglu(from_f32<T>(g), from_f32<T>(u));
    }

    // 5. Every block's act is written and visible; h is no longer read by step 3 anywhere.
    grid_barrier(bar, bar + 1);

    // 6. h[n] = T(h'[n] + T(act . w_down[n])) for this block's rows, a warp a row, the weights from shared memory.
    if (nrows == 0) return;
    asm volatile("{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t@!p bra WAIT_%=;\n\t}"
                 ::"r"(smem_u32(&s_bar)) : "memory");
    for (int row = warp; row < nrows; row += MLP_WARPS) {
        const float sum = part_dots<T>(reinterpret_cast<const uint4*>(s_down + (size_t)row * I), act, IC, wpr_down,
                                       lane, false);
        if (lane == 0) {
            const int n = r0 + row;
            const T hp = from_f32<T>(to_f32(h[n]) + to_f32(attn[n]));  // h' of step 3, for this element
            h[n] = from_f32<T>(to_f32(hp) + to_f32(from_f32<T>(sum)));
        }
    }
}

template __global__ void decode_mlp<float>(float*, const float*, const float*, float, const float*, const float*,
                                           float*, unsigned*, int, int, int, int);
template __global__ void decode_mlp<__half>(__half*, const __half*, const __half*, float, const __half*,
                                            const __half*, __half*, unsigned*, int, int, int, int);
template __global__ void decode_mlp<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, float,
                                                   const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                   unsigned*, int, int, int, int);
