// decode_attention.cu -- a decode step of B sequences: each sequence's one new query per head attends keys
// 0..len_b-1 of the paged KV cache, split over the sequence ("flash-decoding") so a small batch still fills the GPU.
//     out[b, h] = softmax(scale * q[b, h] . K_b[kvh]^T) . V_b[kvh],  kvh = h / (Hq / Hkv),  len_b = seq_lens[b]
// Key j of sequence b lives in cache slot block_tables[b, j / block_size] * block_size + j % block_size.
// seq_lens is read on the device, so a captured CUDA graph replays correctly at every length; len_b = 0 (a padding
// row) gives out[b] = 0. Lengths are clamped to the block table's reach (M * block_size) and block ids to the
// cache, so a bad input gives wrong numbers but never a read out of bounds.
//
// Layout: q T[B, Hq, D]; k_cache, v_cache T[num_slots, Hkv, D]; block_tables int[B, M]; out T[B, Hq, D].
// Workspace (preallocated per plan by the wrapper): ws_ml f32[B, Hq, n_splits, 2] = (running max in log2
// units, sum of exps), ws_acc f32[B, Hq, n_splits, D] = unnormalised partial output; counters u32[B, grid.x],
// zeroed once (the kernel leaves them zeroed, so launches can be captured in a CUDA graph and replayed).
//
// One kernel (decode_attention<T, D>): grid (Hkv * n_hg, n_splits, B), block 128 (4 warps).
//   A block owns gpb = ceil(G / n_hg) <= 8 q heads of one GQA group of one sequence. With n_hg = ceil(G / 8) (a
//   big batch or a long context) every K/V byte is read once for the whole group; a small batch at a short context
//   takes more blocks a group (the wrapper's decode_head_blocks), each re-reading the K/V (from L2) for fewer heads,
//   because there the time goes to each block's chain of math per key tile, not to the bytes.
//   The sequence's keys are divided evenly over the splits (chunk = ceil(len / n_splits), rounded up to a tile; a
//   sequence of up to 2 tiles is one split), so the work spreads over the GPU at any length; splits
//   past the end exit at once. A block sweeps its chunk in tiles of KT keys:
//     - LPK lanes share one key row, each reading a 16-byte chunk (D=64 bf16: 8 lanes/key, 4 keys per warp);
//       key group kg = warp * KPW + lane / LPK reads keys tile + j * KPG + kg, j < 4 (each a 16-byte-aligned
//       row of D elements in its slot). K and V of the tile are loaded together so both DRAM round trips
//       overlap, and the block-table entries of the next tile are fetched while this one is scored.
//     - scores: per-lane partial dot products (q from smem), reduced over the LPK lanes with xor shuffles.
//     - each warp keeps its own online softmax (running max m, sum l per head; shuffles over its key groups),
//       so the tile loop has no barrier: p = 2^(s - m_new), acc = acc * 2^(m_old - m_new) + sum p * v.
//   At the end the lanes' partial sums are added (shuffles), and the 4 warps merged through smem, each rescaled
//   from its own max to the block's (decode_split.cuh, shared with the tensor-core kernel decode_attention_tc.cu).
//   - one non-empty split (a short sequence: the common decode case): that block normalises into out directly;
//   - several: each writes its partial to the workspace and counts itself done; the last one merges them all
//     (weights 2^(m_s - m_max) / sum_s(l_s 2^(m_s - m_max))) into out. No second kernel, so no second launch
//     per layer (it used to cost ~2-3 us a layer in a batch-1 decode step).
#include "dtype.cuh"
#include "pdl.cuh"
#include "decode_split.cuh"

constexpr int MAXG = 8;        // q heads per block; a larger GQA group is spread over several blocks
constexpr int KPT = 4;         // keys per thread per tile
template <typename T, int D>
struct Shape {
    static constexpr int VEC = 16 / sizeof(T);      // elements per 16-byte chunk
    static constexpr int CH = D / VEC;              // chunks per key row
    static constexpr int LPK = CH < 32 ? CH : 32;   // lanes per key row
    static constexpr int NV = CH / LPK;             // chunks per lane per key (2 only for fp32 D=256)
    static constexpr int KPW = 32 / LPK;            // keys per warp step
    static constexpr int KPG = 4 * KPW;             // key groups in the block = keys per block step
    static constexpr int KT = KPG * KPT;            // keys per tile (64 for D=64 bf16)
    static_assert(D % VEC == 0 && (CH <= 32 ? 32 % CH == 0 : CH % 32 == 0), "unsupported head dim");
};

