// sparse_prefill.cu -- indexer, top-k over key blocks and sparse attention of the sparse prefill path.
// CPU twin: kernels/sparse_prefill.py (the semantics, in its docstring); the driver is toolkit/sparse.py.
// Rows are the prefill requests' rows: request b owns flat rows qsl[b]..qsl[b+1]-1 of q (local row t = row - qsl[0]),
// its queries sit at the end of its seq_len tokens. Keys are read from the paged cache through the block table
// (slot = table[k / bs] * bs + k % bs, the block id clamped to the cache): nothing is gathered into a workspace.
//
// 1. sparse_compress_keys<T>  grid (N, B), block Hkv*D: kbar[b, j, g, d] = mean of keys jR..jR+R-1 (0 past L/R)
// Query tiles: the indexer scores and selects per tile row, request b's queries grouped by pos / Q (Q = 1: per
// query). Tile rows count in request order; each kernel finds its request's first tile row with a loop over the
// requests before it (tiles_of / tile_base below).
// 2. sparse_query_means<T>    grid (max tiles of a request, B, ceil(Hkv*D/32)), block (32, 8): qbar[tile, g, d] =
//                             mean of the tile's queries over its rows and group g's heads (fp32).
// 3. sparse_scores            grid (ceil(max tiles/32), ceil(N/64), B), block 256: a 32-tile x 64-block piece of
//                             one request; per kv group the tile means and block means are staged in smem (rows
//                             padded to D+1 floats: no bank conflicts), each thread accumulates 2 tiles x 4
//                             blocks, ReLU per group, sum. fp32 throughout. Only tile rows r0 .. r0+rows-1 (the
//                             chunk) are written; -inf past (p_first+1)/R. A piece wholly past its last tile's
//                             candidate blocks (half of a fresh prompt's) only writes -inf.
// 4. sparse_topk              grid tile rows, block 512: the tile's short rows ((pos+1)/R <= K) write 0..n-1;
//                             for the long ones a 4-pass 8-bit radix select of the K-th largest score (float ->
//                             order-preserving uint; per pass a histogram and a block scan over its bins), then
//                             one pass in index order with block scans that keeps every score above it and the
//                             lowest-indexed ties (ascending block order, as the CPU twin's stable argsort),
//                             written to the first long row and copied to the others.
// 5. sparse_attention<T,D,GM> grid (T, Hkv), block 128: one query and one kv head, the group's G <= GM heads
//                             together. The combined row's entries are expanded (block scan over 128 entries at a
//                             time) into a list of cache slots in smem: a block's tokens before the window start,
//                             then the window tokens. Warps take 32-key tiles of the list in turn: lane = key for
//                             the scores (K row read as 16-byte chunks, Q broadcast from smem), online softmax per
//                             head in log2 units (row sums kept per lane, reduced at the end), then lane = output
//                             dims for P.V (V rows read coalesced, P broadcast from smem). The 4 warps' partial
//                             (m, l, acc) merge through smem at the end. fp32 math on CUDA cores.
#include "dtype.cuh"
#include "paged.cuh"
#include "scan.cuh"

constexpr float LOG2E_F = 1.4426950408889634f;


// ---------------------------------------------------------------------------------------------------------
// 1. Block means of the keys
// ---------------------------------------------------------------------------------------------------------
template <typename T>
__global__ void sparse_compress_keys(const T* __restrict__ k_cache, const int* __restrict__ block_tables,
                                     int tab_width, const int* __restrict__ seq_lens, int bs, int num_blocks, int R,
                                     int N, int Hkv, int D, float* __restrict__ kbar) {
    const int j = blockIdx.x, b = blockIdx.y, gd = threadIdx.x;
    if (gd >= Hkv * D) return;
    const int L = min(max(seq_lens[b], 0), tab_width * bs);
    float acc = 0.0f;
    if (j < L / R) {
        const int* table = block_tables + (size_t)b * tab_width;
        for (int k = j * R; k < j * R + R; k++)
            acc += to_f32(k_cache[(size_t)cache_slot(table, k, bs, num_blocks) * Hkv * D + gd]);
        acc *= 1.0f / (float)R;
    }
    kbar[((size_t)b * N + j) * Hkv * D + gd] = acc;
}

