// gemm_skinny.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for 1-32 rows m, on tensor cores: the small projections of
// a decode step at batch 2-32 (the step plan, toolkit/model/plan.py, routes qkv and o here, where it
// measured faster than cuBLAS; experiments/NOTEBOOK.md, "A tensor-core GEMM for 2-32 rows, second attempt").
// Like gemv.cu this is a weight stream (each weight byte is used M <= 32 times, far too few to be
// compute-bound), so what matters is how many weight bytes are in flight, and that the step's kernels keep
// overlapping (PDL: cuBLAS's kernels do not take part, so each one drains the GPU before it starts).
//
// Layout (row-major, HF's [out, in] weights): x T[M, K]; w T[N, K]; y TO[M, N] (TO = T, or float for logits).
// T is bf16 or fp16 (fp32 stays on cuBLAS); K % 32 == 0, 16-byte aligned rows (the wrapper checks).
//
// The product is computed transposed, y^T = w x^T, so that the long dimension (weight rows) is mma.m16n8k16's
// 16-row A operand and the batch is its 8-column B operand: NT = ceil(M / 8) n-tiles, MT m-tiles of 16 weight rows.
// Work split (toolkit/backends/cuda_gemm.py's skinny_plan picks MT, the warps a block WK and the slices S):
//   - a block owns one tile of 16 * MT weight rows and one of S equal slices of K; its WK warps split the slice,
//     warp w taking its 32-wide chunks w, w + WK, ...; each warp keeps PF chunks of weights and x in flight (a
//     ring of registers), the first PF chunks of weights issued before it waits for the previous kernel (PDL:
//     the weights are constants);
//   - then the warps' fp32 partial tiles meet in shared memory and are added in warp order. With S == 1 the
//     block writes y. With S > 1 it writes its slice's tile to ws and counts itself in counters[tile]; the last
//     of the S blocks adds the S tiles in slice order and writes y. Either way the sums run in a fixed order: the
//     same bits on every launch, graph or eager.
// S is 1 except where the tiles alone leave SMs idle and K is long (the down projection: 56 tiles of 4,864
// columns at Qwen2.5-0.5B). (The previous attempt, gemm_small in experiments/logs/gemm_small_experiments.log,
// split K into up to 19 slices and was slowest where its last block then read them all. A persistent version of
// this kernel, a block looping over tiles with its ring running on across them, measured slower at every shape:
// experiments/logs/gemm_skinny_persistent.log.)
//
// Fragments without ldmatrix or shared memory. mma.m16n8k16 (mma.cuh) wants lane (g = lane / 4, c = lane % 4)
// to hold k = 2c, 2c+1, 2c+8, 2c+9 of its A rows g, g+8 and of its B column g. A dot product does not care which
// physical k is called which logical k, as long as A and B agree, so lane c instead loads the 8 contiguous
// elements [8c, 8c + 8) of each 32-wide chunk (one 16-byte load a row; the 4 lanes of a row read 64 contiguous
// bytes), and mma step s (0, 1) treats words 2s, 2s + 1 of them as its logical k (2c, 2c+1) and (2c+8, 2c+9).
// tests/test_gemm_skinny_layout.py replays this mapping in NumPy.
//
// x is read through L2 (__ldcg): the previous kernel just wrote it, and with PDL a line cached in this SM's L1
// before that write must not be read (gemm_small's __ldg version once decoded other tokens).
//
// SWIGLU (gate_up, w = [2I, K]): the block's m-tile 0 is gate rows j0..j0+15 and m-tile 1 the up rows
// I + j0..; the epilogue writes y[m, j] = swiglu(T(gate), T(up)) (elementwise.cuh), the bits silu_mul would
// write from this kernel's gate_up, so gate_up is never written and silu_mul never launched.
//
// gemm_skinny_rope (the qkv projection of a decode step, the plan's skinny_rope): rope_qkv's work as the
// epilogue, so qkv is never written and rope_qkv never launched. RoPE pairs dims i and i + D/2 of a head, and the
// mma tile's 16 rows are two halves of 8 (lane g holds rows g and g + 8), so tile t of head h = t / (D/16) streams
// weight rows h D + 8q + g (the first half, q = t % (D/16)) and h D + D/2 + 8q + g (the second): each lane ends
// with both members of its pairs. The epilogue is rope.cu's, value for value: T(y) (+ bias, rounded to T), the
// rotation at positions[m] (rope.cuh's rope_pair), q to q_out, k and v to the caches at slot_mapping[m], with the
// same skips (a position outside the table: no write; a padding slot: q only). Not for Qwen3's q/k norms, which
// need the whole head. The positions, slots, cos/sin and bias are staged before the step, so they are read
// before the PDL wait, while the previous kernel runs.
#include "dtype.cuh"
#include "elementwise.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "rope.cuh"

