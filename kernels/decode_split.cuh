// decode_split.cuh -- what the two decode-attention kernels share (decode_attention.cu, CUDA-core math, and
// decode_attention_tc.cu, tensor cores): how a sequence's keys are cut into splits, and the end of a block, where
// its 4 warps' partial results meet and the splits of a sequence are merged ("flash-decoding").
// Include after dtype.cuh (NEG_INF, from_f32).
#pragma once

// Keys per split: the length spread evenly over the splits, rounded up to whole tiles of kt keys, except that a
// sequence of up to one_split_tiles tiles is one split (no merge). Every block computes it from the device-side
// length, so splits 0..ceil(length / chunk)-1 are exactly the non-empty ones.
__device__ __forceinline__ int split_chunk(int length, int n_splits, int kt, int one_split_tiles) {
    if (length <= one_split_tiles * kt) return one_split_tiles * kt;  // one split: no merge
    const int c = (length + n_splits - 1) / n_splits;
    return max(kt, (c + kt - 1) / kt * kt);  // >= kt: never 0, even for a bogus length
}

// Tokens of sequence b to attend: seq_lens[b] clamped to what its block-table row can address.
__device__ __forceinline__ int seq_length(const int* seq_lens, int b, int max_len) {
    return min(max(seq_lens[b], 0), max_len);
}

// Four consecutive outputs, each times `scale`.
template <typename T>
__device__ __forceinline__ void store_scaled4(T* dst, float4 o, float scale) {
    dst[0] = from_f32<T>(o.x * scale); dst[1] = from_f32<T>(o.y * scale);
    dst[2] = from_f32<T>(o.z * scale); dst[3] = from_f32<T>(o.w * scale);
}

// The end of a block of 4 warps that owns q heads h0..h0+Gb-1 of sequence b and keys of split `split`:
// red[w][g][d], m[w][g], l[w][g] are warp w's unnormalised output, running max (log2 units) and sum of exps for
// head g (a warp that saw no valid key: m = -inf, l = 0, red = 0; at least one warp saw one). The warps are merged,
// each rescaled from its own max to the block's. One non-empty split (a short sequence: the common decode case):
// the block normalises straight into out. Several: each writes its partial to the workspace (ws_ml: max, sum;
// ws_acc: output) and counts itself done in counters[b, blockIdx.x]; the last one merges them all (weights
// 2^(m_s - m_max) / sum_s(l_s 2^(m_s - m_max))) into out and resets the counter, so graphs replay it. (No second
// kernel: a second launch per layer cost ~2-3 us in a batch-1 decode step.) m and l are overwritten. s_last: a
// __shared__ flag of the kernel's (each kernel declares it where its shared-memory layout, and so its machine code,
// stays what was measured: the order of __shared__ declarations is the layout).
template <typename T, int D, int R>
__device__ __forceinline__ void finish_decode_block(const float (*red)[R][D], float (*m)[R], float (*l)[R], int Gb,
                                                    int b, int h0, int Hq, int split, int n_splits, int n_active,
                                                    float* __restrict__ ws_ml, float* __restrict__ ws_acc,
                                                    unsigned* __restrict__ counters, T* __restrict__ out,
                                                    bool& s_last) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < Gb * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        const float Mx = fmaxf(fmaxf(m[0][g], m[1][g]), fmaxf(m[2][g], m[3][g]));  // finite: chunk non-empty
        float o = 0.0f, L = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float f = exp2f(m[w][g] - Mx);  // a warp without valid keys has m = -inf: weight 0
            o += f * red[w][g][d];
            L += f * l[w][g];
        }
        if (n_active == 1) {
            out[((size_t)b * Hq + h0 + g) * D + d] = from_f32<T>(o / L);
        } else {
            const size_t row = ((size_t)b * Hq + h0 + g) * n_splits + split;
            ws_acc[row * D + d] = o;
            if (d == 0) { ws_ml[2 * row] = Mx; ws_ml[2 * row + 1] = L; }
        }
    }
    if (n_active == 1) return;

    // Several splits: the last of them to finish merges all (the others' writes are visible to it: each block
    // fences before it counts itself, and the merge reads through L2).
    __threadfence();
    __syncthreads();  // also: every thread is done reading m, l before they are reused below
    if (tid == 0) {
        unsigned* cnt = counters + (size_t)b * gridDim.x + blockIdx.x;
        s_last = atomicAdd(cnt, 1u) == (unsigned)n_active - 1u;
        if (s_last) *cnt = 0u;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Per head: the max over splits and the total weight (a warp per head), then every (head, dim) output.
    for (int g = warp; g < Gb; g += 4) {
        const float* ml = ws_ml + ((size_t)b * Hq + h0 + g) * n_splits * 2;
        float mx = NEG_INF;
        for (int sp = lane; sp < n_active; sp += 32) mx = fmaxf(mx, __ldcg(ml + 2 * sp));
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float L = 0.0f;
        for (int sp = lane; sp < n_active; sp += 32) L += __ldcg(ml + 2 * sp + 1) * exp2f(__ldcg(ml + 2 * sp) - mx);
        for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        if (lane == 0) { m[0][g] = mx; l[0][g] = 1.0f / L; }
    }
    __syncthreads();
    // Then every (head, 4 dims) column: the weighted sum of the splits' outputs, float4 loads 8 splits deep. Where the
    // columns do not fill the block, P threads share a column (every P-th split) and meet in shared memory over red
    // (read above, dead now: P * Gb * D <= 4 * R * D floats). The merge reads n_active * Gb * D floats from L2 in
    // one block, so the long-context plan keeps n_active small (cuda_kernels.py's stream_splits: at most 32; the
    // short-context plans' decode_splits gives batch 1 at 8,192 keys 128).
    constexpr int C4 = D / 4;
    const int cols = Gb * C4, P = max(1, min(4, (int)blockDim.x / cols));
    float4* part = reinterpret_cast<float4*>(const_cast<float*>(&red[0][0][0]));
    for (int i = tid; i < cols * P; i += blockDim.x) {
        const int col = i % cols, p = i / cols, g = col / C4;
        const size_t row0 = ((size_t)b * Hq + h0 + g) * n_splits;
        const float mx = m[0][g];
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int sp = p; sp < n_active; sp += P) {
            const float f = exp2f(__ldcg(ws_ml + 2 * (row0 + sp)) - mx);
            const float4 v = __ldcg(reinterpret_cast<const float4*>(ws_acc + (row0 + sp) * D) + col % C4);
            o.x += f * v.x; o.y += f * v.y; o.z += f * v.z; o.w += f * v.w;
        }
        if (P == 1) {
            store_scaled4(out + ((size_t)b * Hq + h0 + g) * D + (col % C4) * 4, o, l[0][g]);
        } else {
            part[p * cols + col] = o;
        }
    }
    if (P == 1) return;
    __syncthreads();
    for (int col = tid; col < cols; col += blockDim.x) {
        const int g = col / C4;
        float4 o = part[col];
        for (int p = 1; p < P; p++) {
            const float4 v = part[p * cols + col];
            o.x += v.x; o.y += v.y; o.z += v.z; o.w += v.w;
        }
        store_scaled4(out + ((size_t)b * Hq + h0 + g) * D + (col % C4) * 4, o, l[0][g]);
    }
}