// ---------------------------------------------------------------------------------------------------------
// 2. Query tiles: request b's queries (positions P0 = L - qlen .. L-1) grouped by pos / Q, in request order
// ---------------------------------------------------------------------------------------------------------
__device__ __forceinline__ int tiles_of(const int* qsl, const int* seq_lens, int b, int Q) {
    const int qlen = qsl[b + 1] - qsl[b], L = seq_lens[b];
    return qlen > 0 ? (L - 1) / Q - (L - qlen) / Q + 1 : 0;
}

// The first tile row of request b (the requests before it, counted in a loop: B is at most a few hundred).
__device__ __forceinline__ int tile_base(const int* qsl, const int* seq_lens, int b, int Q) {
    int s = 0;
    for (int c = 0; c < b; c++) s += tiles_of(qsl, seq_lens, c, Q);
    return s;
}

// Tile i of request b: its first position and row count.
__device__ __forceinline__ void tile_span(const int* qsl, const int* seq_lens, int b, int Q, int i, int* p_first,
                                          int* count) {
    const int qlen = qsl[b + 1] - qsl[b], L = seq_lens[b], P0 = L - qlen;
    const int t = P0 / Q + i, lo = max(P0, t * Q), hi = min(L, (t + 1) * Q);
    *p_first = lo;
    *count = hi - lo;
}

// qbar[tr - r0, g, d] = mean over the tile's rows and group g's heads, for tile rows r0 .. r0+rows-1.
// grid (max tiles of a request, B, ceil(Hkv*D / 32)), block (32, 8): lane x owns output gd = 32 z + x, thread row y
// sums the tile's rows y, y+8, ..; the 8 partial sums are added in a fixed order (deterministic). One thread per
// output looping over all 64 rows x 7 heads was a chain of ~450 dependent loads: 0.25 ms a layer at 16K tokens.
template <typename T>
__global__ void __launch_bounds__(256)
sparse_query_means(const T* __restrict__ q, const int* __restrict__ qsl, int num_reqs, const int* __restrict__ seq_lens,
                   int Q, int r0, int rows, int Hq, int Hkv, int D, float* __restrict__ qbar) {
    __shared__ float part[8][33];
    const int b = blockIdx.y, i = blockIdx.x, x = threadIdx.x, y = threadIdx.y;
    if (i >= tiles_of(qsl, seq_lens, b, Q)) return;
    const int tr = tile_base(qsl, seq_lens, b, Q) + i;
    if (tr < r0 || tr >= r0 + rows) return;
    int p_first, count;
    tile_span(qsl, seq_lens, b, Q, i, &p_first, &count);
    const int row0 = qsl[b] + (p_first - (seq_lens[b] - (qsl[b + 1] - qsl[b])));  // flat row of p_first
    const int G = Hq / Hkv, gd = blockIdx.z * 32 + x;
    float acc = 0.0f;
    if (gd < Hkv * D) {
        const int g = gd / D, d = gd % D;
        for (int r = y; r < count; r += 8) {
            const T* qr = q + ((size_t)(row0 + r) * Hq + g * G) * D + d;
            float s = 0.0f;
            for (int h = 0; h < G; h++) s += to_f32(qr[(size_t)h * D]);
            acc += s;
        }
    }
    part[y][x] = acc;
    __syncthreads();
    if (y == 0 && gd < Hkv * D) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) s += part[k][x];
        qbar[(size_t)(tr - r0) * Hkv * D + gd] = s * (1.0f / (float)(count * G));
    }
}

// ---------------------------------------------------------------------------------------------------------
// 3. Indexer scores
// ---------------------------------------------------------------------------------------------------------
constexpr int SC_TQ = 32, SC_TN = 64;

