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

// A block's part of a decode step (both kernels): q heads h0..h0+Gb-1 of kv head kvh (gridDim.x / Hkv blocks share a
// GQA group), sequence b, and the keys k_begin..k_end-1 of its split, n_active of the sequence's splits holding keys.
struct DtBlock {
    int kvh, h0, Gb, b, split, length, n_active, k_begin, k_end;
};

// Fills w; false where the block has nothing to do, before any barrier: a spare block (the wrapper launches none),
// an empty split (the merge reads only the non-empty ones), or a padding row (length 0), whose output split 0 writes
// as zeros, not 0/0. The length is staged before the step, so it is read before the PDL wait.
template <typename T, int D>
__device__ __forceinline__ bool dt_block(DtBlock& w, const int* seq_lens, int block_size, int M, int Hq, int Hkv,
                                         int n_splits, T* out) {
    const int G = Hq / Hkv, n_hg = gridDim.x / Hkv, gpb = min(DT_ROWS, (G + n_hg - 1) / n_hg), hg = blockIdx.x % n_hg;
    w.kvh = blockIdx.x / n_hg;
    w.h0 = w.kvh * G + hg * gpb;
    w.Gb = min(gpb, G - hg * gpb);
    w.split = blockIdx.y;
    w.b = blockIdx.z;
    if (w.Gb <= 0) return false;
    w.length = seq_length(seq_lens, w.b, M * block_size);
    if (w.length == 0) {
        pdl_enter();
        if (w.split == 0)
            for (int i = threadIdx.x; i < w.Gb * D; i += blockDim.x)
                out[((size_t)w.b * Hq + w.h0) * D + i] = from_f32<T>(0.0f);
        return false;
    }
    // A sequence of up to 4 tiles is one split (no merge). A tile here costs a few mma a warp and its loads overlap
    // the previous tile's math, so a block sweeps more tiles than the CUDA-core kernel's 2 before a merge pays off
    // (4 against 2: experiments/logs/decode_tc_one_split_ab.log). (cuda_kernels.py's TC_ONE_SPLIT_TILES)
    const int chunk = split_chunk(w.length, n_splits, DT_KT, 4);
    w.n_active = (w.length + chunk - 1) / chunk;
    w.k_begin = w.split * chunk;
    w.k_end = min(w.k_begin + chunk, w.length);
    return w.k_begin < w.k_end;
}

// After the PDL wait: the block's q rows into Qs (rows past Gb: zeros) and the step's new key's K/V row, where it falls
// in one of the first `early` tiles (those loaded before the wait, the row skipped; in a later tile the loop loads
// it). D / 8 chunks of K, then of V (new_row >= 0: the key is in this split, so its slot is >= 0).
template <typename T, int D, int LD>
__device__ __forceinline__ void load_q_and_new_key(T* Qs, T* Ks, T* Vs, const T* qb, int Gb, const T* kb,
                                                   const T* vb, const int (*slots)[DT_KT], size_t kv_stride,
                                                   int new_row, int early) {
    const int tid = threadIdx.x;
    for (int i = tid; i < DT_ROWS * D / 8; i += blockDim.x) {
        const int r = i / (D / 8), col = (i % (D / 8)) * 8;
        cp_async16(Qs + r * LD + col, qb + (size_t)min(r, Gb - 1) * D + col, r < Gb);
    }
    if (new_row >= 0 && new_row < early * DT_KT && tid < D / 4) {
        const int col = (tid % (D / 8)) * 8, t = new_row / DT_KT, r = new_row % DT_KT;
        const size_t off = (size_t)slots[t][r] * kv_stride + col;
        cp_async16((tid < D / 8 ? Ks : Vs) + t * DT_KT * LD + r * LD + col, (tid < D / 8 ? kb : vb) + off, true);
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

// The end of a block: the 4 warps' partials (o, m, l of rows g and g + 8) meet in shared memory over the dead K/V
// buffers (every warp is past the loop's last barrier): row sums across the quad, then red[warp][head][d] for the
// heads of this block; decode_split.cuh's finish_decode_block merges the warps, and the splits.
template <typename T, int D>
__device__ __forceinline__ void finish_tc_block(const float (&o)[D / 8][4], float m0, float m1, float l0, float l1,
                                                void* kv_smem, float (*s_m)[DT_ROWS], float (*s_l)[DT_ROWS], int Gb,
                                                int b, int h0, int Hq, int split, int n_splits, int n_active,
                                                float* __restrict__ ws_ml, float* __restrict__ ws_acc,
                                                unsigned* __restrict__ counters, T* __restrict__ out, bool& s_last) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = lane & 3, g = lane >> 2;
    float (*red)[DT_ROWS][D] = reinterpret_cast<float (*)[DT_ROWS][D]>(kv_smem);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
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
                                       counters, out, s_last);
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

    DtBlock w;
    if (!dt_block<T, D>(w, seq_lens, block_size, M, Hq, Hkv, n_splits, out)) return;
    const int Gb = w.Gb, h0 = w.h0, kvh = w.kvh, b = w.b, split = w.split, length = w.length;
    const int n_active = w.n_active, k_begin = w.k_begin, k_end = w.k_end;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, c = lane & 3;
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
    load_q_and_new_key<T, D, LD>(Qs, Ks, Vs, q + ((size_t)b * Hq + h0) * D, Gb, kb, vb, s_slot, kv_stride, new_row, 2);
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

    finish_tc_block<T, D>(o, m0, m1, l0, l1, Ks, s_m, s_l, Gb, b, h0, Hq, split, n_splits, n_active, ws_ml, ws_acc,
                          counters, out, dt_last);
}

