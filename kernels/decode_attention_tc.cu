// decode_attention_tc.cu -- decode_attention.cu's op on tensor cores: a decode step of B sequences, each new query
// per head attending keys 0..len_b-1 of the paged KV cache (same layout, arguments, splits and workspace; read that
// file's header first). For 16-bit T and D in {64, 128} and GQA groups of up to 16 heads; the step plan
// (toolkit/model/plan.py) sends a decode step here where it pays (a big batch or a long context).
//
// Why: the CUDA-core kernel scores a key tile one q head after another, each a chain of dot products, shuffles,
// exp2 and V sums, so a block of 7 heads (a GQA group of Qwen2.5) spent its time on that chain, not on bytes: at
// batch 32 and a context of 1 to 129 keys, decode attention was ~160-300 us of a ~1 ms step
// (experiments/NOTEBOOK.md, "Does decode attention at batch 32 pay on tensor cores?"). Here the heads of a GQA group
// are the rows of one mma.m16n8k16 A tile ("GQA packing"): a tile of 64 keys is S = Q K^T (16 heads x 64 keys,
// 4 warps x 16 keys) and O += P V, a few mma instructions a warp instead of 7 chains.
//
// One kernel (decode_attention_tc<T, D>): grid (Hkv * n_hg, n_splits, B), block 128 (4 warps), dynamic shared
// memory (16 + 4 * 64) * (D + 8) * sizeof(T) (39 KB at D = 64).
//   - A block owns gpb = ceil(G / n_hg) <= 16 q heads of one GQA group of one sequence (rows gpb..15 of the A tile
//     are zeros and never stored) and one split of its keys (decode_split.cuh; one split up to 4 tiles).
//   - K/V tiles of 64 keys are gathered through the block table into shared memory with cp.async (each 16-byte
//     chunk from its row's slot; keys past the split are zero-filled) and double-buffered: tile j + 1 loads while
//     tile j is used, and the block-table entries of tile j + 2 are read meanwhile. Tiles 0 and 1, but for the
//     step's new key, start loading before the PDL wait (see the kernel).
//   - Warp w scores keys 16w..16w+15 of a tile for all heads (mma.cuh's qk_tile, softmax_tile, pv_tile: the
//     FlashAttention-2 steps of kernels/prefill_attention.cu, on a 16-key slice) with its own online softmax, so
//     the 4 warps split the keys the way the CUDA-core kernel's do; at the end their partials meet in shared
//     memory (over the dead K/V buffers) and decode_split.cuh's finish_decode_block merges them, and the splits.
//   - A split of exactly 2 tiles is one pass over 128 keys instead: warp w takes keys 32w..32w+31.
// Numerics: scores and sums in fp32, P rounded to T for the P V product (as in prefill_attention_tc), so it
// matches the fp32 CPU twin (kernels/decode_attention.py) to bf16 rounding, not bit for bit.
#include "dtype.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "decode_split.cuh"

constexpr int DT_ROWS = 16;  // q heads a block: the A tile's rows
constexpr int DT_KT = 64;    // keys a tile: 16 a warp
// Cache slot of key `key` through one block-table row, or -1 (a zero-filled row) at or past `end`; the block id is
// clamped to the cache.
__device__ __forceinline__ int tile_slot(const int* table, int key, int end, int block_size, int num_blocks) {
    if (key >= end) return -1;
    const unsigned blk = min((unsigned)table[key / block_size], (unsigned)num_blocks - 1u);
    return (int)blk * block_size + key % block_size;
}

// A K or V tile gathered into smem as mma.cuh's load_slot_rows does (128 threads; slot -1: a zero row), except
// row `skip`, which is not copied at all (it is loaded after the wait; two copies to one row would race).
template <typename T, int D, int LD>
__device__ __forceinline__ void load_tile_rows(T* dst, const T* base, const int* slots, size_t stride, int skip) {
    constexpr int CPR = D / 8;  // 16-byte chunks a row
#pragma unroll
    for (int i = 0; i < DT_KT * CPR / 128; i++) {
        const int c = threadIdx.x + i * 128, r = c / CPR, col = (c % CPR) * 8, slot = slots[r];
        if (r != skip) cp_async16(dst + r * LD + col, base + (slot >= 0 ? (size_t)slot * stride : 0) + col, slot >= 0);
    }
}

