// prefill_attention.cu -- causal attention of the new tokens of B sequences over the paged KV cache, with
// online softmax (never a [T, T] matrix). Sequence b owns the flat rows qs..qs+n-1 of q and out
// (qs = query_start_loc[b], n = query_start_loc[b+1] - qs); its query i sits at position p = len - n + i
// (len = seq_lens[b]: the cached prefix plus these n tokens, already written by rope_qkv) and attends keys 0..p:
//     out[qs + i, h] = softmax_k<=p(scale * q[qs + i, h] . K_b[k, kvh]) . V_b[k, kvh],  kvh = h / (Hq / Hkv).
// Key k of sequence b lives in slot block_tables[b, k / block_size] * block_size + k % block_size.
// Everything positional is read on the device (no host sync between steps). Rows outside
// [query_start_loc[0], query_start_loc[B]) are never touched (the engine passes the prefill part of a mixed
// batch this way). Lengths are clamped to the block table's reach and block ids to the cache: a bad input can
// give wrong numbers but never an access out of bounds.
// Layout: q, out T[N, Hq, D]; k_cache, v_cache T[num_slots, Hkv, D]; block_tables int[B, M].
// Softmax runs in log2 units: scores are scaled by scale * log2(e) and exponentiated with exp2f.
// Both kernels use grid (Hq, B, query tiles) with the query tiles in reverse: the hardware launches blocks in
// x, y, z order, so every sequence's last (heaviest, causal) tiles go first, and tiles past a sequence's n exit.
// K/V rows are gathered through the block table one tile at a time; the tile's slots are staged in shared
// memory, so a 64-key tile may span any number of cache blocks.
//
// 1. prefill_attention<T>: the generic reference / fallback, any T, any D <= 256, fp32 math.
//    block 128 (4 warps), 16 queries per block, dynamic smem (16*D + 32*(D+1) + 32*D) * 4 bytes.
//    K/V tiles of 32 keys are staged in smem as fp32. Lane l scores key l of the tile for all 4 rows of its
//    warp at once (each smem K/V value serves 4 rows; K rows padded to D+1 floats so the 32 lanes hit 32
//    different banks), the warp max/sum come from shuffles, and lane l accumulates output dims l, l+32, ... .
//
// 2. prefill_attention_tc<T, D>: FlashAttention-2 on tensor cores, T in {__half, __nv_bfloat16}, D in {64, 128}.
//    block 128 (4 warps), 64 queries of one head per block, dynamic smem 5 * 64 * (D+8) * 2 bytes (45 KB at
//    D=64). Warp w owns rows 16w..16w+15. K/V tiles of 64 keys are double-buffered in smem with cp.async (each
//    16-byte chunk from its row's slot), and the block-table entries of tile j+2 are fetched while tile j is
//    used. S = Q K^T and O += P V use mma.sync m16n8k16 (fp32 accumulate). Tiles are visited in key order;
//    only tiles that cross the diagonal are masked and tiles entirely above it are never loaded.
//
// 3. prefill_attention_wg<T, D, BN>: the same FlashAttention-2 loop on Hopper's warpgroup MMA (wgmma.cuh), sm_90a
//    only (built so on an sm_90 GPU; elsewhere it traps). block 256 = 2 warpgroups, 128 queries of one head (64 a
//    warpgroup), dynamic smem (128 + 4 * BN) * D * 2 bytes + 1 KB of alignment slack. K/V tiles of BN keys (128 at
//    D=64, 64 at D=128) are gathered with cp.async into 128-byte-swizzled tiles (wgmma.cuh) and double-buffered;
//    both warpgroups share them (one fill of a tile serves 128 queries). S = Q K^T is D/16 wgmma steps with Q and K
//    read from smem; O += P V is BN/16 steps with P from the S registers and V from smem. The softmax between them
//    is mma.cuh's, per warp on its 16 rows, unchanged. A warpgroup skips the math of a tile that lies wholly above
//    its diagonal (the last tile of a 128-query block at BN=64).
//    Split keys: a chunk of a long prompt has few query tiles (512 tokens: 4 a head, 56 blocks for 14 heads on 132
//    SMs), each walking the whole prefix. With n_splits > 1 the grid is (Hq, B, query tiles x n_splits) and block
//    (tile, s) takes keys [s * chunk, (s + 1) * chunk) of its tile's kv_len keys (chunk = split_keys(kv_len, ...):
//    whole tiles, computed on the device, so one grid serves every prefix length); it writes its rows' unnormalised
//    output, running max and sum to the workspace, and prefill_attention_merge (4.) combines a row's splits.
//
// 4. prefill_attention_merge<T>: out[row, h] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the splits that
//    hold a key of the row (s * chunk <= its position), M their max: a block a row, a thread 4 dims of a head.
//    The row's tile, kv_len and chunk are recomputed from the same device values as the attention kernel's.
#include "dtype.cuh"
#include "mma.cuh"
#include "wgmma.cuh"
#include "paged.cuh"