extern "C" __global__ void __launch_bounds__(256)
sparse_scores(const float* __restrict__ qbar, const float* __restrict__ kbar, const int* __restrict__ qsl,
              int num_reqs, const int* __restrict__ seq_lens, int R, int Q, int r0, int rows, int N, int Hkv, int D,
              float* __restrict__ scores) {
    extern __shared__ float sm[];
    float* Qs = sm;                        // [SC_TQ][D + 1]
    float* Ks = Qs + SC_TQ * (D + 1);      // [SC_TN][D + 1]
    const int b = blockIdx.z, nt = tiles_of(qsl, seq_lens, b, Q), tb = tile_base(qsl, seq_lens, b, Q);
    const int i0 = blockIdx.x * SC_TQ;               // first tile of the request in this CTA
    const int j0 = blockIdx.y * SC_TN;
    // Tile rows of the CTA that exist and fall in this chunk [r0, r0 + rows).
    const int lo = max(tb + i0, r0), hi = min(min(tb + i0 + SC_TQ, tb + nt), r0 + rows);
    if (lo >= hi) return;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;  // tile rows 2ty, 2ty+1; blocks tx + 16c
    int p_last, cnt;  // p_last: the first position of the CTA's last tile, which has the most candidates
    tile_span(qsl, seq_lens, b, Q, hi - 1 - tb, &p_last, &cnt);
    if (j0 >= (p_last + 1) / R) {  // past every tile's candidate blocks (causal): all -inf, no math
        for (int k = tid; k < (hi - lo) * SC_TN; k += 256) {
            const int t = lo + k / SC_TN, j = j0 + k % SC_TN;
            if (j < N) scores[(size_t)(t - r0) * N + j] = NEG_INF;
        }
        return;
    }
    float s[2][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) s[a][c] = 0.0f;
    for (int g = 0; g < Hkv; g++) {
        __syncthreads();  // previous group's tiles consumed
        for (int k = tid; k < SC_TQ * D; k += 256) {
            const int r = k / D, d = k % D, t = tb + i0 + r;
            Qs[r * (D + 1) + d] = t >= lo && t < hi ? qbar[((size_t)(t - r0) * Hkv + g) * D + d] : 0.0f;
        }
        for (int k = tid; k < SC_TN * D; k += 256) {
            const int c = k / D, d = k % D, j = j0 + c;
            Ks[c * (D + 1) + d] = j < N ? kbar[(((size_t)b * N + j) * Hkv + g) * D + d] : 0.0f;
        }
        __syncthreads();
        float dot[2][4];
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) dot[a][c] = 0.0f;
        for (int d = 0; d < D; d++) {
            const float q0 = Qs[(2 * ty) * (D + 1) + d], q1 = Qs[(2 * ty + 1) * (D + 1) + d];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float kv = Ks[(tx + 16 * c) * (D + 1) + d];
                dot[0][c] += q0 * kv;
                dot[1][c] += q1 * kv;
            }
        }
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[a][c] += fmaxf(dot[a][c], 0.0f);
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const int t = tb + i0 + 2 * ty + a;
        if (t < lo || t >= hi) continue;
        int p_first, count;
        tile_span(qsl, seq_lens, b, Q, t - tb, &p_first, &count);
        const int nb = (p_first + 1) / R;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int j = j0 + tx + 16 * c;
            if (j < N) scores[(size_t)(t - r0) * N + j] = j < nb ? s[a][c] : NEG_INF;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// 4. Top-k per tile row, written to each of the tile's query rows
// ---------------------------------------------------------------------------------------------------------
constexpr int TK_THREADS = 512;

__device__ __forceinline__ unsigned order_key(float f) {
    if (f == 0.0f) f = 0.0f;  // -0 and +0 are one score (the twin's sort treats them as equal)
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}


