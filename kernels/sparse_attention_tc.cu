// sparse_attention_tc.cu -- sparse prefill attention on tensor cores: the queries of a tile share K/V tiles.
// CPU twin: kernels/sparse_attention_tc.py. Semantics: kernels/sparse_prefill.py's sparse_attention (row t at
// position pos attends to its selected blocks' tokens before its window start ws = pos - min(pos+1, W) + 1, plus
// the window [ws, pos], each token once); this file computes the same by another route. Driver: toolkit/sparse.py.
//
// A tile is 64 consecutive queries of one request (request b, tile i: local queries 64i .. 64i+63). Adjacent
// queries select overlapping blocks (the same ones within a query tile of toolkit/sparse.py), so the tile's work
// is attention over the UNION of its rows' blocks with a per-(query, block) mask, 64 keys at a time on mma.sync,
// instead of a separate gather per query.
//
// 1. sparse_tile_union          grid (tiles, B), block 256, dynamic smem min(N, UN_CAP) * 8 bytes.
//    A shared bitmap of 64-bit query masks over the blocks [j0, j0 + UN_CAP) (several passes when N is wider):
//    each warp walks a row's combined entries and ORs bit r into the mask of every selected block that has a
//    token before that row's window (blocks wholly inside it come from the window pass). The long rows of one
//    query tile (Q, toolkit/sparse.py) share sparse_topk's selection, so one of them (the last in this tile)
//    walks it and sets, per block, the bits of every such row whose window starts after the block: 64 rows'
//    walks become one with Q = 64 (37 -> 11 us a layer at 4,096 tokens; sparse_kernels_union_topk*.log).
//    Block scans compact the non-zero masks into the tile's ascending list: ublk[tile, e] = block,
//    umask[tile, e] = query mask, ucount[tile] = e's count. A tile whose last row is covered ((pos+1)/R <= K:
//    every block selected, so every row's key set is 0..pos) gets count 0: it is plain causal attention.
// 2. sparse_attention_tc<T, D>  grid (Hq, B, tiles) (tiles in reverse: the heaviest go first), block 128,
//    dynamic smem 5 * 64 * (D + 8) * 2 bytes. prefill_attention_tc's FlashAttention-2 loop (warp w owns rows
//    16w..16w+15, cp.async double buffering, S = Q K^T and O += P V on m16n8k16) over a list of 64-key chunks:
//    first the union's keys (entry e covers keys ublk[e]*R .. +R-1; key allowed for row r iff bit r of its mask is
//    set and key < lo(r)), then the window span [lo(0), pos(last row)] (allowed iff lo(r) <= key <= pos(r)).
//    lo(r) = ws(r), or 0 in a covered tile, whose span is then 0..pos: the dense causal tile. Each chunk's cache
//    slots, keys and masks are staged in smem two chunks ahead, with a flag per chunk: a union chunk whose keys
//    every row selected, all before the first row's window, skips the per-element mask (with query tiles,
//    toolkit/sparse.py, nearly every union chunk; 1.10 -> 0.74 ms a layer at 16K tokens). Rows that see no key
//    of a chunk keep m = -inf (guarded: exp2 never sees -inf - -inf). 157 registers at D=64, so 3 CTAs per SM:
//    bounding it to 128 (4 CTAs, as the dense kernel) spilled. Measured on the H200:
//    experiments/logs/bench_sparse_layer.log, sparse_kernels.log.
#include "dtype.cuh"
#include "paged.cuh"
#include "scan.cuh"
#include "mma.cuh"

constexpr float TC_LOG2E = 1.4426950408889634f;
constexpr int TQ = 64, TK = 64, UN_THREADS = 256, UN_CAP = 8192;