// ---- Long contexts: decode_attention_tc_stream ---------------------------------------------------------------------
// Why: at 2K-8K keys decode attention is K/V bytes, and the kernel above keeps about one 64-key tile in flight a
// block (load tile j + 1, wait, use tile j; two barriers a tile). Here a split streams its tiles through a ring of
// NS buffers: NS - 1 tiles are in flight while one is used, with one barrier a tile. NS = 4 at D = 64 (76 KB of
// shared memory: 2 blocks an SM, 6 tiles = 96 KB in flight), 3 at D = 128 (109 KB: 2 blocks, 4 tiles = 128 KB).
// The plan (toolkit/model/plan.py) sends a decode step here where its context bucket is long; the split count
// comes from cuda_kernels.py's stream_splits: a wave of blocks at most (the merge reads every split's partial in one
// block). Alone on the H200 it took 44 against 55 us at batch 128 x 2,048 keys (Qwen2.5-0.5B heads), 11.5 against
// 14.6 at batch 1 x 8,192 (dev/decode_attention_long.py; decode_stream_pays in plan.py has the rest).
// The arithmetic a tile is the kernel above's: warp w takes keys 16w..16w+15 of every tile (no 2-tile pass).
__host__ __device__ constexpr int dt_stream_stages(int D) { return D == 64 ? 4 : 3; }

