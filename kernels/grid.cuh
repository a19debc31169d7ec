// grid.cuh -- a grid-wide barrier for persistent kernels whose blocks are all resident at once (one block an SM,
// by their shared memory): decode_mlp.cu and gemm_stream.cu's mlp_stream. A generation counter makes it
// reusable, so launches can be captured in a CUDA graph and replayed: the last block to arrive resets the count,
// then bumps the generation the others spin on. A block reads the generation before it arrives, and the
// generation cannot move before every block (this one included) has arrived. bar: u32[2], count and generation,
// zero once; the count is left at zero.
#ifndef TOOLKIT_GRID_CUH
#define TOOLKIT_GRID_CUH
// One thread of the block (after a block-level barrier, so its fence covers the block's writes; and before
// another, so the block waits for it).
__device__ __forceinline__ void grid_arrive_and_wait(unsigned* count, unsigned* gen) {
    unsigned g;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
    __threadfence();  // this block's writes are visible to every block that passes the barrier
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
#endif
