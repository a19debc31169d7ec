// argmax.cu -- greedy pick over fp32 logits: out[r] = argmax(logits[r, :]), lowest index on ties, and, like
// np.argmax, the first NaN wins if there is one (a NaN logit is a bug worth surfacing, not hiding).
//
// Layout: logits float[R, V] (row-major; always fp32: the lm_head GEMM writes fp32); out int32[R].
// Launch: grid (R), block 1024: one block per row. Each thread scans a strided slice with float4 loads
// (4 in flight per iteration to cover DRAM latency: a 152k-entry row is 600 KB read by a single SM), keeps its
// best (value, index), then a warp-shuffle and a shared-memory round reduce the candidates.
// -inf without <math.h> (NVRTC has no INFINITY macro).
#define NEG_INF __int_as_float(0xff800000)

// Is candidate (v, i) better than (bv, bi)? NaN beats numbers; among equals (or NaNs) the lower index wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void __launch_bounds__(1024) argmax(const float* __restrict__ logits, int V, int* __restrict__ out) {
    const float* row = logits + (size_t)blockIdx.x * V;
    float best = NEG_INF;
    int best_i = 0x7fffffff;  // sentinel: any real index is lower, so a real -inf row still reports index 0
    auto take = [&](float v, int i) { if (better(v, i, best, best_i)) { best = v; best_i = i; } };

    const bool vec = V % 4 == 0 && reinterpret_cast<size_t>(row) % 16 == 0;
    if (vec) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const int n4 = V / 4;
        constexpr int UNROLL = 4;
        int c = threadIdx.x;
        // Main loop: UNROLL independent 16-byte loads issued before any is used.
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
        for (int i = threadIdx.x; i < V; i += blockDim.x) take(row[i], i);
    }

    // Warp reduction, then the warp winners through shared memory to warp 0.
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
    if (warp == 0) {
        const int n_warps = (blockDim.x + 31) >> 5;
        best = lane < n_warps ? s_v[lane] : NEG_INF;
        best_i = lane < n_warps ? s_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
            take(v, i);
        }
        if (lane == 0) out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;
    }
}