constexpr int GS_K = 32;  // k per chunk: 2 mma k-steps, one 16-byte load per lane and row

// Chunks in flight per warp: a ring slot holds 2 * MT weight and NT x registers (16-byte each); about 16 of them
// in all keeps a thread within 128 registers (the launch bound) without spilling (MT = 2, NT = 1 at 3 slots
// spilled, so MT = 2 keeps 2).
template <int MT, int NT> struct Ring {
    static constexpr int slot = 2 * MT + NT;
    static constexpr int pf = MT == 2 || 16 / slot < 2 ? 2 : (16 / slot > 4 ? 4 : 16 / slot);
};

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a constant after unrolling
}

// The end of a block: red[warp][f][lane] holds each warp's partial tile, f = (i * NT + j) * 4 + r. Entry
// e = f * 32 + lane: register r of (m-tile i, n-tile j) in lane (g, c), i.e. weight row 16 i + g + 8 (r / 2) of the
// tile and batch row 8 j + 2 c + r % 2, summed over the warps in order; then over the S slices in order.
template <typename T, typename TO, bool SWIGLU>
__device__ __forceinline__ void store_out(TO* y, int M, int N, int m, int n, float v, float u) {
    if (m >= M || n >= N) return;
    if constexpr (SWIGLU) {
        // elementwise.cuh: silu_mul's roundings. (TO == T when SWIGLU; the cast only satisfies the compiler.)
        reinterpret_cast<T*>(y)[(size_t)m * N + n] = swiglu(from_f32<T>(v), from_f32<T>(u));
    } else {
        y[(size_t)m * N + n] = from_f32<TO>(v);
    }
}

// How a block's accumulators pair up in the epilogue. PLAIN: every entry alone. SWIGLU: entry e of m-tile 0 (gate)
// with e + NT * 128 of m-tile 1 (up). ROPE (MT = 1): register r < 2 of a lane (row g, the pair's first half) with
// r + 2 (row g + 8, its second half), entry e + 64. E: the entries that lead a pair; lead(o): the o-th of them.
constexpr int GS_PLAIN = 0, GS_SWIGLU = 1, GS_ROPE = 2;
template <int EPI, int MT, int NT> struct Pairs {
    static constexpr int F = MT * NT * 4;
    static constexpr int E = (EPI == GS_PLAIN ? F : F / 2) * 32;
    static constexpr int partner = EPI == GS_SWIGLU ? NT * 4 * 32 : 64;
    __device__ static int lead(int o) { return EPI == GS_ROPE ? (o >> 6) * 128 + (o & 63) : o; }
};