// Cache slot of key `key` through one block-table row; the block id is clamped to the cache.
__device__ __forceinline__ int key_slot(const int* table, int key, int block_size, int num_blocks) {
    const unsigned blk = min((unsigned)table[key / block_size], (unsigned)num_blocks - 1u);
    return (int)blk * block_size + key % block_size;
}

// (128, 3): caps registers at 170 so 3 blocks fit per SM; with the plain bound ptxas picked a small spill for fp32.
template <typename T, int D>
__global__ void __launch_bounds__(128, 3)
decode_attention(const T* __restrict__ q, const T* k_cache, const T* v_cache,
                 const int* __restrict__ block_tables, const int* __restrict__ seq_lens, int block_size, int M,
                 int num_blocks, float scale_log2, int Hq, int Hkv, int n_splits, float* __restrict__ ws_ml,
                 float* __restrict__ ws_acc, unsigned* __restrict__ counters, T* __restrict__ out) {
    pdl_enter();  // (pdl.cuh) a no-op unless launched with PDL
    using Sh = Shape<T, D>;
    constexpr int VEC = Sh::VEC, LPK = Sh::LPK, NV = Sh::NV, KPW = Sh::KPW, KPG = Sh::KPG, KT = Sh::KT;
    constexpr int X = NV * VEC;                        // output dims per lane
    // The wrapper picks how many blocks share a GQA group (grid.x = Hkv * n_hg): each takes gpb <= MAXG heads.
    const int G = Hq / Hkv, n_hg = gridDim.x / Hkv, gpb = min(MAXG, (G + n_hg - 1) / n_hg);
    const int kvh = blockIdx.x / n_hg, hg = blockIdx.x % n_hg;
    const int h0 = kvh * G + hg * gpb;                 // first q head of this block
    const int Gb = min(gpb, G - hg * gpb);             // q heads in this block (uniform: guards never diverge)
    if (Gb <= 0) return;                               // a spare block (the wrapper launches none)
    const int split = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int slice = lane % LPK;                      // this lane reads chunks slice, slice + LPK, ... of a row
    const int kg = warp * KPW + lane / LPK;            // key group: keys tile + j * KPG + kg

    __shared__ __align__(16) float s_q[MAXG][D];       // q, pre-scaled by scale * log2(e): exp2f gives softmax
    __shared__ float s_m[4][MAXG], s_l[4][MAXG];       // per-warp running max / sum, merged at the end
    __shared__ float s_red[4][MAXG][D];                // per-warp accumulators, merged at the end
    __shared__ bool s_last;                            // finish_decode_block's flag (last: see there)
    const int length = seq_length(seq_lens, b, M * block_size);
    if (length == 0) {  // a padding row: zeros, not 0/0 (written by split 0)
        if (split == 0)
            for (int i = tid; i < Gb * D; i += blockDim.x) out[((size_t)b * Hq + h0) * D + i] = from_f32<T>(0.0f);
        return;
    }
    // A sequence of up to 2 tiles is swept by one block; longer ones are split into tiles. Measured on the H200
    // (Qwen2.5-0.5B, batch 1, a layer): a second split's merge (workspace, fence, counter, second pass) costs ~2.3 us,
    // a block's second tile ~1 us. So two tiles in one block beat two splits and a merge, and past that one-tile
    // splits (the merge paid once) beat longer ones. (cuda_kernels.py's DECODE_ONE_SPLIT_TILES)
    const int chunk = split_chunk(length, n_splits, KT, 2);
    const int n_active = (length + chunk - 1) / chunk;  // the non-empty splits
    const int k_begin = split * chunk, k_end = min(k_begin + chunk, length);
    if (k_begin >= k_end) return;  // nothing here (the merge reads only the non-empty splits)
    const int* table = block_tables + (size_t)b * M;
    // Slots of this lane's keys in the first tile; inside the loop the next tile's are fetched one tile ahead.
    int slot[KPT];
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int key = k_begin + j * KPG + kg;
        slot[j] = key < k_end ? key_slot(table, key, block_size, num_blocks) : 0;
    }
    const T* qb = q + ((size_t)b * Hq + h0) * D;  // issued while the block-table loads are in flight
    for (int i = tid; i < Gb * D; i += blockDim.x) s_q[i / D][i % D] = to_f32(qb[i]) * scale_log2;
    __syncthreads();  // s_q ready

    // Each warp runs its own online softmax over its own keys (no barrier inside the loop): running max m and
    // sum l per head (the same in every lane), and per lane the unnormalised output for its X dims.
    float m[MAXG], l[MAXG], acc[MAXG][X];
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        m[g] = NEG_INF; l[g] = 0.0f;
#pragma unroll
        for (int x = 0; x < X; x++) acc[g][x] = 0.0f;
    }
    const T* kb = k_cache + (size_t)kvh * D;  // key row of slot s: kb + s * Hkv * D
    const T* vb = v_cache + (size_t)kvh * D;
    for (int kt0 = k_begin; kt0 < k_end; kt0 += KT) {
        // K and V of the tile are loaded together, so both DRAM round trips overlap.
        Chunk<T> kc[KPT][NV], vc[KPT][NV];
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int key = kt0 + j * KPG + kg;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                kc[j][v].u = vc[j][v].u = make_uint4(0, 0, 0, 0);  // keys past the chunk: zeros, never NaN
                if (key < k_end) {
                    const size_t off = (size_t)slot[j] * Hkv * D + (v * LPK + slice) * VEC;
                    kc[j][v].u = *reinterpret_cast<const uint4*>(kb + off);
                    vc[j][v].u = *reinterpret_cast<const uint4*>(vb + off);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < KPT; j++) {  // next tile's slots: their table loads overlap this tile's math
            const int key = kt0 + KT + j * KPG + kg;
            slot[j] = key < k_end ? key_slot(table, key, block_size, num_blocks) : 0;
        }
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g >= Gb) continue;  // uniform across the block
            float qv[X];
