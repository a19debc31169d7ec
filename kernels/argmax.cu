// argmax.cu -- greedy pick over fp32 logits: out[r] = argmax(logits[r, :]), lowest index on ties; a row holding
// a NaN gives out[r] = -1 (a NaN logit is a bug upstream: the engine ends that request with an error record).
//
// Layout: logits float[R, V] (row-major; always fp32: the lm_head GEMM writes fp32); out int32[R].
// Launch: grid (ceil(V / chunk), R), block 256; the wrapper uses chunk = 4096, so each thread has 4 float4
// loads in flight and a 152k vocabulary is read by 38 SMs at once (one block per row, a single SM, was
// bandwidth-bound at ~16 us). Each block reduces its chunk to one (value, index) candidate and merges it into
// ws[r] with a 64-bit atomicMax on a packed key: high word = the value's bits mapped to an unsigned order
// (NaN above +inf), low word = ~index (so among equal values the lowest index is the largest key). The last
// block of a row to finish (counted in counters[r]) writes out[r] and zeroes ws[r] and counters[r] again, so
// the next call, or a CUDA-graph replay, starts clean. ws and counters (one per row) must start at zero.
#include "dtype.cuh"
#include "pick.cuh"


extern "C" __global__ void __launch_bounds__(256)
argmax(const float* __restrict__ logits, int V, int chunk, unsigned long long* __restrict__ ws,
       unsigned* __restrict__ counters, int* __restrict__ out) {
    const int r = blockIdx.y;
    const float* row = logits + (size_t)r * V;
    const int begin = blockIdx.x * chunk, end = min(begin + chunk, V);
    float best = NEG_INF;
    int best_i = 0x7fffffff;  // sentinel: any real index is lower, so -inf values still get picked
    auto take = [&](float v, int i) { if (better(v, i, best, best_i)) { best = v; best_i = i; } };

    if (V % 4 == 0 && chunk % 4 == 0 && reinterpret_cast<size_t>(row) % 16 == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        constexpr int UNROLL = 4;
        int c = begin / 4 + threadIdx.x;
        const int n4 = end / 4;
        // UNROLL independent 16-byte loads issued before any is used.
        for (; c + (UNROLL - 1) * (int)blockDim.x < n4; c += UNROLL * blockDim.x) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) v[u] = r4[c + u * blockDim.x];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int i = 4 * (c + u * blockDim.x);
                take(v[u].x, i); take(v[u].y, i + 1); take(v[u].z, i + 2); take(v[u].w, i + 3);
            }
        }
        for (; c < n4; c += blockDim.x) {
            const float4 v = r4[c];
            take(v.x, 4 * c); take(v.y, 4 * c + 1); take(v.z, 4 * c + 2); take(v.w, 4 * c + 3);
        }
    } else {
        for (int i = begin + threadIdx.x; i < end; i += blockDim.x) take(row[i], i);
    }

    // Block reduction: warp shuffles, then the warp winners through shared memory to warp 0.
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
        take(v, i);
    }
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { s_v[warp] = best; s_i[warp] = best_i; }
    __syncthreads();
    if (warp != 0) return;
    const int n_warps = (blockDim.x + 31) >> 5;
    best = lane < n_warps ? s_v[lane] : NEG_INF;
    best_i = lane < n_warps ? s_i[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
        take(v, i);
    }
    if (lane != 0) return;

    // Merge across blocks. The fence orders our atomicMax before our count, so the last block sees every key.
    if (best_i != 0x7fffffff) atomicMax(ws + r, pack(best, best_i));
    __threadfence();
    if (atomicAdd(counters + r, 1u) == gridDim.x - 1) {
        const unsigned long long key = atomicExch(ws + r, 0ull);  // read and reset for the next call
        counters[r] = 0;
        // High word all ones = a NaN won (no number maps there): report the row as -1.
        out[r] = !key ? 0 : (key >> 32) == 0xffffffffull ? -1 : (int)~(unsigned)key;
    }
}