// The warps' partial tiles summed in warp order, then (S > 1) the slices in slice order by the last block of the
// tile; store(e, v, u) writes entry e's value v (and its partner's, u) however the epilogue wants.
template <int EPI, int MT, int NT, typename Store>
__device__ __forceinline__ void finish_tile(const float* red, float* ws, unsigned* counters, bool* s_last, int tile,
                                            int slice, int S, int tiles, int WK, Store store) {
    using P = Pairs<EPI, MT, NT>;
    constexpr int F = P::F, UP = P::partner;
    float* mine = ws + ((size_t)slice * tiles + tile) * F * 32;
    for (int o = threadIdx.x; o < P::E; o += blockDim.x) {
        const int e = P::lead(o);
        float v = 0.0f, u = 0.0f;
        for (int q = 0; q < WK; q++) v += red[q * F * 32 + e];
        if constexpr (EPI != GS_PLAIN)
            for (int q = 0; q < WK; q++) u += red[q * F * 32 + UP + e];
        if (S > 1) {
            mine[e] = v;
            if constexpr (EPI != GS_PLAIN) mine[UP + e] = u;
            continue;
        }
        store(e, v, u);
    }
    if (S == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *s_last = atomicAdd(&counters[tile], 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!*s_last) return;
    __threadfence();
    for (int o = threadIdx.x; o < P::E; o += blockDim.x) {
        const int e = P::lead(o);
        float v = 0.0f, u = 0.0f;
        for (int q = 0; q < S; q++) {  // L2 reads (__ldcg): other blocks wrote these
            const float* part = ws + ((size_t)q * tiles + tile) * F * 32;
            v += __ldcg(part + e);
            if constexpr (EPI != GS_PLAIN) u += __ldcg(part + UP + e);
        }
        store(e, v, u);
    }
    if (threadIdx.x == 0) counters[tile] = 0u;  // ready for the next launch (graph replays included)
}

// Weight row of lane row g, half h (rows g or g + 8 of the mma tile) of m-tile i of tile `tile` (see the header;
// PLAIN and SWIGLU rows past the end are clamped to the last row: loaded, never stored; ROPE tiles are whole).
template <int EPI, int MT>
__device__ __forceinline__ int weight_row(int tile, int i, int h, int g, int N, int D) {
    if constexpr (EPI == GS_ROPE) {
        const int tph = D / 16, head = tile / tph;  // tiles a head
        return head * D + h * (D / 2) + 8 * (tile % tph) + g;
    } else if constexpr (EPI == GS_SWIGLU) {
        return min(tile * 16 + 8 * h + g, N - 1) + (i ? N : 0);
    } else {
        return min(tile * 16 * MT + 16 * i + 8 * h + g, N - 1);
    }
}

// The loop every form shares: this block's tile (gridDim.x tiles) of one slice of K (gridDim.y slices), each
// warp's partial tile left in red[warp][F][32] (shared), then a barrier. pre() runs between the first weight loads
// and the PDL wait: where an epilogue reads step constants (gemm_skinny_rope), they load while the previous
// kernel still runs. post() runs right after the wait, with x's first loads in flight: where an epilogue reads
// what earlier kernels wrote (gemm_skinny_norm's residual), its loads overlap x's.
template <typename T, int MT, int NT, int EPI, typename Pre, typename Post>
__device__ __forceinline__ void skinny_partials(const T* __restrict__ x, const T* __restrict__ w, float* red, int M,
                                                int N, int K, int D, Pre pre, Post post) {
    constexpr int PF = Ring<MT, NT>::pf;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int WK = blockDim.x >> 5, S = gridDim.y, cps = K / GS_K / S;  // chunks a slice
    const int nck = (cps - warp + WK - 1) / WK;  // this warp's chunks (>= 1: cps >= WK)
    const int tile = blockIdx.x, kc0 = blockIdx.y * cps + warp;  // this warp's first chunk

    // Lane (g, c) streams weight rows (tile i, half h) = weight_row(...), elements [8c, 8c + 8) of chunks kc0,
    // kc0 + WK, ...
    const uint4* wrow[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wrow[i][h] = reinterpret_cast<const uint4*>(w + (size_t)weight_row<EPI, MT>(tile, i, h, g, N, D) * K) +
                         kc0 * 4 + c;
    // x rows 8 j + g of n-tile j (rows past M are zeros, never loaded: their columns are never stored).
    const uint4* xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        xok[j] = 8 * j + g < M;
        xrow[j] = reinterpret_cast<const uint4*>(x + (size_t)(xok[j] ? 8 * j + g : 0) * K) + kc0 * 4 + c;
    }
    const int step = WK * 4;  // uint4 from one of this warp's chunks to its next
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    uint4 wv[PF][MT][2], xv[PF][NT];
#pragma unroll
    for (int p = 0; p < PF; p++)
        if (p < nck)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) wv[p][i][h] = __ldg(wrow[i][h] + p * step);
    pre();
    pdl_enter();  // x comes from the previous kernel
#pragma unroll
    for (int p = 0; p < PF; p++)
        if (p < nck)
#pragma unroll
            for (int j = 0; j < NT; j++) xv[p][j] = xok[j] ? __ldcg(xrow[j] + p * step) : zero;
    post();

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    for (int base = 0; base < nck; base += PF) {
#pragma unroll
        for (int p = 0; p < PF; p++) {
            const int t = base + p;
            if (t < nck) {  // warp-uniform
#pragma unroll
                for (int s = 0; s < 2; s++)
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        const unsigned a[4] = {word(wv[p][i][0], 2 * s), word(wv[p][i][1], 2 * s),
                                               word(wv[p][i][0], 2 * s + 1), word(wv[p][i][1], 2 * s + 1)};
#pragma unroll
                        for (int j = 0; j < NT; j++)
                            mma(acc[i][j], a, word(xv[p][j], 2 * s), word(xv[p][j], 2 * s + 1),
                                static_cast<const T*>(nullptr));
                    }
                const int nxt = t + PF;  // refill this slot with the chunk PF ahead
                if (nxt < nck) {
#pragma unroll
                    for (int i = 0; i < MT; i++)
#pragma unroll
                        for (int h = 0; h < 2; h++) wv[p][i][h] = __ldg(wrow[i][h] + nxt * step);
#pragma unroll
                    for (int j = 0; j < NT; j++) xv[p][j] = xok[j] ? __ldcg(xrow[j] + nxt * step) : zero;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) red[((warp * MT + i) * NT + j) * 128 + r * 32 + lane] = acc[i][j][r];
    __syncthreads();
}

// x T[M, K], w T[N, K] (SWIGLU: [2N, K], N = I), y TO[M, N]; ws float[S, tiles, F * 32] and counters[tiles]
// (zero, and left zero) when S > 1. Grid (tiles, S): tiles = ceil(N / (16 * MT)) (SWIGLU: ceil(N / 16)); S divides
// K / 32 into slices of at least WK chunks. Block: WK warps (blockDim.x = 32 WK). Dynamic shared memory:
// WK * F * 32 floats.
template <typename T, typename TO, int MT, int NT, bool SWIGLU>
__global__ void __launch_bounds__(512)
gemm_skinny(const T* __restrict__ x, const T* __restrict__ w, TO* __restrict__ y, float* __restrict__ ws,
            unsigned* __restrict__ counters, int M, int N, int K) {
    static_assert(!SWIGLU || MT == 2, "SWIGLU pairs m-tile 0 (gate) with m-tile 1 (up)");
    constexpr int EPI = SWIGLU ? GS_SWIGLU : GS_PLAIN;
    constexpr int ROWS = SWIGLU ? 16 : 16 * MT;  // output columns a tile
    extern __shared__ __align__(16) float gs_red[];  // [WK][F][32]
    __shared__ bool s_last;
    skinny_partials<T, MT, NT, EPI>(x, w, gs_red, M, N, K, 0, [] {}, [] {});
    const int tile = blockIdx.x;
    finish_tile<EPI, MT, NT>(gs_red, ws, counters, &s_last, tile, blockIdx.y, gridDim.y, gridDim.x,
                             blockDim.x >> 5, [&](int e, float v, float u) {
        const int f = e >> 5, ln = e & 31, r = f & 3, j = (f >> 2) % NT, i = f / (NT * 4);
        store_out<T, TO, SWIGLU>(y, M, N, 8 * j + 2 * (ln & 3) + (r & 1),
                                 tile * ROWS + 16 * i + (ln >> 2) + 8 * (r >> 1), v, u);
    });
}

// The qkv projection with rope_qkv's epilogue (see the header). x T[M, K]; w T[(Hq + 2 Hkv) D, K]; bias T[that]
// or null; cos, sin float[n_pos, D/2]; positions, slot_mapping int[M]; q_out T[M, Hq, D]; k_cache, v_cache
// T[num_slots, Hkv, D]. Grid (N / 16, S), block WK warps, ws and counters as gemm_skinny's (MT = 1); D % 16 == 0.
template <typename T, int NT>
__global__ void __launch_bounds__(512)
gemm_skinny_rope(const T* __restrict__ x, const T* __restrict__ w, float* __restrict__ ws,
                 unsigned* __restrict__ counters, int M, int K, const T* __restrict__ bias,
                 const float* __restrict__ cos_t, const float* __restrict__ sin_t, const int* __restrict__ positions,
                 const int* __restrict__ slot_mapping, int Hq, int Hkv, int D, int n_pos, int num_slots,
                 T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache) {
    extern __shared__ __align__(16) float gs_red[];  // [WK][F][32]
    __shared__ bool s_last;
    __shared__ int s_pos[32], s_slot[32];                   // a row's position (-1: outside the table) and slot
    __shared__ float s_cos[32][8], s_sin[32][8], s_bias[16];  // this tile's 8 pairs at each row's position
    const int N = (Hq + 2 * Hkv) * D, half = D / 2, tile = blockIdx.x, head = tile / (D / 16);
    const int i0 = 8 * (tile % (D / 16));  // the tile's first pair: dims i0..i0+7 and half + those
    skinny_partials<T, 1, NT, GS_ROPE>(x, w, gs_red, M, N, K, D, [&] {
        for (int t = threadIdx.x; t < 8 * M; t += blockDim.x) {
            const int m = t >> 3, k = t & 7, p = positions[m];
            const bool in = (unsigned)p < (unsigned)n_pos;
            s_cos[m][k] = in ? cos_t[(size_t)p * half + i0 + k] : 0.0f;
            s_sin[m][k] = in ? sin_t[(size_t)p * half + i0 + k] : 0.0f;
            if (k == 0) { s_pos[m] = in ? p : -1; s_slot[m] = slot_mapping[m]; }
        }
        const int t = threadIdx.x;
        if (t < 16) s_bias[t] = bias ? to_f32(bias[head * D + (t < 8 ? i0 + t : half + i0 + t - 8)]) : 0.0f;
    }, [] {});  // (skinny_partials ends with a barrier: these are visible to the epilogue)
    finish_tile<GS_ROPE, 1, NT>(gs_red, ws, counters, &s_last, tile, blockIdx.y, gridDim.y, gridDim.x,
                                blockDim.x >> 5, [&](int e, float v, float u) {
        const int f = e >> 5, ln = e & 31, k = ln >> 2;  // pair k of the tile: rows k and k + 8
        const int m = 8 * (f >> 2) + 2 * (ln & 3) + (f & 1);
        if (m >= M || s_pos[m] < 0) return;  // past the batch; a position outside the table writes nothing
        float a = rnd<T>(v), b = rnd<T>(u);  // the Linear output, then its bias, each rounded to T (rope.cu)
        if (bias) { a = rnd<T>(a + s_bias[k]); b = rnd<T>(b + s_bias[8 + k]); }
        T* dst;
        if (head < Hq) {
            dst = q_out + ((size_t)m * Hq + head) * D;
        } else {
            const int slot = s_slot[m];
            if ((unsigned)slot >= (unsigned)num_slots) return;  // a padding row (or a bad slot): q only
            const int kv = head - Hq;
            dst = (kv < Hkv ? k_cache : v_cache) + ((size_t)slot * Hkv + kv % Hkv) * D;
        }
        if (head < Hq + Hkv) rope_pair(a, b, s_cos[m][k], s_sin[m][k]);  // v heads are not rotated
        dst[i0 + k] = from_f32<T>(a);
        dst[half + i0 + k] = from_f32<T>(b);
    });
}

// The o projection with add_rmsnorm's residual add as its epilogue, and the RMSNorm split in two (gemm_skinny_norm,
// the plan's skinny_norm; experiments/NOTEBOOK.md, "Can the post-attention RMSNorm move into the o projection?").
// RMSNorm(h) * w = inv(h) * (h * w), with inv(h) = rsqrt(mean(h^2) + eps) one number a row: the weight is applied
// here, elementwise, and inv, which needs the whole row, where the product is next used (silu_mul_scaled, after
// the gate_up GEMM: W (inv h * w) = inv W (h * w)). So the add_rmsnorm between the o projection and gate_up is
// never launched.
// Epilogue, for output (m, n) of this tile: o = T(y) (the o projection as it would be written), then add_rmsnorm's
// add, h = T(float(residual) + float(o)) written back (the same bits as add_rmsnorm's residual), x_out = T(h * w[n])
// for the gate_up GEMM, and parts[tile][m] = the sum of h^2 over the tile's 16 columns, in column order
// (silu_mul_scaled adds the tiles in tile order). MT = 1; N % 16 == 0. residual, x_out T[M, N]; norm_w T[N];
// parts float[N / 16][M]. The residual is read after the PDL wait (post): this layer's input norm wrote it.
template <typename T, int NT>
__global__ void __launch_bounds__(512)
gemm_skinny_norm(const T* __restrict__ x, const T* __restrict__ w, float* __restrict__ ws,
                 unsigned* __restrict__ counters, int M, int N, int K, T* __restrict__ residual,
                 const T* __restrict__ norm_w, T* __restrict__ x_out, float* __restrict__ parts) {
    extern __shared__ __align__(16) float gs_red[];  // [WK][F][32]
    __shared__ bool s_last;
    __shared__ float s_h[32][16], s_w[16];  // the tile's residual (then h^2) and norm weights
    const int tile = blockIdx.x, n0 = tile * 16;
    skinny_partials<T, 1, NT, GS_PLAIN>(x, w, gs_red, M, N, K, 0, [&] {
        if (threadIdx.x < 16) s_w[threadIdx.x] = to_f32(norm_w[n0 + threadIdx.x]);  // a constant: before the wait
    }, [&] {
        for (int t = threadIdx.x; t < 16 * M; t += blockDim.x)  // L2 reads: another kernel wrote it
            s_h[t >> 4][t & 15] = to_f32(__ldcg(residual + (size_t)(t >> 4) * N + n0 + (t & 15)));
    });  // (skinny_partials ends with a barrier: these are visible to the epilogue)
    finish_tile<GS_PLAIN, 1, NT>(gs_red, ws, counters, &s_last, tile, blockIdx.y, gridDim.y, gridDim.x,
                                 blockDim.x >> 5, [&](int e, float v, float) {
        const int f = e >> 5, ln = e & 31, r = f & 3;
        const int m = 8 * (f >> 2) + 2 * (ln & 3) + (r & 1), k = (ln >> 2) + 8 * (r >> 1);
        if (m >= M) return;
        const size_t at = (size_t)m * N + n0 + k;
        const T h = from_f32<T>(s_h[m][k] + to_f32(from_f32<T>(v)));  // add_rmsnorm's add of the rounded output
        const float hf = to_f32(h);
        residual[at] = h;
        x_out[at] = from_f32<T>(hf * s_w[k]);
        s_h[m][k] = hf * hf;  // (this thread's own entry: read above, so no other thread touches it)
    });
    if (gridDim.y > 1 && !s_last) return;  // another slice's block adds the tile and finishes it
    __syncthreads();
    if (threadIdx.x < M) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++) ss += s_h[threadIdx.x][k];
        parts[(size_t)tile * M + threadIdx.x] = ss;
    }
}
