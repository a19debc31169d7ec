// paged.cuh -- finding things in a step's batch and in the paged KV cache, shared by the sparse-prefill kernels.
#pragma once

// The request that owns chunk row `row`: the largest b with qsl[b] - qsl[0] <= row (qsl may be a slice of the
// step's query_start_loc, so rows count from qsl[0]; requests with no rows are skipped by the search).
__device__ __forceinline__ int find_request(const int* qsl, int num_reqs, int row) {
    int lo = 0, hi = num_reqs - 1;
    const int base = qsl[0];
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (qsl[mid] - base <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Cache slot of a request's token k through its block table (a block id past the cache is clamped, so a bad
// table reads a wrong row instead of leaving the allocation).
__device__ __forceinline__ int cache_slot(const int* table, int k, int bs, int num_blocks) {
    const unsigned blk = min((unsigned)table[k / bs], (unsigned)num_blocks - 1u);
    return (int)blk * bs + k % bs;
}