extern "C" __global__ void __launch_bounds__(TK_THREADS)
sparse_topk(const float* __restrict__ scores, int N, const int* __restrict__ qsl, int num_reqs,
            const int* __restrict__ seq_lens, int R, int K, int Q, int r0, int rows, int* __restrict__ topk) {
    __shared__ int hist[256];
    __shared__ int warp_sums[TK_THREADS / 32];
    __shared__ unsigned s_prefix;
    __shared__ int s_need;
    const int i = blockIdx.x, tr = r0 + i, tid = threadIdx.x;
    if (i >= rows) return;
    int b = 0, tb = 0;  // the request that owns tile row tr, and its first tile row
    for (; b < num_reqs; b++) {
        const int nt = tiles_of(qsl, seq_lens, b, Q);
        if (tr < tb + nt) break;
        tb += nt;
    }
    if (b == num_reqs) return;
    int p_first, count;
    tile_span(qsl, seq_lens, b, Q, tr - tb, &p_first, &count);
    const int qlen = qsl[b + 1] - qsl[b];
    const int t0 = qsl[b] - qsl[0] + (p_first - (seq_lens[b] - qlen));  // local row of p_first
    // Short rows, (pos+1)/R <= K: every complete block, no scores read. The others are the long rows.
    int first_long = count;
    for (int r = 0; r < count; r++) {
        const int n = (p_first + r + 1) / R;
        if (n > K) { first_long = r; break; }
        for (int j = tid; j < K; j += TK_THREADS) topk[(size_t)(t0 + r) * K + j] = j < n ? j : -1;
    }
    if (first_long == count) return;
    int* out = topk + (size_t)(t0 + first_long) * K;  // the tile's selection goes here, then to the later rows
    const int n = min((p_first + 1) / R, N);
    if ((p_first + 1) / R <= K) {  // K or fewer candidates: all of them
        for (int j = tid; j < K; j += TK_THREADS) out[j] = j < n ? j : -1;
    } else {
        const float* row = scores + (size_t)i * N;
        // Radix select, most significant byte first: the K-th largest key's prefix grows by 8 bits per pass.
        unsigned prefix = 0;
        int need = K;  // how many of the keys that match the prefix so far are still to be taken from the top
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int h = tid; h < 256; h += TK_THREADS) hist[h] = 0;
            __syncthreads();
            const unsigned mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
            for (int j = tid; j < n; j += TK_THREADS) {
                const unsigned key = order_key(row[j]);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
            }
            __syncthreads();
            // The digit d holding the need-th largest key: a block scan over the bins from 255 down (thread h
            // holds bin 255 - h), so d is the one bin whose keys above it number < need <= those up to it. Digit
            // 0 takes what is left when the bins hold fewer than need keys (bad input). Thread 0 walking the 256
            // bins one by one was a chain of dependent shared-memory loads: 4 passes of it were about half of
            // this kernel's 39 us a layer at 4,096 tokens (experiments/logs/sparse_kernels_4k.log).
            const int c = tid < 256 ? hist[255 - tid] : 0;
            int all;
            const int above = block_scan<TK_THREADS>(c, warp_sums, &all);
            if (tid < 256 && above < need && (above + c >= need || tid == 255)) {
                s_prefix = prefix | ((unsigned)(255 - tid) << shift);
                s_need = need - above;
            }
            __syncthreads();
            prefix = s_prefix;
            need = s_need;
            __syncthreads();
        }
        // prefix = the K-th largest key; take every key above it and the `need` lowest-indexed keys equal to it.
        int taken = 0, eq_seen = 0;
        for (int j0 = 0; j0 < n; j0 += TK_THREADS) {
            const int j = j0 + tid;
            const unsigned key = j < n ? order_key(row[j]) : 0u;
            const int gt = j < n && key > prefix, eq = j < n && key == prefix;
            int eq_total, sel_total;
            const int eq_rank = block_scan<TK_THREADS>(eq, warp_sums, &eq_total);
            const int sel = gt || (eq && eq_seen + eq_rank < need);
            const int at = block_scan<TK_THREADS>(sel, warp_sums, &sel_total);
            if (sel) out[taken + at] = j;
            taken += sel_total;
            eq_seen += eq_total;
        }
        for (int j = taken + tid; j < K; j += TK_THREADS) out[j] = -1;  // only for bad input (fewer than K keys)
    }
    // The tile's later rows copy the selection (a row after a long row is long: n grows with the position).
    // __syncthreads makes this block's global writes visible to its own threads.
    __syncthreads();
    for (int r = first_long + 1; r < count; r++)
        for (int j = tid; j < K; j += TK_THREADS) topk[(size_t)(t0 + r) * K + j] = out[j];
}

// ---------------------------------------------------------------------------------------------------------
// 5. Sparse attention
// ---------------------------------------------------------------------------------------------------------
constexpr int SA_KCAP = 512, SA_THREADS = 128;  // GM: the group size bound, 8 or 16 (registers)

