// scan.cuh -- a block-wide exclusive prefix sum, shared by the sparse-prefill kernels.
#pragma once

// Exclusive scan of one int per thread over a block of THREADS threads (a multiple of 32, at most 1024):
// returns the sum of the values of the threads before this one; *total gets the block's sum. warp_sums holds
// THREADS / 32 ints of shared memory.
template <int THREADS>
__device__ __forceinline__ int block_scan(int v, int* warp_sums, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < THREADS / 32 ? warp_sums[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < THREADS / 32) warp_sums[lane] = w;  // inclusive
    }
    __syncthreads();
    const int before = (warp ? warp_sums[warp - 1] : 0) + x - v;
    *total = warp_sums[THREADS / 32 - 1];
    __syncthreads();  // warp_sums may be rewritten by the next scan
    return before;
}