// S = Q K^T to log2 units, keys at or past k_end masked to -inf (their K/V rows are zeros); mx0, mx1: this
// thread's maxima of its two rows (heads g, g + 8). NT n-tiles of 8 keys from key k0 (this warp's first); c = lane % 4.
template <int NT>
__device__ __forceinline__ void scale_mask(float (&s)[NT][4], int k0, int c, int k_end, float scale_log2, float& mx0,
                                           float& mx1) {
    mx0 = mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float v = k0 + n * 8 + 2 * c + (e & 1) < k_end ? s[n][e] * scale_log2 : NEG_INF;
            s[n][e] = v;
            if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
}

// (128, 2) gives 111 registers at D = 64 (163 at 128); the plain bound gives 96 (155) and was slower in the
// batch-32 step: 92.8 against 77.3 us at 1 key (experiments/logs/decode_launch_bounds_ab.log).
template <typename T, int D>
__global__ void __launch_bounds__(128, 2)
decode_attention_tc(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, int block_size, int M,
                    int num_blocks, float scale_log2, int Hq, int Hkv, int n_splits, float* __restrict__ ws_ml,
                    float* __restrict__ ws_acc, unsigned* __restrict__ counters, T* __restrict__ out) {
    __shared__ bool dt_last;  // finish_decode_block's flag (first: see there)
    // Rows padded by 8 elements: the 8 row addresses of one ldmatrix fall in 8 different 16-byte bank groups.
    constexpr int LD = D + 8, TILE = DT_KT * LD;
    extern __shared__ __align__(16) unsigned char dt_smem[];
    T* Qs = reinterpret_cast<T*>(dt_smem);  // [16][LD]
    T* Ks = Qs + DT_ROWS * LD;              // [2][64][LD]
    T* Vs = Ks + 2 * TILE;                  // [2][64][LD]
    static_assert(4 * DT_ROWS * D * 4 <= 4 * TILE * (int)sizeof(T), "the partials must fit over the K/V tiles");
    __shared__ float s_m[4][DT_ROWS], s_l[4][DT_ROWS];
    __shared__ int s_slot[2][DT_KT];  // cache slots of the keys of the next tiles (-1: none)

    const int G = Hq / Hkv, n_hg = gridDim.x / Hkv, gpb = min(DT_ROWS, (G + n_hg - 1) / n_hg);
    const int kvh = blockIdx.x / n_hg, hg = blockIdx.x % n_hg;
    const int h0 = kvh * G + hg * gpb;      // first q head of this block
    const int Gb = min(gpb, G - hg * gpb);  // q heads in this block
    if (Gb <= 0) return;                    // a spare block (the wrapper launches none)
    const int split = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, c = lane & 3;
    const int length = seq_length(seq_lens, b, M * block_size);  // staged before the step: read before the wait
    if (length == 0) {  // a padding row: zeros, not 0/0 (written by split 0)
        pdl_enter();
        if (split == 0)
            for (int i = tid; i < Gb * D; i += blockDim.x) out[((size_t)b * Hq + h0) * D + i] = from_f32<T>(0.0f);
        return;
    }
    // A sequence of up to 4 tiles is one split (no merge). A tile here costs a few mma a warp and its loads overlap
    // the previous tile's math, so a block sweeps more tiles than the CUDA-core kernel's 2 before a merge pays off
    // (4 against 2: experiments/logs/decode_tc_one_split_ab.log). (cuda_kernels.py's TC_ONE_SPLIT_TILES)
    const int chunk = split_chunk(length, n_splits, DT_KT, 4);
    const int n_active = (length + chunk - 1) / chunk;  // the non-empty splits
    const int k_begin = split * chunk, k_end = min(k_begin + chunk, length);
    if (k_begin >= k_end) return;  // nothing here (the merge reads only the non-empty splits); before any barrier
    const int n_kt = (k_end - k_begin + DT_KT - 1) / DT_KT;
    const int* table = block_tables + (size_t)b * M;
    const size_t kv_stride = (size_t)Hkv * D;  // between the rows of consecutive slots
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Before the wait (PDL): what the previous kernels of this step cannot have written. The block tables and
    // lengths are staged before the step, and the cache rows of keys 0..length-2 were written by earlier steps:
    // in a pure decode step (the only one launched with PDL) rope_qkv (or gemm_skinny_rope's qkv projection)
    // writes just each sequence's new key, length - 1, into its sequence's own last block. So the slots of tiles
    // 0 and 1 are read, and both tiles' K/V rows but the new key's start loading, while the previous kernel still
    // runs: a sequence of up to 2 tiles then waits for no K/V load after the wait but the new key's. (Against
    // loading tile 1 in the loop, after the wait: decode attention at batch 32 took 100.8 against 109.5 us a step
    // at 65 keys, 142.6 against 153.6 at 129, 184.0 against 199.4 at 256; experiments/logs/
    // decode_tc_early_tile1_ab.log.)
    // The new key's row counted from tile 0's first; -1 where it is not in this split (a split ends before it: then
    // its tile-1 rows past k_end are zero-filled like any other, none skipped).
    const int new_row = k_end == length ? length - 1 - k_begin : -1;
    if (tid < DT_KT) {
        s_slot[0][tid] = tile_slot(table, k_begin + tid, k_end, block_size, num_blocks);
        s_slot[1][tid] = tile_slot(table, k_begin + DT_KT + tid, k_end, block_size, num_blocks);
    }
    __syncthreads();
    load_tile_rows<T, D, LD>(Ks, kb, s_slot[0], kv_stride, new_row);
    load_tile_rows<T, D, LD>(Vs, vb, s_slot[0], kv_stride, new_row);
    if (n_kt > 1) {
        load_tile_rows<T, D, LD>(Ks + TILE, kb, s_slot[1], kv_stride, new_row - DT_KT);
        load_tile_rows<T, D, LD>(Vs + TILE, vb, s_slot[1], kv_stride, new_row - DT_KT);
    }
    cp_async_commit();
    pdl_enter();  // (pdl.cuh) q and the new key come from the previous kernels; a no-op unless launched with PDL
    // After it: the q rows (heads past Gb: zeros) and the new key's K/V row, one more cp.async group.
    const T* qb = q + ((size_t)b * Hq + h0) * D;
    for (int i = tid; i < DT_ROWS * D / 8; i += blockDim.x) {
        const int r = i / (D / 8), col = (i % (D / 8)) * 8;
        cp_async16(Qs + r * LD + col, qb + (size_t)min(r, Gb - 1) * D + col, r < Gb);
    }
    // The new key's row, where it falls in tile 0 or 1 (in a later tile the loop loads it, after the wait).
    // D / 8 chunks of K, then of V (new_row >= 0: the key is in this split, so its slot is >= 0).
    if (new_row >= 0 && new_row < 2 * DT_KT && tid < D / 4) {
        const int col = (tid % (D / 8)) * 8, t = new_row / DT_KT, r = new_row % DT_KT;
        const size_t off = (size_t)s_slot[t][r] * kv_stride + col;
        cp_async16((tid < D / 8 ? Ks : Vs) + t * TILE + r * LD + col, (tid < D / 8 ? kb : vb) + off, true);
    }
    cp_async_commit();

    float o[D / 8][4];  // this warp's O: rows (heads) g and g + 8 of each thread, D / 8 n-tiles
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // l: this thread's partial row sums
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    if (n_kt == 2) {
        // Both tiles are in flight already (before the wait, above): one pass over their 128 keys, warp w taking
        // keys 32w..32w+31 (the two buffers are adjacent, so keys 0..127 are rows 0..127 of Ks and Vs). One
        // online-softmax step, one wait and one barrier pair instead of two: tile after tile, the second tile cost
        // 1.4-1.6 us a layer (another wait, barrier pair, max reduction and rescale of O), and the batch-32 step at
        // 65 keys took 773.2 against 763.3 us in one pass (experiments/logs/decode_pair_ab.log).
        cp_async_wait<0>();
        __syncthreads();
        const int k0 = k_begin + warp * 32;
        float s[4][4];  // S: 16 heads x this warp's 32 keys = 4 n-tiles
        qk_tile<T, D, 32, LD>(s, Qs, Ks + warp * 32 * LD, 0, lane);
        float mx0, mx1;
        scale_mask(s, k0, c, k_end, scale_log2, mx0, mx1);
        softmax_tile<D, 32, true>(s, mx0, mx1, m0, m1, l0, l1, o);  // (warp 3 may see no key: length < 97)
        pv_tile<T, D, 32, LD>(o, s, Vs + warp * 32 * LD, lane);
        __syncthreads();  // every warp is done with the K/V buffers before the partials overwrite them
    } else {  // tile after tile
        for (int j = 0; j < n_kt; j++) {
            const int buf = j & 1, k0 = k_begin + j * DT_KT + warp * 16;  // k0: this warp's first key of the tile
            // The next tile into the other buffer while this one is used (tile 1: before the wait, above).
            if (j >= 1 && j + 1 < n_kt) {
                load_slot_rows<T, D, LD, DT_KT>(Ks + (buf ^ 1) * TILE, kb, s_slot[buf ^ 1], kv_stride);
                load_slot_rows<T, D, LD, DT_KT>(Vs + (buf ^ 1) * TILE, vb, s_slot[buf ^ 1], kv_stride);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            // Slots of tile j + 2: the table loads fly during this tile's math; stored into s_slot[buf] (tile j's,
            // already used) after the barrier below.
            const int next_slot =
                tid < DT_KT ? tile_slot(table, k_begin + (j + 2) * DT_KT + tid, k_end, block_size, num_blocks) : -1;
            __syncthreads();
            const T* Kt = Ks + buf * TILE + warp * 16 * LD;
            const T* Vt = Vs + buf * TILE + warp * 16 * LD;
            float s[2][4];  // S = Q K^T: 16 heads x this warp's 16 keys = 2 n-tiles
            qk_tile<T, D, 16, LD>(s, Qs, Kt, 0, lane);
            float mx0, mx1;
            scale_mask(s, k0, c, k_end, scale_log2, mx0, mx1);
            // EMPTY: a warp's slice may hold no valid key yet (a split's last, partial tile).
            softmax_tile<D, 16, true>(s, mx0, mx1, m0, m1, l0, l1, o);
            pv_tile<T, D, 16, LD>(o, s, Vt, lane);
            if (tid < DT_KT) s_slot[buf][tid] = next_slot;
            __syncthreads();  // everyone is done with this buffer before the next iteration refills it
        }
    }

    // The warps' partials over the K/V buffers (every warp is past the loop's last barrier): row sums across
    // the quad, then red[warp][head][d] for the heads of this block.
    float (*red)[DT_ROWS][D] = reinterpret_cast<float (*)[DT_ROWS][D]>(Ks);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int g = lane >> 2;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        const int d = 8 * n + 2 * c;
        if (g < Gb) { red[warp][g][d] = o[n][0]; red[warp][g][d + 1] = o[n][1]; }
        if (g + 8 < Gb) { red[warp][g + 8][d] = o[n][2]; red[warp][g + 8][d + 1] = o[n][3]; }
    }
    if (c == 0) {
        s_m[warp][g] = m0; s_l[warp][g] = l0;
        s_m[warp][g + 8] = m1; s_l[warp][g + 8] = l1;
    }
    __syncthreads();
    finish_decode_block<T, D, DT_ROWS>(red, s_m, s_l, Gb, b, h0, Hq, split, n_splits, n_active, ws_ml, ws_acc,
                                       counters, out, dt_last);
}

#define DT_INSTANCE(T, D)                                                                                     \
    template __global__ void decode_attention_tc<T, D>(const T*, const T*, const T*, const int*, const int*, int, \
                                                       int, int, float, int, int, int, float*, float*, unsigned*, \
                                                       T*);
DT_INSTANCE(__half, 64) DT_INSTANCE(__half, 128) DT_INSTANCE(__nv_bfloat16, 64) DT_INSTANCE(__nv_bfloat16, 128)