template <typename T, int D, int GM>
__global__ void __launch_bounds__(SA_THREADS, 1)
sparse_attention(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                 const int* __restrict__ block_tables, int tab_width, const int* __restrict__ qsl, int num_reqs,
                 const int* __restrict__ seq_lens, const int* __restrict__ combined, int Kc,
                 const int* __restrict__ lens, int M, int N, int W, int R, int bs, int num_blocks, float scale, int Hq,
                 int Hkv, T* __restrict__ out) {
    constexpr int NJ = (D + 31) / 32;                              // output dims per lane
    constexpr bool VEC = (D * sizeof(T)) % 16 == 0;                // K rows as 16-byte chunks
    extern __shared__ __align__(16) unsigned char sa_raw[];
    float* Qs = reinterpret_cast<float*>(sa_raw);                  // [GM][D], pre-scaled (log2 units)
    float* Ps = Qs + GM * D;                                  // [4 warps][GM][32]
    float* Mg = Ps + 4 * GM * 32;                             // merge: [4][GM][D + 2]
    int* slots = reinterpret_cast<int*>(Mg + 4 * GM * (D + 2)); // [SA_KCAP]
    __shared__ int warp_sums[SA_THREADS / 32];

    const int t = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = min(Hq / Hkv, GM);
    const int base = qsl[0], b = find_request(qsl, num_reqs, t);
    const int qlen = qsl[b + 1] - qsl[b], L = min(seq_lens[b], tab_width * bs);
    const int pos = seq_lens[b] - qlen + (t - (qsl[b] - base));
    const int prefix = seq_lens[b] - qlen;
    const int gstart = prefix - min(prefix, W - 1), wstart = pos - min(pos + 1, W) + 1;
    const int* table = block_tables + (size_t)b * tab_width;
    const long long off = (long long)b * M;
    const int row = base + t;

    for (int i = tid; i < G * D; i += SA_THREADS)
        Qs[i] = to_f32(q[((size_t)row * Hq + g * (Hq / Hkv)) * D + i]) * (scale * LOG2E_F);

    float m[GM], l[GM], acc[GM][NJ];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = NEG_INF; l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[h][j] = 0.0f;
    }
    const size_t kv_stride = (size_t)Hkv * D;
    const T* kb = k_cache + (size_t)g * D;
    const T* vb = v_cache + (size_t)g * D;
    const int n_entries = lens[t];
    const int* crow = combined + (size_t)t * Kc;
    const int E = max(1, min(SA_THREADS, SA_KCAP / R));  // entries per chunk: their keys always fit the list
    float* P = Ps + warp * GM * 32;

    for (int e0 = 0; e0 < n_entries; e0 += E) {
        // Expand entries e0 .. e0+E-1 into cache slots: this thread's entry covers keys [k0, k0 + cnt).
        int k0 = 0, cnt = 0;
        if (tid < E && e0 + tid < n_entries) {
            const int r = crow[e0 + tid];
            if (r >= 0) {
                const long long local = (long long)r - off;
                if (local >= 0 && local < N) {  // key block `local`: its tokens before the window
                    k0 = (int)local * R;
                    cnt = max(0, min(min(k0 + R, wstart), L) - k0);
                } else if (local >= N && local < M) {  // window token
                    k0 = gstart + (int)(local - N);
                    cnt = k0 >= 0 && k0 < L ? 1 : 0;
                }
            }
        }
        int total;
        __syncthreads();  // the previous chunk's slots are consumed (and Qs written on the first pass)
        {
            const int lane_ = lane;
            int x = cnt;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane_ >= o) x += y;
            }
            if (lane_ == 31) warp_sums[warp] = x;
            __syncthreads();
            int before = x - cnt;
            for (int w = 0; w < warp; w++) before += warp_sums[w];
            total = warp_sums[0] + warp_sums[1] + warp_sums[2] + warp_sums[3];
            for (int c = 0; c < cnt; c++) slots[before + c] = cache_slot(table, k0 + c, bs, num_blocks);  // cnt <= R
        }
        __syncthreads();
        // Warps take 32-key tiles in turn.
        for (int k_base = warp * 32; k_base < total; k_base += 4 * 32) {
            const int kidx = k_base + lane;
            const bool valid = kidx < total;
            float s[GM];
#pragma unroll
            for (int h = 0; h < GM; h++) s[h] = 0.0f;
            if (valid) {
                const T* kr = kb + (size_t)slots[kidx] * kv_stride;
                if constexpr (VEC) {
                    constexpr int PER = 16 / sizeof(T);
#pragma unroll
                    for (int d0 = 0; d0 < D; d0 += PER) {
                        Chunk<T> ch;
                        ch.u = *reinterpret_cast<const uint4*>(kr + d0);
                        float kf[PER];
#pragma unroll
                        for (int e = 0; e < PER; e++) kf[e] = to_f32(ch.e[e]);
#pragma unroll
                        for (int h = 0; h < GM; h++) {
                            if (h < G) {
#pragma unroll
                                for (int e = 0; e < PER; e++) s[h] += Qs[h * D + d0 + e] * kf[e];
                            }
                        }
                    }
                } else {
                    for (int d = 0; d < D; d++) {
                        const float kf = to_f32(kr[d]);
#pragma unroll
                        for (int h = 0; h < GM; h++)
                            if (h < G) s[h] += Qs[h * D + d] * kf;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) continue;
                float v = valid ? s[h] : NEG_INF;
                float mx = v;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float mn = fmaxf(m[h], mx);  // finite: lane 0's key is valid in every tile
                const float alpha = exp2f(m[h] - mn);
                const float p = valid ? exp2f(v - mn) : 0.0f;
                m[h] = mn;
                l[h] = l[h] * alpha + p;  // per-lane partial sum (alpha is warp-uniform)
#pragma unroll
                for (int j = 0; j < NJ; j++) acc[h][j] *= alpha;
                P[h * 32 + lane] = p;
            }
            __syncwarp();
            const int nk = min(32, total - k_base);
            for (int k = 0; k < nk; k++) {
                const int slot = slots[k_base + k];
                float v[NJ];
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    const int d = lane + 32 * j;
                    v[j] = d < D ? to_f32(vb[(size_t)slot * kv_stride + d]) : 0.0f;
                }
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    if (h >= G) continue;
                    const float p = P[h * 32 + k];
#pragma unroll
                    for (int j = 0; j < NJ; j++) acc[h][j] += p * v[j];
                }
            }
            __syncwarp();
        }
    }
    // Merge the 4 warps: each writes (m, l, acc) per head; then thread (h, d) combines.
