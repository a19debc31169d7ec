// wgmma.cuh -- Hopper (sm_90a) warpgroup matrix multiply: the pieces kernels/prefill_attention.cu's
// prefill_attention_wg uses. Include it after mma.cuh (smem_addr). Everything here needs -arch=sm_90a
// (toolkit/backends/cuda_kernels.py compiles the ops that use it so on an sm_90 GPU).
//
// Why wgmma and not mma.sync: with mma.sync each warp brings its own copy of every K and V fragment from shared
// memory into registers (ldmatrix), so a warp of 16 query rows moves 0.07 bytes of smem a flop and the kernel is
// bound by the SM's 128 bytes a clock of smem at under half the tensor cores' rate. A warpgroup's wgmma reads its B
// operand from shared memory once for all 64 rows of the group (4x less traffic a flop), straight into the tensor
// cores.
//
// Operands in shared memory are described by a 64-bit descriptor. Ours are all "128-byte swizzled" tiles of 16-bit
// elements: rows of 64 elements (128 bytes), 8-row groups of 1,024 bytes, the 16-byte unit u of row r stored at unit
// u ^ (r % 8) of that row (so the 8 rows an instruction reads at one column hit 8 different bank groups). A row of
// D > 64 elements is cut into D / 64 column chunks of all the tile's rows each (sw128_offset). The tile must start
// 1,024-byte aligned; a k-step inside a chunk then moves the start address by 32 bytes, as CUTLASS's descriptor
// iterator does (the hardware applies the swizzle to the final address).
//   K-major operand (Q and K: rows are the M or N index, the 16-long K slice runs along the row): SBO = 1,024 bytes
//   between 8-row groups, LBO unused (16).
//   MN-major operand (V for P.V: rows are keys = the K index, the row runs along N = the head dim): SBO = 1,024 bytes
//   between 8-key groups, LBO = bytes between 64-column chunks; the instruction's trans-b flag says so.
// Accumulators (fp32, m64nNk16): thread t of the warpgroup, warp w = t / 32, g = lane / 4, c = lane % 4, holds
// d[4n + e] = (row 16w + g + 8 * (e / 2), column 8n + 2c + e % 2) -- the layout of mma.m16n8k16's C tiles, so
// mma.cuh's softmax_tile and store_tile_rows work on it unchanged. An A operand from registers has mma.m16n8k16's A
// layout (a warp's 16 rows), so P comes from the S accumulators as in mma.cuh's pv_tile.
// wgmma runs asynchronously: wgmma_fence before the first one that reads registers written since, wgmma_commit to
// close a group, wgmma_wait<0> before touching its accumulators (wgmma_keep then stops the compiler from moving
// reads of them above the wait), fence_async_smem after smem writes a wgmma will read.
#pragma once

__device__ __forceinline__ unsigned long long sw128_desc(const void* tile, unsigned lbo_bytes) {
    const unsigned a = smem_addr(tile);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);  // layout type 1: 128-byte swizzle
}

// Byte offset of 16-byte unit u (elements 8u..8u+7) of row r in a 128-byte-swizzled tile of `rows` rows.
__device__ __forceinline__ int sw128_offset(int rows, int r, int u) {
    return (u >> 3) * rows * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4);
}

__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R> __device__ __forceinline__ void wgmma_keep(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R> __device__ __forceinline__ void wgmma_keep(unsigned (&a)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

// The accumulator operands of an m64nNk16 tile (d[0..N/2)): "+f" constraints and the PTX register list.
#define WG_D32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),             \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),           \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_D64 WG_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),    \
    "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),           \
    "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),           \
    "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),           \
    "+f"(d[63])
#define WG_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// The narrow tiles of gemm_wg.cu's decode kernel (n = a decode step's rows padded to 8-32: d[4..16]).
#define WG_D4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define WG_D8 WG_D4, "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WG_D16 WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
    "+f"(d[15])
#define WG_R4 "{%0, %1, %2, %3}"
#define WG_R8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

// d (+)= A B for a 64 x N x 16 step, A and B both K-major in smem (descriptors a, b); accumulate 0 overwrites d.
#define WG_SS(N, DL, RL, AB, ACC, TY, TT)                                                                            \
    __device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b,         \
                                             int accumulate, const TT*) {                                           \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RL ", " AB ", p, 1, 1, 0, 0;\n}\n" \
                     : DL : "l"(a), "l"(b), "r"(accumulate));                                                       \
    }
// d += A B for a 64 x N x 16 step, A from registers (a warp's 16 x 16 slice), B MN-major in smem (descriptor b).
#define WG_RS(N, DL, RL, AB, ACC, TY, TT)                                                                            \
    __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long b,       \
                                             const TT*) {                                                           \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RL ", " AB ", p, 1, 1, 1;\n}\n" \
                     : DL : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                           \
    }
WG_SS(8, WG_D4, WG_R4, "%4, %5", "%6", "bf16", __nv_bfloat16)
WG_SS(8, WG_D4, WG_R4, "%4, %5", "%6", "f16", __half)
WG_SS(16, WG_D8, WG_R8, "%8, %9", "%10", "bf16", __nv_bfloat16)
WG_SS(16, WG_D8, WG_R8, "%8, %9", "%10", "f16", __half)
WG_SS(32, WG_D16, WG_R16, "%16, %17", "%18", "bf16", __nv_bfloat16)
WG_SS(32, WG_D16, WG_R16, "%16, %17", "%18", "f16", __half)
WG_SS(64, WG_D32, WG_R32, "%32, %33", "%34", "bf16", __nv_bfloat16)
WG_SS(64, WG_D32, WG_R32, "%32, %33", "%34", "f16", __half)
WG_SS(128, WG_D64, WG_R64, "%64, %65", "%66", "bf16", __nv_bfloat16)
WG_SS(128, WG_D64, WG_R64, "%64, %65", "%66", "f16", __half)
WG_RS(64, WG_D32, WG_R32, "{%32, %33, %34, %35}, %36", "%37", "bf16", __nv_bfloat16)
WG_RS(64, WG_D32, WG_R32, "{%32, %33, %34, %35}, %36", "%37", "f16", __half)
WG_RS(128, WG_D64, WG_R64, "{%64, %65, %66, %67}, %68", "%69", "bf16", __nv_bfloat16)
WG_RS(128, WG_D64, WG_R64, "{%64, %65, %66, %67}, %68", "%69", "f16", __half)
#undef WG_SS
#undef WG_RS

// mbarriers and TMA (kernels/gemm_wg.cu; dev/prefill_attention_wgp.cu and _wgt.cu). A barrier completes a phase when
// its arrival count is reached and, after an expect_tx, the bytes the copies it was armed with have landed.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive and arm the current phase with `bytes` more to land (the copies that complete_tx on this barrier).
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// Wait for the phase of parity `parity` of the barrier to complete (the k-th completion has parity k % 2).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// Before a thread's first copy through a tensor map kept in global memory: the map was written there by a host copy
// (toolkit/backends/cuda_wg.py), through the generic proxy, and the copies read it through the tensormap proxy; the
// CUDA programming guide asks for this acquire (scope .sys: the writer was the host) before such a map is used.
__device__ __forceinline__ void tmap_acquire(const void* tmap) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(tmap) : "memory");
}
// One box of a 2-D tensor map (coordinates: column c0, row c1) into smem, completing its bytes on the barrier.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, int c0, int c1, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_addr(dst)), "l"(tmap), "r"(c0), "r"(c1), "r"(smem_addr(bar))
                 : "memory");
}
#endif