// ---------------------------------------------------------------------------------------------------------
// 1. Union of a tile's selected blocks
// ---------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(UN_THREADS)
sparse_tile_union(const int* __restrict__ qsl, const int* __restrict__ seq_lens, const int* __restrict__ combined,
                  int Kc, const int* __restrict__ lens, int M, int N, int W, int R, int K, int Q, int tiles,
                  int cap, int* __restrict__ ublk, unsigned long long* __restrict__ umask, int* __restrict__ ucount) {
    extern __shared__ unsigned long long bits[];  // [min(N, UN_CAP)]
    __shared__ int warp_sums[UN_THREADS / 32];
    const int b = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qs = qsl[b] - qsl[0], n = qsl[b + 1] - qsl[b], q0 = tile * TQ;
    if (q0 >= n) return;
    const size_t ti = (size_t)b * tiles + tile;
    const int rows = min(TQ, n - q0), start = seq_lens[b] - n, pos_last = start + q0 + rows - 1;
    if ((pos_last + 1) / R <= K) {  // covered: the attention kernel runs it as a causal tile
        if (tid == 0) ucount[ti] = 0;
        return;
    }
    const int nmax = min(N, (pos_last + 1) / R), span = min(nmax, UN_CAP);
    const long long off = (long long)b * M;
    int count = 0;
    for (int j0 = 0; j0 < nmax; j0 += span) {
        for (int j = tid; j < span; j += UN_THREADS) bits[j] = 0ull;
        __syncthreads();
        for (int r = warp; r < rows; r += UN_THREADS / 32) {
            const int t = qs + q0 + r, pos = start + q0 + r;
            // Rows r_lo..r take their bits from this row's entries. The long rows ((pos+1)/R > K) of one query
            // tile (pos / Q) hold the same K top-k entries, sparse_topk's one selection for the tile: only the
            // tile's last row in this 64-row tile walks them, for all of them. Their window entries fall out below
            // (j >= nmax), as for every row.
            int r_lo = r;
            if ((pos + 1) / R > K) {
                if (r + 1 < rows && (pos + 1) / Q == pos / Q) continue;  // not the tile's last row here
                r_lo = max(r - pos % Q, max(0, (K + 1) * R - 1 - start - q0));  // its first long row here
            }
            const unsigned long long upto = r == 63 ? ~0ull : (1ull << (r + 1)) - 1ull;  // rows <= r
            const int* crow = combined + (size_t)t * Kc;
            const int ne = min(lens[t], Kc);
            // Rows of a query tile (toolkit/sparse.py) hold the same blocks: each warp starts at another entry,
            // so the 8 warps' atomics do not all hit the same mask at once. Entries are loaded 8 at a time before
            // any is used: one load, then its atomic, per iteration was a chain of dependent global loads (76 us
            // for this kernel at 16K tokens).
            const int rot = ne ? (warp * 64) % ne : 0;
            for (int i0 = lane; i0 < ne; i0 += 32 * 8) {
                int v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = i0 + 32 * u, e = i + rot < ne ? i + rot : i + rot - ne;
                    v[u] = i < ne ? crow[e] : -1;
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    if (v[u] < 0) continue;
                    const long long j = (long long)v[u] - off;  // window entries (>= N), other requests' ids fall out
                    if (j < j0 || j >= j0 + span || j >= nmax) continue;
                    // Row rr sees block j before its window iff j R < ws(rr) = pos(rr) - W + 1, i.e. from row
                    // j R + W - start - q0 on (ws is 0 for the first W positions: no row then).
                    const int rmin = max(r_lo, (int)j * R + W - start - q0);
                    if (rmin > r) continue;
                    atomicOr(&bits[j - j0], upto & ~((1ull << rmin) - 1ull));
                }
            }
        }
        __syncthreads();
        for (int i0 = 0; i0 < span && j0 + i0 < nmax; i0 += UN_THREADS) {
            const int i = i0 + tid;
            const unsigned long long m = i < span && j0 + i < nmax ? bits[i] : 0ull;
            int total;
            const int at = count + block_scan<UN_THREADS>(m != 0ull, warp_sums, &total);
            if (m) {
                ublk[ti * cap + at] = j0 + i;
                umask[ti * cap + at] = m;
            }
            count += total;
        }
        __syncthreads();  // bits is cleared by the next pass
    }
    if (tid == 0) ucount[ti] = count;
}

// ---------------------------------------------------------------------------------------------------------
// 2. Attention over the union and the window span
// ---------------------------------------------------------------------------------------------------------
// The tile's chunk list: chunks 0..n_uc-1 walk the union (key kk of the list: entry kk / R, token kk % R),
// the rest the window span [wlo, whi]. Key -1: none (its K/V rows are zero-filled and it is masked).
struct Chunks {
    const int* blk;
    const unsigned long long* mask;
    int cnt, n_uc, R, wlo, whi, L;
    __device__ __forceinline__ void key(int ch, int i, int& k, unsigned long long& m) const {
        if (ch < n_uc) {
            const int kk = ch * TK + i, e = kk / R;
            k = e < cnt ? blk[e] * R + kk % R : -1;
            m = e < cnt ? mask[e] : 0ull;
        } else {
            k = wlo + (ch - n_uc) * TK + i;
            if (k > whi) k = -1;
            m = ~0ull;
        }
        if (k >= L) k = -1;
    }
};