#pragma unroll
    for (int h = 0; h < GM; h++) {
        if (h >= G) continue;
        float lt = l[h];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, o);
        float* mg = Mg + (warp * GM + h) * (D + 2);
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (lane + 32 * j < D) mg[lane + 32 * j] = acc[h][j];
        if (lane == 0) { mg[D] = m[h]; mg[D + 1] = lt; }
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += SA_THREADS) {
        const int h = i / D, d = i % D;
        float mx = NEG_INF;
        for (int w = 0; w < 4; w++) mx = fmaxf(mx, Mg[(w * GM + h) * (D + 2) + D]);
        float num = 0.0f, den = 0.0f;
        if (mx != NEG_INF) {
            for (int w = 0; w < 4; w++) {
                const float* mg = Mg + (w * GM + h) * (D + 2);
                const float a = exp2f(mg[D] - mx);  // a warp that saw no key has m = -inf: a = 0
                num += a * mg[d];
                den += a * mg[D + 1];
            }
        }
        out[((size_t)row * Hq + g * (Hq / Hkv) + h) * D + d] = from_f32<T>(den > 0.0f ? num * __frcp_rn(den) : 0.0f);
    }
}

#define SA_INSTANCE_G(T, D, GM)                                                                                  \
    template __global__ void sparse_attention<T, D, GM>(const T*, const T*, const T*, const int*, int, const int*, \
                                                        int, const int*, const int*, int, const int*, int, int, int, \
                                                        int, int, int, float, int, int, T*);
#define SA_INSTANCE(T, D) SA_INSTANCE_G(T, D, 8) SA_INSTANCE_G(T, D, 16)
#define SP_INSTANCES(T)                                                                                          \
    template __global__ void sparse_compress_keys<T>(const T*, const int*, int, const int*, int, int, int, int,   \
                                                     int, int, float*);                                          \
    template __global__ void sparse_query_means<T>(const T*, const int*, int, const int*, int, int, int, int, int, \
                                                   int, float*);                                                 \
    SA_INSTANCE(T, 8) SA_INSTANCE(T, 16) SA_INSTANCE(T, 32) SA_INSTANCE(T, 64) SA_INSTANCE(T, 128)
SP_INSTANCES(float) SP_INSTANCES(__half) SP_INSTANCES(__nv_bfloat16)