template <typename T, int D>
__global__ void __launch_bounds__(128, 2)
decode_attention_tc_stream(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                           const int* __restrict__ block_tables, const int* __restrict__ seq_lens, int block_size,
                           int M, int num_blocks, float scale_log2, int Hq, int Hkv, int n_splits,
                           float* __restrict__ ws_ml, float* __restrict__ ws_acc, unsigned* __restrict__ counters,
                           T* __restrict__ out) {
    __shared__ bool dt_last;
    constexpr int NS = dt_stream_stages(D), LD = D + 8, TILE = DT_KT * LD;
    extern __shared__ __align__(16) unsigned char dt_smem[];
    T* Qs = reinterpret_cast<T*>(dt_smem);  // [16][LD]
    T* Ks = Qs + DT_ROWS * LD;              // [NS][64][LD]
    T* Vs = Ks + NS * TILE;                 // [NS][64][LD]
    static_assert(4 * DT_ROWS * D * 4 <= 2 * NS * TILE * (int)sizeof(T), "the partials must fit over the K/V tiles");
    __shared__ float s_m[4][DT_ROWS], s_l[4][DT_ROWS];
    __shared__ int s_slot[NS][DT_KT];  // slots of the tile each buffer holds or is about to

    DtBlock w;
    if (!dt_block<T, D>(w, seq_lens, block_size, M, Hq, Hkv, n_splits, out)) return;
    const int Gb = w.Gb, h0 = w.h0, kvh = w.kvh, b = w.b, split = w.split, length = w.length;
    const int n_active = w.n_active, k_begin = w.k_begin, k_end = w.k_end;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, c = lane & 3;
    const int n_kt = (k_end - k_begin + DT_KT - 1) / DT_KT;
    const int* table = block_tables + (size_t)b * M;
    const size_t kv_stride = (size_t)Hkv * D;
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Before the PDL wait (as in the kernel above): tiles 0..NS-2, but for the new key's row, one cp.async group each.
    const int new_row = k_end == length ? length - 1 - k_begin : -1;
    if (tid < DT_KT)
#pragma unroll
        for (int t = 0; t < NS - 1; t++)
            s_slot[t][tid] = tile_slot(table, k_begin + t * DT_KT + tid, k_end, block_size, num_blocks);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NS - 1; t++) {
        if (t < n_kt) {
            load_tile_rows<T, D, LD>(Ks + t * TILE, kb, s_slot[t], kv_stride, new_row - t * DT_KT);
            load_tile_rows<T, D, LD>(Vs + t * TILE, vb, s_slot[t], kv_stride, new_row - t * DT_KT);
        }
        cp_async_commit();
    }
    pdl_enter();
    load_q_and_new_key<T, D, LD>(Qs, Ks, Vs, q + ((size_t)b * Hq + h0) * D, Gb, kb, vb, s_slot, kv_stride, new_row,
                                 NS - 1);
    cp_async_commit();

    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int j = 0; j < n_kt; j++) {
        // The slots of tile j + NS - 1, into the slot row of tile j - 1 (issued long ago; at j = 0 the unused last
        // row): the table read flies while tile j's bytes land. The tile's loads go into tile j - 1's buffer, once
        // the barrier below says every warp is done with it.
        const int ahead = j + NS - 1, slot_buf = ahead % NS;
        const int next_slot =
            tid < DT_KT ? tile_slot(table, k_begin + ahead * DT_KT + tid, k_end, block_size, num_blocks) : -1;
        // cp.async groups: tiles 0..NS-2 (the prologue), the q group, then one an iteration (tile j + NS - 1). At
        // j = 0 the q group is the youngest: wait for all; after, tile j is complete once at most NS - 2 are pending.
        if (j == 0) cp_async_wait<0>(); else cp_async_wait<NS - 2>();
        if (tid < DT_KT) s_slot[slot_buf][tid] = next_slot;
        __syncthreads();  // tile j landed for every thread; every warp is done with tile j - 1's buffer
        if (ahead < n_kt) {
            load_slot_rows<T, D, LD, DT_KT>(Ks + slot_buf * TILE, kb, s_slot[slot_buf], kv_stride);
            load_slot_rows<T, D, LD, DT_KT>(Vs + slot_buf * TILE, vb, s_slot[slot_buf], kv_stride);
        }
        cp_async_commit();  // (an empty group past the last tile keeps the count)
        const int buf = j % NS, k0 = k_begin + j * DT_KT + warp * 16;
        float s[2][4];
        qk_tile<T, D, 16, LD>(s, Qs, Ks + buf * TILE + warp * 16 * LD, 0, lane);
        float mx0, mx1;
        scale_mask(s, k0, c, k_end, scale_log2, mx0, mx1);
        softmax_tile<D, 16, true>(s, mx0, mx1, m0, m1, l0, l1, o);
        pv_tile<T, D, 16, LD>(o, s, Vs + buf * TILE + warp * 16 * LD, lane);
    }
    __syncthreads();  // every warp is done with the buffers before the partials overwrite them
    finish_tc_block<T, D>(o, m0, m1, l0, l1, Ks, s_m, s_l, Gb, b, h0, Hq, split, n_splits, n_active, ws_ml, ws_acc,
                          counters, out, dt_last);
}

#define DT_INSTANCE(T, D)                                                                                     \
    template __global__ void decode_attention_tc<T, D>(const T*, const T*, const T*, const int*, const int*, int, \
                                                       int, int, float, int, int, int, float*, float*, unsigned*, \
                                                       T*);                                            \
    template __global__ void decode_attention_tc_stream<T, D>(const T*, const T*, const T*, const int*, const int*,   \
                                                              int, int, int, float, int, int, int, float*, float*,     \
                                                              unsigned*, T*);
DT_INSTANCE(__half, 64) DT_INSTANCE(__half, 128) DT_INSTANCE(__nv_bfloat16, 64) DT_INSTANCE(__nv_bfloat16, 128)