#pragma unroll
            for (int v = 0; v < NV; v++)
#pragma unroll
                for (int e = 0; e < VEC; e++) qv[v * VEC + e] = s_q[g][(v * LPK + slice) * VEC + e];
            // Scores of this lane's KPT keys; the LPK lanes of a key sum their partial dots with xor shuffles.
            float sc[KPT], mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < KPT; j++) {
                float d = 0.0f;
#pragma unroll
                for (int v = 0; v < NV; v++)
#pragma unroll
                    for (int e = 0; e < VEC; e++) d += qv[v * VEC + e] * to_f32(kc[j][v].e[e]);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                sc[j] = kt0 + j * KPG + kg < k_end ? d : NEG_INF;
                mx = fmaxf(mx, sc[j]);
            }
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));  // warp max
            // A warp may have seen no valid key yet (m_new = -inf): subtract 0 then, so every exp2 is of -inf
            // (= 0) and nothing becomes NaN.
            const float m_new = fmaxf(m[g], mx), base = m_new == NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m[g] - base);
            float ps = 0.0f;
#pragma unroll
            for (int j = 0; j < KPT; j++) { sc[j] = exp2f(sc[j] - base); ps += sc[j]; }
#pragma unroll
            // Sum over the warp's key groups (lanes of equal slice): each key is counted once.
            for (int o = LPK; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[g] = l[g] * alpha + ps;
            m[g] = m_new;
#pragma unroll
            for (int x = 0; x < X; x++) {
                float a = acc[g][x] * alpha;
#pragma unroll
                for (int j = 0; j < KPT; j++) a += sc[j] * to_f32(vc[j][x / VEC].e[x % VEC]);
                acc[g][x] = a;
            }
        }
    }

    // Merge: lanes with the same slice hold different keys (add them), then the 4 warps through smem, each
    // rescaled from its own max to the block max.
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g >= Gb) continue;
#pragma unroll
        for (int x = 0; x < X; x++)
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1) acc[g][x] += __shfl_xor_sync(0xffffffffu, acc[g][x], o);
        if (lane < LPK)
#pragma unroll
            for (int v = 0; v < NV; v++)
#pragma unroll
                for (int e = 0; e < VEC; e++) s_red[warp][g][(v * LPK + slice) * VEC + e] = acc[g][v * VEC + e];
        if (lane == 0) { s_m[warp][g] = m[g]; s_l[warp][g] = l[g]; }
    }
    __syncthreads();
    finish_decode_block<T, D, MAXG>(s_red, s_m, s_l, Gb, b, h0, Hq, split, n_splits, n_active, ws_ml, ws_acc,
                                    counters, out, s_last);
}

#define ONE_D(T, D)                                                                                            \
    template __global__ void decode_attention<T, D>(const T*, const T*, const T*, const int*, const int*, int, int,  \
                                                    int, float, int, int, int, float*, float*, unsigned*, T*);
// Small head dims (8-32) are for tiny test models (tests/fixtures, stories260K); 64-256 for real ones.
#define ALL_D(T) ONE_D(T, 8) ONE_D(T, 16) ONE_D(T, 32) ONE_D(T, 64) ONE_D(T, 128) ONE_D(T, 256)
ALL_D(float) ALL_D(__half) ALL_D(__nv_bfloat16)