template <typename T, int D>
__global__ void __launch_bounds__(128)
sparse_attention_tc(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                    const int* __restrict__ block_tables, int tab_width, const int* __restrict__ qsl,
                    const int* __restrict__ seq_lens, const int* __restrict__ ublk,
                    const unsigned long long* __restrict__ umask, const int* __restrict__ ucount, int tiles, int cap,
                    int W, int R, int K, int bs, int num_blocks, float scale, int Hq, int Hkv, T* __restrict__ out) {
    constexpr int LD = D + 8, TILE = TQ * LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Qs = reinterpret_cast<T*>(smem_raw);  // [64][LD]
    T* Ks = Qs + TILE;                       // [2][64][LD]
    T* Vs = Ks + 2 * TILE;                   // [2][64][LD]
    __shared__ int s_slot[2][TK];                 // cache slots of the next chunks' keys (-1: none)
    __shared__ int s_key[3][TK];                  // chunk j's keys and masks in [j % 3]: written two chunks
    __shared__ unsigned long long s_mask[3][TK];  // ahead, while chunk j - 1's (the third buffer) are done
    __shared__ int s_full[3][2];                  // per staging warp: its 32 keys are open to every row

    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv), tid = threadIdx.x;
    const int tile = gridDim.z - 1 - blockIdx.z, q0 = tile * TQ;
    const int qs = qsl[b], n = qsl[b + 1] - qs;  // absolute rows of q and out
    if (q0 >= n) return;  // whole block: before any barrier
    const int rows = min(TQ, n - q0), start = seq_lens[b] - n, pos_last = start + q0 + rows - 1;
    const bool covered = (pos_last + 1) / R <= K;
    const int* table = block_tables + (size_t)b * tab_width;
    const size_t ti = (size_t)b * tiles + tile;
    Chunks ck;
    ck.blk = ublk + ti * cap;
    ck.mask = umask + ti * cap;
    ck.cnt = covered ? 0 : ucount[ti];
    ck.R = R;
    ck.n_uc = (ck.cnt * R + TK - 1) / TK;
    ck.wlo = covered ? 0 : (start + q0) - min(start + q0 + 1, W) + 1;
    ck.whi = pos_last;
    ck.L = min(seq_lens[b], tab_width * bs);
    const int n_ch = ck.n_uc + (ck.whi - ck.wlo + TK) / TK;
    // A union chunk is "full" when each of its keys is selected by every row of the tile and lies before the
    // first row's window (lo is non-decreasing in the row): no per-element mask then. With a shared query-tile
    // selection (toolkit/sparse.py) that is almost every chunk.
    const unsigned long long all_rows = rows == 64 ? ~0ull : (1ull << rows) - 1ull;
    const int lo_first = (start + q0) - min(start + q0 + 1, W) + 1;
    const size_t kv_stride = (size_t)Hkv * D;
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Chunks 0 and 1's keys, then Q and chunk 0's K/V in one cp.async group.
    if (tid < TK) {
        for (int s = 0; s < 2; s++) {
            int k;
            unsigned long long m;
            ck.key(s, tid, k, m);
            s_key[s][tid] = k;
            s_mask[s][tid] = m;
            s_slot[s][tid] = k >= 0 ? cache_slot(table, k, bs, num_blocks) : -1;
            const int full = __all_sync(0xffffffffu, s < ck.n_uc && k >= 0 && k < lo_first &&
                                                     (m & all_rows) == all_rows);
            if ((tid & 31) == 0) s_full[s][tid >> 5] = full;
        }
    }
    load_rows<T, D, LD, TQ>(Qs, q + ((size_t)qs * Hq + h) * D, q0, (size_t)Hq * D, n);
    __syncthreads();
    load_slot_rows<T, D, LD, TK>(Ks, kb, s_slot[0], kv_stride);
    load_slot_rows<T, D, LD, TK>(Vs, vb, s_slot[0], kv_stride);
    cp_async_commit();

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int r0 = warp * 16 + g, r1 = r0 + 8;  // this thread's two rows of the tile
    const int pos0 = start + q0 + r0, pos1 = pos0 + 8;
    const int lo0 = covered ? 0 : pos0 - min(pos0 + 1, W) + 1, lo1 = covered ? 0 : pos1 - min(pos1 + 1, W) + 1;
    const float sl2 = scale * TC_LOG2E;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int nn = 0; nn < D / 8; nn++) o[nn][0] = o[nn][1] = o[nn][2] = o[nn][3] = 0.0f;

    for (int j = 0; j < n_ch; j++) {
        const int buf = j & 1;
        if (j + 1 < n_ch) {
            load_slot_rows<T, D, LD, TK>(Ks + (buf ^ 1) * TILE, kb, s_slot[buf ^ 1], kv_stride);
            load_slot_rows<T, D, LD, TK>(Vs + (buf ^ 1) * TILE, vb, s_slot[buf ^ 1], kv_stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        // Chunk j + 2's keys: the loads fly during this chunk's math; stored before the barrier that ends it.
        const int kb3 = j % 3;
        int nk = -1, nfull = 0;
        unsigned long long nm = 0ull;
        if (tid < TK) {
            ck.key(j + 2, tid, nk, nm);
            nfull = __all_sync(0xffffffffu, j + 2 < ck.n_uc && nk >= 0 && nk < lo_first &&
                                            (nm & all_rows) == all_rows);
        }
        __syncthreads();
        const T* Kt = Ks + buf * TILE;
        const T* Vt = Vs + buf * TILE;
        float s[TK / 8][4];
        qk_tile<T, D, TK, LD>(s, Qs, Kt, warp, lane);

        // Mask: a union chunk lets row r see key k iff r selected k's block and k < lo(r); a window chunk iff
        // lo(r) <= k <= pos(r). Key -1 (none) is never seen.
        const bool uni = j < ck.n_uc;
        float mx0 = NEG_INF, mx1 = NEG_INF;
        if (s_full[kb3][0] && s_full[kb3][1]) {  // every row sees every key: scale only
#pragma unroll
            for (int nn = 0; nn < TK / 8; nn++) {
                s[nn][0] *= sl2; s[nn][1] *= sl2; s[nn][2] *= sl2; s[nn][3] *= sl2;
                mx0 = fmaxf(mx0, fmaxf(s[nn][0], s[nn][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nn][2], s[nn][3]));
            }
        } else {
#pragma unroll
            for (int nn = 0; nn < TK / 8; nn++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int col = nn * 8 + 2 * c;
                    const int r = e < 2 ? r0 : r1, lo = e < 2 ? lo0 : lo1, pos = e < 2 ? pos0 : pos1;
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const int k = s_key[kb3][col + x];
                        const bool ok = k >= 0 && (uni ? ((s_mask[kb3][col + x] >> r) & 1ull) && k < lo
                                                       : k >= lo && k <= pos);
                        const float v = ok ? s[nn][e + x] * sl2 : NEG_INF;
                        s[nn][e + x] = v;
                        if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
                    }
                }
        }
        softmax_tile<D, TK, true>(s, mx0, mx1, m0, m1, l0, l1, o);
        pv_tile<T, D, TK, LD>(o, s, Vt, lane);
        if (tid < TK) {  // [(j + 2) % 3] held chunk j - 1's keys, done before the previous barrier
            const int nb3 = kb3 == 0 ? 2 : kb3 - 1;
            s_key[nb3][tid] = nk;
            s_mask[nb3][tid] = nm;
            if ((tid & 31) == 0) s_full[nb3][tid >> 5] = nfull;
            s_slot[buf][tid] = nk >= 0 ? cache_slot(table, nk, bs, num_blocks) : -1;
        }
        __syncthreads();  // everyone is done with this K/V buffer before the next iteration refills it
    }

    const int t0 = q0 + r0, t1 = q0 + r1;
    T* ob = out + ((size_t)qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, n, o, l0, l1, lane);
}

#define SATC_INSTANCE(T, D)                                                                                      \
    template __global__ void sparse_attention_tc<T, D>(const T*, const T*, const T*, const int*, int, const int*,  \
                                                       const int*, const int*, const unsigned long long*,           \
                                                       const int*, int, int, int, int, int, int, int, float, int,   \
                                                       int, T*);
SATC_INSTANCE(__half, 64) SATC_INSTANCE(__half, 128) SATC_INSTANCE(__nv_bfloat16, 64)
SATC_INSTANCE(__nv_bfloat16, 128)