constexpr float LOG2E = 1.4426950408889634f;

// The sequence of this block: first flat row, number of new tokens, and the position of its first new token.
struct Seq { int qs, n, start, len; };
__device__ __forceinline__ Seq sequence(const int* query_start_loc, const int* seq_lens, int b, int max_len) {
    Seq s;
    s.qs = query_start_loc[b];
    s.n = query_start_loc[b + 1] - s.qs;
    s.len = min(max(seq_lens[b], 0), max_len);
    s.start = max(s.len - s.n, 0);
    return s;
}

// Keys a split of a query tile takes when the tile's keys 0..kv_len-1 are spread over n_splits blocks: whole tiles of
// bn keys, at least min_keys (a multiple of bn), so splits 0..ceil(kv_len / chunk) - 1 are the non-empty ones.
__device__ __forceinline__ int split_keys(int kv_len, int n_splits, int bn, int min_keys) {
    const int c = (kv_len + n_splits - 1) / n_splits;
    return max(min_keys, (c + bn - 1) / bn * bn);
}

// Cache slot of key `key` (< len) through a block-table row, or -1 past len; the block id is clamped to the cache.
__device__ __forceinline__ int key_slot(const int* table, int key, int len, int block_size, int num_blocks) {
    if (key >= len) return -1;
    const unsigned blk = min((unsigned)table[key / block_size], (unsigned)num_blocks - 1u);
    return (int)blk * block_size + key % block_size;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---------------------------------------------------------------------------------------------------------
// 1. Generic kernel
// ---------------------------------------------------------------------------------------------------------
constexpr int G_BQ = 16, G_BK = 32, G_MAXJ = 8;  // queries per block, keys per tile, output dims per lane / 32

// (128, 4): asking for 4 resident blocks makes ptxas keep everything in registers (with the plain bound it
// chose 72 registers plus a small spill).
template <typename T>
__global__ void __launch_bounds__(128, 4)
prefill_attention(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                  const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                  const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                  int Hkv, int D, T* __restrict__ out) {
    extern __shared__ float smem[];
    float* Qs = smem;                    // [G_BQ][D], pre-scaled to log2 units
    float* Ks = Qs + G_BQ * D;           // [G_BK][D + 1]
    float* Vs = Ks + G_BK * (D + 1);     // [G_BK][D]
    __shared__ int s_slot[G_BK];         // cache slot of each key of the tile (-1: past the sequence)
    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv);
    const int q0 = (gridDim.z - 1 - blockIdx.z) * G_BQ;
    const Seq sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    if (q0 >= sq.n) return;  // whole block: before any barrier
    const int sp = sq.start, n_tokens = sq.n;
    const int* table = block_tables + (size_t)b * M;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    for (int i = threadIdx.x; i < G_BQ * D; i += blockDim.x) {
        const int r = i / D, t = q0 + r;
        Qs[i] = t < n_tokens ? to_f32(q[((size_t)(sq.qs + t) * Hq + h) * D + i % D]) * (scale * LOG2E) : 0.0f;
    }
    float m[4], l[4], acc[4][G_MAXJ];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = NEG_INF; l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < G_MAXJ; j++) acc[i][j] = 0.0f;
    }
    // Keys 0..n_keys-1 are needed: the last query of the block sits at position sp + q_end - 1.
    const int n_keys = min(sp + min(q0 + G_BQ, n_tokens), sq.len);
    const int nj = (D + 31) / 32;  // output dims per lane: lane, lane + 32, ...
    const T* kb = k_cache + (size_t)kvh * D;  // key row of slot s: kb + s * Hkv * D
    const T* vb = v_cache + (size_t)kvh * D;
    for (int k0 = 0; k0 < n_keys; k0 += G_BK) {
        // s_slot was last read before the previous tile's second barrier, so warp 0 may refill it now.
        if (threadIdx.x < G_BK) s_slot[threadIdx.x] = key_slot(table, k0 + threadIdx.x, n_keys, block_size, num_blocks);
        __syncthreads();  // previous tile fully consumed, slots ready (and, on the first pass, Qs written)
        for (int i = threadIdx.x; i < G_BK * D; i += blockDim.x) {
            const int r = i / D, d = i % D, slot = s_slot[r];
            // Keys past n_keys (never valid for a stored query) read as 0: finite, so 0 * v stays 0.
            Ks[r * (D + 1) + d] = slot >= 0 ? to_f32(kb[(size_t)slot * Hkv * D + d]) : 0.0f;
            Vs[r * D + d] = slot >= 0 ? to_f32(vb[(size_t)slot * Hkv * D + d]) : 0.0f;
        }
        __syncthreads();
        // The warp's 4 query rows are processed together, so each K and V value read from smem serves 4 rows.
        const int key = k0 + lane;
        const float* kr = Ks + lane * (D + 1);
        const float* qr = Qs + warp * 4 * D;
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int d = 0; d < D; d++) {
            const float kd = kr[d];
#pragma unroll
            for (int i = 0; i < 4; i++) s[i] += qr[i * D + d] * kd;
        }
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (key > sp + q0 + warp * 4 + i) s[i] = NEG_INF;  // causal mask (also covers keys >= n_keys)
            // Key 0 of the first tile is visible to every row, so m_new is finite here (for sane inputs; base
            // keeps a row without keys at 0 rather than NaN).
            const float m_new = fmaxf(m[i], warp_max(s[i])), base = m_new == NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m[i] - base);
            p[i] = exp2f(s[i] - base);
            l[i] = l[i] * alpha + warp_sum(p[i]);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < G_MAXJ; j++) acc[i][j] *= alpha;
        }
        for (int k = 0; k < G_BK; k++) {
            float v[G_MAXJ];
#pragma unroll
            for (int j = 0; j < G_MAXJ; j++) v[j] = j < nj && lane + 32 * j < D ? Vs[k * D + lane + 32 * j] : 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float pk = __shfl_sync(0xffffffffu, p[i], k);
#pragma unroll
                for (int j = 0; j < G_MAXJ; j++)
                    if (j < nj) acc[i][j] += pk * v[j];  // warp-uniform: skips the unused dims of small D
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = q0 + warp * 4 + i;
        if (t >= n_tokens) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  // no key at all only for seq_lens < q_len (bad input)
#pragma unroll
        for (int j = 0; j < G_MAXJ; j++) {
            const int d = lane + 32 * j;
            if (d < D) out[((size_t)(sq.qs + t) * Hq + h) * D + d] = from_f32<T>(acc[i][j] * inv);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// 2. Tensor-core kernel. PTX fragment layouts of mma.m16n8k16 (g = lane / 4 "groupID", c = lane % 4):
//    A (16x16, row-major)  a0: (row g,   cols 2c, 2c+1)   a1: (row g+8, cols 2c, 2c+1)
//                          a2: (row g,   cols 2c+8, +9)   a3: (row g+8, cols 2c+8, +9)
//    B (16x8, "col")       b0: (k 2c, 2c+1; col n = g)    b1: (k 2c+8, 2c+9; col n = g)
//    C (16x8, fp32)        c0, c1: (row g, cols 2c, 2c+1)  c2, c3: (row g+8, cols 2c, 2c+1)
//    Each 32-bit A/B register holds two 16-bit values, the lower column/k index in the low half.
// ldmatrix.x4 loads four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and lane gets
// (row g, cols 2c, 2c+1) of each matrix -- exactly an A or a "col" B fragment piece. With .trans it gets
// (rows 2c, 2c+1; col g) instead, which turns row-major V[key][d] into the B fragment of P.V.
// ---------------------------------------------------------------------------------------------------------
constexpr int TC_BQ = 64, TC_BK = 64;

// Registers: D=64 must stay <= 128 so 4 blocks are resident per SM (4 x 45 KB of smem fit); that is why the Q
// fragments are re-read from smem per tile instead of held in registers (the block-table staging needed the room).
template <typename T, int D>
__global__ void __launch_bounds__(128)
prefill_attention_tc(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                     const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                     const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                     int Hkv, T* __restrict__ out) {
    // Rows padded by 8 elements (16 bytes): the 8 row addresses of one ldmatrix then fall in 8 different
    // 16-byte bank groups instead of all in one (a D*2-byte stride is a multiple of 128 bytes).
    constexpr int LD = D + 8, TILE = TC_BQ * LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Qs = reinterpret_cast<T*>(smem_raw);  // [64][LD]
    T* Ks = Qs + TILE;                       // [2][64][LD]
    T* Vs = Ks + 2 * TILE;                   // [2][64][LD]
    __shared__ int s_slot[2][TC_BK];         // cache slots of the keys of the next tiles (-1: none)

    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv), tid = threadIdx.x;
    const int q0 = (gridDim.z - 1 - blockIdx.z) * TC_BQ;  // heaviest query tiles are scheduled first
    const Seq sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    if (q0 >= sq.n) return;  // whole block: before any barrier
    const int sp = sq.start, n_tokens = sq.n;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int kv_len = min(sp + min(q0 + TC_BQ, n_tokens), sq.len);  // keys up to the block's last query
    const int n_kt = max(1, (kv_len + TC_BK - 1) / TC_BK);  // >= 1: zero keys (bad input) give 0, not NaN
    const int* table = block_tables + (size_t)b * M;
    const size_t kv_stride = (size_t)Hkv * D;  // between the rows of consecutive slots
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Slots of tiles 0 and 1 (their loads overlap the Q copy), then Q and K/V tile 0 in one cp.async group.
    const int s0 = tid < TC_BK ? key_slot(table, tid, kv_len, block_size, num_blocks) : -1;
    const int s1 = tid < TC_BK ? key_slot(table, TC_BK + tid, kv_len, block_size, num_blocks) : -1;
    load_rows<T, D, LD, TC_BQ>(Qs, q + ((size_t)sq.qs * Hq + h) * D, q0, (size_t)Hq * D, n_tokens);
    if (tid < TC_BK) { s_slot[0][tid] = s0; s_slot[1][tid] = s1; }
    __syncthreads();
    load_slot_rows<T, D, LD, TC_BK>(Ks, kb, s_slot[0], kv_stride);
    load_slot_rows<T, D, LD, TC_BK>(Vs, vb, s_slot[0], kv_stride);
    cp_async_commit();

    // Per thread: rows r0 = 16*warp + g and r1 = r0 + 8 of the block's 64 queries.
    const int pos0 = sp + q0 + warp * 16 + g, pos1 = pos0 + 8;
    const float sl2 = scale * LOG2E;
    float o[D / 8][4];                         // O accumulator: D/8 n-tiles of 16x8
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // l: this thread's partial row sums
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int j = 0; j < n_kt; j++) {
        const int buf = j & 1, k0 = j * TC_BK;
        if (j + 1 < n_kt) {  // prefetch the next tile into the other buffer while this one is used
            load_slot_rows<T, D, LD, TC_BK>(Ks + (buf ^ 1) * TILE, kb, s_slot[buf ^ 1], kv_stride);
            load_slot_rows<T, D, LD, TC_BK>(Vs + (buf ^ 1) * TILE, vb, s_slot[buf ^ 1], kv_stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        // Slots of tile j + 2: the table load flies during this tile's math; stored into s_slot[buf] (tile j's
        // slots, already used) before the barrier that ends the iteration.
        const int next_slot = tid < TC_BK ? key_slot(table, k0 + 2 * TC_BK + tid, kv_len, block_size, num_blocks)
                                          : -1;
        __syncthreads();
        const T* Kt = Ks + buf * TILE;
        const T* Vt = Vs + buf * TILE;
        float s[TC_BK / 8][4];  // S = Q K^T: 16 rows x 64 keys per warp = 8 n-tiles
        qk_tile<T, D, TC_BK, LD>(s, Qs, Kt, warp, lane);

        // Scale to log2 units; mask keys above the diagonal (only tiles that reach past the first query).
        const bool diag = k0 + TC_BK - 1 > sp + q0;
        float mx0 = NEG_INF, mx1 = NEG_INF;
        causal_scale_tile<TC_BK>(s, sl2, diag, k0, c, pos0, pos1, mx0, mx1);
        // Tile 0 holds key 0, visible to every row, so the running max is finite from the first tile on.
        softmax_tile<D, TC_BK, false>(s, mx0, mx1, m0, m1, l0, l1, o);
        pv_tile<T, D, TC_BK, LD>(o, s, Vt, lane);
        if (tid < TC_BK) s_slot[buf][tid] = next_slot;
        __syncthreads();  // everyone is done with this buffer before the next iteration refills it
    }

    const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
    T* ob = out + ((size_t)sq.qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, n_tokens, o, l0, l1, lane);
}

// ---------------------------------------------------------------------------------------------------------
// 3. Hopper kernel (wgmma). Smem: Q [D/64 chunks][128 rows][128 B], then 2 K and 2 V tiles [D/64][BN][128 B], all
//    128-byte swizzled and 1,024-byte aligned.
// ---------------------------------------------------------------------------------------------------------
constexpr int WG_BQ = 128;  // queries a block: 64 a warpgroup
constexpr int WG_MIN_SPLIT_KEYS = 256;  // split_keys' floor (MIN_SPLIT_KEYS in prefill_attention.py, the twin)

// A tile of ROWS rows gathered through `slots` (-1: a zero row) into a swizzled tile; 256 threads, consecutive
// threads on consecutive 16-byte units of a row, so each row's read is one contiguous run.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_sw128_slots(unsigned char* dst, const T* base, const int* slots, size_t stride) {
    constexpr int UPR = D / 8;  // 16-byte units a row
#pragma unroll
    for (int i = 0; i < ROWS * UPR / 256; i++) {
        const int c = threadIdx.x + i * 256, r = c / UPR, u = c % UPR, slot = slots[r];
        cp_async16(dst + sw128_offset(ROWS, r, u), base + (slot >= 0 ? (size_t)slot * stride : 0) + u * 8, slot >= 0);
    }
}

// The block's WG_BQ query rows q0.. (row r at qb + (q0 + r) * stride; zeros from row n_rows on) into a swizzled tile.
template <typename T, int D>
__device__ __forceinline__ void load_sw128_q(unsigned char* Qs, const T* qb, int q0, size_t stride, int n_rows) {
    constexpr int UPR = D / 8;  // 16-byte units a row
#pragma unroll
    for (int i = 0; i < WG_BQ * UPR / 256; i++) {
        const int cc = threadIdx.x + i * 256, r = cc / UPR, u = cc % UPR;
        const bool ok = q0 + r < n_rows;
        cp_async16(Qs + sw128_offset(WG_BQ, r, u), qb + (ok ? (size_t)(q0 + r) * stride : 0) + u * 8, ok);
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S = Q K^T of a warpgroup's 64 queries and a BN-key tile (issued, not waited): D/16 k-steps, each in column chunk
// kk / 4 (all of a tile's rows), 32 bytes further a step. q_wg: the warpgroup's first Q row.
template <typename T, int D, int BN>
__device__ __forceinline__ void wg_qk(float (&s)[BN / 8][4], const unsigned char* q_wg, const unsigned char* Kt) {
    float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
    const T* tag = nullptr;  // picks the instruction's dtype
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma_ss(sd, sw128_desc(q_wg + (kk >> 2) * WG_BQ * 128 + (kk & 3) * 32, 16),
                 sw128_desc(Kt + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16), kk > 0, tag);
}

// O += P V over a BN-key V tile (issued, not waited): keys 16kk.. are 2 8-row groups of every column chunk, +2 KB.
template <typename T, int D, int BN>
__device__ __forceinline__ void wg_pv(float (&od)[D / 2], const unsigned (&p)[BN / 16][4], const unsigned char* Vt) {
    const T* tag = nullptr;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) wgmma_rs(od, p[kk], sw128_desc(Vt + kk * 2048, BN * 128), tag);
}
#endif

// A split's rows as partials: ws_o[row, h, split, :] = o (unnormalised), ws_ml[row, h, split] = (m, l), l summed
// over the quad here; rows t >= n_rows are not stored. Rows whose position precedes the split's first key hold
// garbage (no key: NaN) that prefill_attention_merge never reads.
template <int D>
__device__ __forceinline__ void store_split_rows(float* ws_o, float* ws_ml, size_t row0, size_t row1, int t0, int t1,
                                                 int n_rows, const float (&o)[D / 8][4], float m0, float m1,
                                                 float l0, float l1, int lane) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int c = lane & 3;
    if (t0 < n_rows) {
        float2* p0 = reinterpret_cast<float2*>(ws_o + row0 * D + 2 * c);
#pragma unroll
        for (int n = 0; n < D / 8; n++) p0[n * 4] = make_float2(o[n][0], o[n][1]);
        if (c == 0) reinterpret_cast<float2*>(ws_ml)[row0] = make_float2(m0, l0);
    }
    if (t1 < n_rows) {
        float2* p1 = reinterpret_cast<float2*>(ws_o + row1 * D + 2 * c);
#pragma unroll
        for (int n = 0; n < D / 8; n++) p1[n * 4] = make_float2(o[n][2], o[n][3]);
        if (c == 0) reinterpret_cast<float2*>(ws_ml)[row1] = make_float2(m1, l1);
    }
}

// A block's keys [k_lo, k_hi) of its query tile's kv_len: all of them, or split `split`'s; false where that split
// starts past kv_len (the block has nothing to do).
__device__ __forceinline__ bool wg_keys(int kv_len, int split, int n_splits, int bn, int& k_lo, int& k_hi) {
    k_lo = 0;
    k_hi = kv_len;
    if (n_splits > 1) {
        const int chunk = split_keys(kv_len, n_splits, bn, WG_MIN_SPLIT_KEYS);
        k_lo = split * chunk;
        if (k_lo >= kv_len) return false;
        k_hi = min(kv_len, k_lo + chunk);
    }
    return true;
}

// A thread's rows t0 = t and t1 = t + 8 of its sequence, at the end of the block: normalised to out (one split), or as
// the split's partials (store_split_rows).
template <typename T, int D>
__device__ __forceinline__ void wg_store(T* out, float* ws_o, float* ws_ml, const Seq& sq, int h, int Hq, int t,
                                         int split, int n_splits, const float (&o)[D / 8][4], float m0, float m1,
                                         float l0, float l1, int lane) {
    const int t0 = t, t1 = t + 8;
    if (n_splits > 1) {
        const size_t r0 = ((size_t)(sq.qs + t0) * Hq + h) * n_splits + split;
        const size_t r1 = ((size_t)(sq.qs + t1) * Hq + h) * n_splits + split;
        store_split_rows<D>(ws_o, ws_ml, r0, r1, t0, t1, sq.n, o, m0, m1, l0, l1, lane);
        return;
    }
    T* ob = out + ((size_t)sq.qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, sq.n, o, l0, l1, lane);
}

// n_splits == 1: the normalised output to out (ws_o, ws_ml unused). n_splits > 1: see "Split keys" above; the
// partials of (flat row r, head h, split s) at index (r * Hq + h) * n_splits + s of ws_o (D floats) and ws_ml (2).
// At D = 64 two blocks share an SM (50 KB of shared memory each) only within 128 registers a thread: the split's
// bookkeeping took ptxas to 134 and one block an SM, and the whole 4,096-token prompt from 114 to 164 us (Qwen2.5-
// 0.5B's heads, an H100). So the bound asks for 2 blocks there (WG_BLOCKS_PER_SM in cuda_kernels.py).
template <typename T, int D, int BN>
__global__ void __launch_bounds__(256, D == 64 ? 2 : 1)
prefill_attention_wg(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                     const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                     const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                     int Hkv, int n_splits, float* __restrict__ ws_o, float* __restrict__ ws_ml,
                     T* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(D % 64 == 0 && BN % 64 == 0 && BN <= 256, "64-element chunks; a slot a thread");
    constexpr int Q_BYTES = WG_BQ * D * 2, KV_BYTES = BN * D * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    unsigned char* Ks = Qs + Q_BYTES;       // [2][KV_BYTES]
    unsigned char* Vs = Ks + 2 * KV_BYTES;  // [2][KV_BYTES]
    __shared__ int s_slot[2][BN];           // cache slots of the keys of the next tiles (-1: none)

    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv), tid = threadIdx.x;
    const int split = blockIdx.z % n_splits;
    const int q0 = (gridDim.z / n_splits - 1 - blockIdx.z / n_splits) * WG_BQ;  // heaviest query tiles first
    const Seq sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    if (q0 >= sq.n) return;  // whole block: before any barrier
    const int sp = sq.start, n_tokens = sq.n;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int kv_len = min(sp + min(q0 + WG_BQ, n_tokens), sq.len);  // keys up to the block's last query
    int k_lo, k_hi;  // this block's keys
    if (!wg_keys(kv_len, split, n_splits, BN, k_lo, k_hi)) return;
    const int n_kt = max(1, (k_hi - k_lo + BN - 1) / BN);  // >= 1: zero keys (bad input) give 0, not NaN
    const int* table = block_tables + (size_t)b * M;
    const size_t kv_stride = (size_t)Hkv * D;
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Slots of tiles 0 and 1, Q (zeros past the sequence's rows) and tile 0 in one cp.async group.
    const int s0 = tid < BN ? key_slot(table, k_lo + tid, k_hi, block_size, num_blocks) : -1;
    const int s1 = tid < BN ? key_slot(table, k_lo + BN + tid, k_hi, block_size, num_blocks) : -1;
    load_sw128_q<T, D>(Qs, q + ((size_t)sq.qs * Hq + h) * D, q0, (size_t)Hq * D, n_tokens);
    if (tid < BN) { s_slot[0][tid] = s0; s_slot[1][tid] = s1; }
    __syncthreads();
    load_sw128_slots<T, D, BN>(Ks, kb, s_slot[0], kv_stride);
    load_sw128_slots<T, D, BN>(Vs, vb, s_slot[0], kv_stride);
    cp_async_commit();

    // This thread's rows r0 = 16 * warp + g (= 64 * wg + 16 * (warp % 4) + g) and r0 + 8 of the block's 128 queries;
    // the warpgroup's first query position and its last stored one (a tile past that is needed by none of its rows).
    const int pos0 = sp + q0 + warp * 16 + g, pos1 = pos0 + 8;
    const int wg_first = sp + q0 + wg * 64;
    const int wg_last = q0 + wg * 64 < n_tokens ? sp + min(q0 + wg * 64 + 63, n_tokens - 1) : -1;  // -1: no rows
    const float sl2 = scale * LOG2E;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Q's descriptor for k-step kk: this warpgroup's 64 rows of column chunk kk / 4, 32 bytes a step inside it.
    const unsigned char* q_wg = Qs + wg * 64 * 128;

    for (int j = 0; j < n_kt; j++) {
        const int buf = j & 1, k0 = k_lo + j * BN;
        if (j + 1 < n_kt) {  // prefetch the next tile into the other buffer while this one is used
            load_sw128_slots<T, D, BN>(Ks + (buf ^ 1) * KV_BYTES, kb, s_slot[buf ^ 1], kv_stride);
            load_sw128_slots<T, D, BN>(Vs + (buf ^ 1) * KV_BYTES, vb, s_slot[buf ^ 1], kv_stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        const int next_slot = tid < BN ? key_slot(table, k0 + 2 * BN + tid, k_hi, block_size, num_blocks) : -1;
        fence_async_smem();  // this thread's copies (generic proxy) before the wgmma reads (async proxy)
        __syncthreads();
        if (k0 <= wg_last) {  // warpgroup-uniform
            const unsigned char* Kt = Ks + buf * KV_BYTES;
            const unsigned char* Vt = Vs + buf * KV_BYTES;
            float s[BN / 8][4];
            float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
            wgmma_fence();
            wg_qk<T, D, BN>(s, q_wg, Kt);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_keep(sd);

            float mx0 = NEG_INF, mx1 = NEG_INF;
            causal_scale_tile<BN>(s, sl2, k0 + BN - 1 > wg_first, k0, c, pos0, pos1, mx0, mx1);
            // The first tile holds key k_lo, visible to every row the result is read for (unsplit: key 0, every
            // row), so the running max is finite from the first tile on.
            softmax_tile<D, BN, false>(s, mx0, mx1, m0, m1, l0, l1, o);
            unsigned p[BN / 16][4];  // P as the A operand of k-step kk: keys 16kk..16kk+15
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) p_fragment<T, BN>(p[kk], s, kk);
            float (&od)[D / 2] = reinterpret_cast<float (&)[D / 2]>(o);
            wgmma_keep(od);  // o rescaled and p written by ordinary instructions: all of it before the fence
            wgmma_keep(p);
            wgmma_fence();
            wg_pv<T, D, BN>(od, p, Vt);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_keep(od);
            wgmma_keep(p);
        }
        if (tid < BN) s_slot[buf][tid] = next_slot;
        __syncthreads();  // both warpgroups are done with this buffer before the next iteration refills it
    }

    wg_store<T, D>(out, ws_o, ws_ml, sq, h, Hq, q0 + warp * 16 + g, split, n_splits, o, m0, m1, l0, l1, lane);
#else
    __trap();  // built for sm_90a only; the wrapper never launches it elsewhere
#endif
}

// ---------------------------------------------------------------------------------------------------------
// 4. The merge of prefill_attention_wg's splits. Block `row` (flat row of q), 128 threads over its Hq * D / 4
//    columns of 4 dims; rows outside [query_start_loc[0], query_start_loc[B]) are not touched. bq, bn: the
//    attention kernel's queries a block and keys a tile. The splits of a row with no key (bad input) give zeros.
// ---------------------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(128)
prefill_attention_merge(const float* __restrict__ ws_o, const float* __restrict__ ws_ml,
                        const int* __restrict__ query_start_loc, const int* __restrict__ seq_lens, int B, int max_len,
                        int n_splits, int bq, int bn, int Hq, int D, T* __restrict__ out) {
    const int row = blockIdx.x, first = query_start_loc[0];
    if (B < 1 || row < first || row >= query_start_loc[B]) return;
    const int b = find_request(query_start_loc, B, row - first);
    const Seq sq = sequence(query_start_loc, seq_lens, b, max_len);
    const int t = row - sq.qs, q0 = t / bq * bq;
    const int kv_len = min(sq.start + min(q0 + bq, sq.n), sq.len);
    const int chunk = split_keys(kv_len, n_splits, bn, WG_MIN_SPLIT_KEYS);
    const int seen = min(sq.start + t + 1, kv_len);  // keys 0..seen-1 are the row's
    const int nv = seen > 0 ? min(n_splits, (seen + chunk - 1) / chunk) : 0;
    const int C4 = D / 4;
    for (int col = threadIdx.x; col < Hq * C4; col += blockDim.x) {
        const int h = col / C4, d4 = col % C4;
        const size_t r = ((size_t)row * Hq + h) * n_splits;
        float mx = NEG_INF;
        for (int s = 0; s < nv; s++) mx = fmaxf(mx, ws_ml[2 * (r + s)]);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float L = 0.0f;
        for (int s = 0; s < nv; s++) {
            const float f = exp2f(ws_ml[2 * (r + s)] - mx);
            const float4 v = reinterpret_cast<const float4*>(ws_o + (r + s) * D)[d4];
            L += f * ws_ml[2 * (r + s) + 1];
            acc.x += f * v.x; acc.y += f * v.y; acc.z += f * v.z; acc.w += f * v.w;
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        T* dst = out + ((size_t)row * Hq + h) * D + 4 * d4;
        dst[0] = from_f32<T>(acc.x * inv); dst[1] = from_f32<T>(acc.y * inv);
        dst[2] = from_f32<T>(acc.z * inv); dst[3] = from_f32<T>(acc.w * inv);
    }
}

#define GENERIC_INSTANCE(T)                                                                                   \
    template __global__ void prefill_attention<T>(const T*, const T*, const T*, const int*, const int*,       \
                                                  const int*, int, int, int, float, int, int, int, T*);
#define MERGE_INSTANCE(T)                                                                                     \
    template __global__ void prefill_attention_merge<T>(const float*, const float*, const int*, const int*, int, \
                                                        int, int, int, int, int, int, T*);
#define TC_INSTANCE(T, D)                                                                                     \
    template __global__ void prefill_attention_tc<T, D>(const T*, const T*, const T*, const int*, const int*, \
                                                        const int*, int, int, int, float, int, int, T*);
GENERIC_INSTANCE(float) GENERIC_INSTANCE(__half) GENERIC_INSTANCE(__nv_bfloat16)
MERGE_INSTANCE(float) MERGE_INSTANCE(__half) MERGE_INSTANCE(__nv_bfloat16)
TC_INSTANCE(__half, 64) TC_INSTANCE(__half, 128) TC_INSTANCE(__nv_bfloat16, 64) TC_INSTANCE(__nv_bfloat16, 128)
