// prefill_attention_wgp<T, D, BN>: a dev variant of kernels/prefill_attention.cu's prefill_attention_wg, appended to
// that source by dev/prefill_attention.py (it uses the op's Seq, key_slot, load_sw128_slots and WG_BQ). Same
// arguments, grid and output; smem (128 + 6 * BN) * D * 2 bytes + 1 KB.
//
// What it tries: FlashAttention-3's intra-warpgroup overlap. wg runs, per tile, S = Q K^T, then the softmax, then
// O += P V, each waiting for the one before, so the tensor cores idle through every softmax. Here a warpgroup issues
// S(j+1) = Q K(j+1)^T and O += P(j) V(j) together, waits for S(j+1) only, and runs its softmax while P(j) V(j) is
// still on the tensor cores; O's rescale by the new row maxima waits for that GEMM (O(j) is exact relative to m(j),
// so scaling it afterwards by exp2(m(j) - m(j+1)) is the same arithmetic as before).
// K(j+1) must then be in smem while V(j) is read: a ring of 3 K/V stages, one __syncthreads a tile (wg has two).
// Tile j+2 is gathered right after the barrier that opens iteration j, so it has one whole tile of math to land.
// Where a block of either variant works: q head h, its kv head's K/V columns (kb, vb), query tile q0 of sequence
// blockIdx.y (the heaviest tiles scheduled first), and the keys its queries see: kv_len, up to the block's last query,
// in n_kt BN-key tiles (>= 1: zero keys, bad input, give 0, not NaN). The same arithmetic as prefill_attention_wg's
// opening lines, which stay inline there (a helper changed that kernel's machine code, and it is the product's).
template <typename T>
struct WgBlock {
    Seq sq;
    int h, q0, kv_len, n_kt;
    const int* table;  // the sequence's block-table row
    const T* kb;       // K and V of its kv head (rows Hkv * D apart)
    const T* vb;
};

template <typename T, int D, int BN>
__device__ __forceinline__ WgBlock<T> wg_block(const T* k_cache, const T* v_cache, const int* block_tables,
                                               const int* query_start_loc, const int* seq_lens, int block_size, int M,
                                               int Hq, int Hkv) {
    WgBlock<T> w;
    w.h = blockIdx.x;
    const int b = blockIdx.y, kvh = w.h / (Hq / Hkv);
    w.q0 = (gridDim.z - 1 - blockIdx.z) * WG_BQ;
    w.sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    w.kv_len = min(w.sq.start + min(w.q0 + WG_BQ, w.sq.n), w.sq.len);
    w.n_kt = max(1, (w.kv_len + BN - 1) / BN);
    w.table = block_tables + (size_t)b * M;
    w.kb = k_cache + (size_t)kvh * D;
    w.vb = v_cache + (size_t)kvh * D;
    return w;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A tile's scores to P (log2 units, causal mask where the tile reaches past the warpgroup's first row), the row
// maxima and sums updated; a0, a1: O's factor.
template <int BN>
__device__ __forceinline__ void wgp_softmax(float (&s)[BN / 8][4], float sl2, int k0, int wg_first, int c, int pos0,
                                            int pos1, float& m0, float& m1, float& l0, float& l1, float& a0,
                                            float& a1) {
    float mx0 = NEG_INF, mx1 = NEG_INF;
    causal_scale_tile<BN>(s, sl2, k0 + BN - 1 > wg_first, k0, c, pos0, pos1, mx0, mx1);
    softmax_rows<BN, false>(s, mx0, mx1, m0, m1, l0, l1, a0, a1);  // tile 0 holds key 0: every row sees a key
}

// S = Q K^T of a tile, issued and waited.
template <typename T, int D, int BN>
__device__ __forceinline__ void wg_scores(float (&s)[BN / 8][4], const unsigned char* q_wg, const unsigned char* Kt) {
    float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
    wgmma_fence();
    wg_qk<T, D, BN>(s, q_wg, Kt);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(sd);
}

// Tile 0 (its first key k0): S, its softmax and P, waited (O is still 0: nothing to overlap).
template <typename T, int D, int BN>
__device__ __forceinline__ void wgp_first(unsigned (&p)[BN / 16][4], const unsigned char* q_wg,
                                          const unsigned char* Kt, int k0, float sl2, int wg_first, int c, int pos0,
                                          int pos1, float& m0, float& m1, float& l0, float& l1) {
    float s[BN / 8][4];
    wg_scores<T, D, BN>(s, q_wg, Kt);
    float a0, a1;
    wgp_softmax<BN>(s, sl2, k0, wg_first, c, pos0, pos1, m0, m1, l0, l1, a0, a1);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) p_fragment<T, BN>(p[kk], s, kk);
}

// One round of the overlapped loop, between the K/V waits and the release of tile j: issue S(j+1) (if next) and
// O += P(j) V(j) (if cur), let the other warpgroup go (turn: ping-pong only), run S(j+1)'s softmax while P(j) V(j)
// runs, then wait for it, rescale O and make P(j+1).
template <typename T, int D, int BN, typename Turn>
__device__ __forceinline__ void wgp_round(float (&o)[D / 8][4], unsigned (&p)[BN / 16][4], bool cur, bool next,
                                          const unsigned char* q_wg, const unsigned char* Kn, const unsigned char* Vt,
                                          int k1, float sl2, int wg_first, int c, int pos0, int pos1, float& m0,
                                          float& m1, float& l0, float& l1, Turn turn) {
    float (&od)[D / 2] = reinterpret_cast<float (&)[D / 2]>(o);
    float s[BN / 8][4];
    float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
    wgmma_keep(od);  // o rescaled and p written by ordinary instructions: all of it before the fence
    wgmma_keep(p);
    wgmma_fence();
    if (next) {
        wg_qk<T, D, BN>(s, q_wg, Kn);
        wgmma_commit();
    }
    if (cur) {
        wg_pv<T, D, BN>(od, p, Vt);
        wgmma_commit();
    }
    turn();
    float a0 = 1.0f, a1 = 1.0f;
    if (next) {  // S(j + 1) is done; its softmax runs while P(j) V(j) may still be on the tensor cores
        wgmma_wait<1>();
        wgmma_keep(sd);
        wgp_softmax<BN>(s, sl2, k1, wg_first, c, pos0, pos1, m0, m1, l0, l1, a0, a1);
    }
    wgmma_wait<0>();
    wgmma_keep(od);
    wgmma_keep(p);
    if (next) {
        rescale_rows<D>(o, a0, a1);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) p_fragment<T, BN>(p[kk], s, kk);
    }
}
#endif

template <typename T, int D, int BN>
__global__ void __launch_bounds__(256, 1)
prefill_attention_wgp(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                      const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                      const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                      int Hkv, T* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(D % 64 == 0 && BN % 64 == 0 && BN <= 256, "64-element chunks; a slot a thread");
    constexpr int STAGES = 3, Q_BYTES = WG_BQ * D * 2, KV_BYTES = BN * D * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    unsigned char* Ks = Qs + Q_BYTES;            // [STAGES][KV_BYTES]
    unsigned char* Vs = Ks + STAGES * KV_BYTES;  // [STAGES][KV_BYTES]
    __shared__ int s_slot[STAGES][BN];           // cache slots of the keys of tiles in flight (-1: none)

    const WgBlock<T> w = wg_block<T, D, BN>(k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, M,
                                            Hq, Hkv);
    if (w.q0 >= w.sq.n) return;  // whole block: before any barrier
    const Seq sq = w.sq;
    const int h = w.h, q0 = w.q0, kv_len = w.kv_len, n_kt = w.n_kt, sp = sq.start, n_tokens = sq.n, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int* table = w.table;
    const T *kb = w.kb, *vb = w.vb;
    const size_t kv_stride = (size_t)Hkv * D;

    // Slots of tiles 0..2; Q (zeros past the sequence's rows) and tile 0 in one cp.async group, tile 1 in the next.
#pragma unroll
    for (int t = 0; t < STAGES; t++)
        if (tid < BN) s_slot[t][tid] = key_slot(table, t * BN + tid, kv_len, block_size, num_blocks);
    load_sw128_q<T, D>(Qs, q + ((size_t)sq.qs * Hq + h) * D, q0, (size_t)Hq * D, n_tokens);
    __syncthreads();
    load_sw128_slots<T, D, BN>(Ks, kb, s_slot[0], kv_stride);
    load_sw128_slots<T, D, BN>(Vs, vb, s_slot[0], kv_stride);
    cp_async_commit();
    if (n_kt > 1) {
        load_sw128_slots<T, D, BN>(Ks + KV_BYTES, kb, s_slot[1], kv_stride);
        load_sw128_slots<T, D, BN>(Vs + KV_BYTES, vb, s_slot[1], kv_stride);
    }
    cp_async_commit();

    const int pos0 = sp + q0 + warp * 16 + g, pos1 = pos0 + 8;
    const int wg_first = sp + q0 + wg * 64;
    const int wg_last = q0 + wg * 64 < n_tokens ? sp + min(q0 + wg * 64 + 63, n_tokens - 1) : -1;  // -1: no rows
    const float sl2 = scale * LOG2E;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const unsigned char* q_wg = Qs + wg * 64 * 128;
    unsigned p[BN / 16][4];  // P of the tile whose P V is next, as the A operand of its k-steps

    // Tile 0: S, softmax, P (O is still 0: nothing to overlap).
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
    if (0 <= wg_last)  // warpgroup-uniform
        wgp_first<T, D, BN>(p, q_wg, Ks, 0, sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1);

    for (int j = 0; j < n_kt; j++) {
        const int k1 = (j + 1) * BN;  // first key of tile j + 1
        cp_async_wait<0>();           // tile j + 1, this thread's part
        fence_async_smem();
        // Tile j + 1 is in smem, and both warpgroups are past iteration j - 1, whose V stage (j + 2) % 3 now refills.
        __syncthreads();
        if (j + 2 < n_kt) {
            const int st = (j + 2) % STAGES;
            load_sw128_slots<T, D, BN>(Ks + st * KV_BYTES, kb, s_slot[st], kv_stride);
            load_sw128_slots<T, D, BN>(Vs + st * KV_BYTES, vb, s_slot[st], kv_stride);
        }
        cp_async_commit();
        // Tile j's slots were read when its copy was issued (iteration j - 2): tile j + 3's take their place, read
        // after the next barrier.
        if (tid < BN) s_slot[j % STAGES][tid] = key_slot(table, k1 + 2 * BN + tid, kv_len, block_size, num_blocks);

        const bool cur = j * BN <= wg_last, next = j + 1 < n_kt && k1 <= wg_last;  // warpgroup-uniform; next => cur
        wgp_round<T, D, BN>(o, p, cur, next, q_wg, Ks + ((j + 1) % STAGES) * KV_BYTES, Vs + (j % STAGES) * KV_BYTES, k1,
                            sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1, [] {});
    }

    const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
    T* ob = out + ((size_t)sq.qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, n_tokens, o, l0, l1, lane);
#else
    __trap();  // built for sm_90a only
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// prefill_attention_wgpp<T, D, BN>: wgp plus FlashAttention-3's ping-pong of the two warpgroups. Same arguments,
// grid, output and smem as wgp.
//
// wgp's one __syncthreads a tile keeps the two warpgroups in step, so both issue their GEMMs at once and then both
// run their softmax while the tensor cores wait. Here nothing block-wide remains in the loop:
//   - a K/V stage's "full" mbarrier (256 arrivals: each thread once its own cp.async copies of the tile landed and
//     were fenced for the async proxy) replaces the barrier before the GEMMs;
//   - its "empty" mbarrier (256 arrivals: each thread once its warpgroup's P V of the tile is done) guards the refill;
//   - two named barriers take turns: a warpgroup issues its GEMMs only after the other one has issued its own
//     (bar.sync on its id), then lets the other go (bar.arrive on the other's id). So warpgroup 1's GEMMs run while
//     warpgroup 0 does its softmax, and the other way round.
// Each thread gathers its own rows of every tile (the slots of the next tile are read from the block table one
// tile ahead, into registers), so no smem slot list needs guarding either.
// ---------------------------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Barrier ids as immediates: a register id makes ptxas reserve all 16 of the block's barriers.
template <int ID> __device__ __forceinline__ void named_sync() {
    asm volatile("bar.sync %0, 256;\n" ::"n"(ID) : "memory");
}
template <int ID> __device__ __forceinline__ void named_arrive() {
    asm volatile("bar.arrive %0, 256;\n" ::"n"(ID) : "memory");
}

// This thread's rows of a BN-key tile: unit i of the thread is row (tid + 256 i) / UPR, unit (tid + 256 i) % UPR.
template <int D, int BN>
__device__ __forceinline__ void wgpp_slots(int (&slots)[BN * D / 8 / 256], const int* table, int k0, int kv_len,
                                           int block_size, int num_blocks) {
#pragma unroll
    for (int i = 0; i < BN * D / 8 / 256; i++)
        slots[i] = key_slot(table, k0 + (int)(threadIdx.x + i * 256) / (D / 8), kv_len, block_size, num_blocks);
}
template <typename T, int D, int BN>
__device__ __forceinline__ void wgpp_load(unsigned char* Kt, unsigned char* Vt, const T* kb, const T* vb,
                                          const int (&slots)[BN * D / 8 / 256], size_t stride) {
    constexpr int UPR = D / 8;
#pragma unroll
    for (int i = 0; i < BN * UPR / 256; i++) {
        const int cc = threadIdx.x + i * 256, r = cc / UPR, u = cc % UPR, slot = slots[i];
        const size_t off = (slot >= 0 ? (size_t)slot * stride : 0) + u * 8;
        cp_async16(Kt + sw128_offset(BN, r, u), kb + off, slot >= 0);
        cp_async16(Vt + sw128_offset(BN, r, u), vb + off, slot >= 0);
    }
}
#endif

template <typename T, int D, int BN>
__global__ void __launch_bounds__(256, 1)
prefill_attention_wgpp(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                       const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                       const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                       int Hkv, T* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(D % 64 == 0 && BN % 64 == 0 && BN * D / 8 % 256 == 0, "64-element chunks; whole units a thread");
    constexpr int STAGES = 3, Q_BYTES = WG_BQ * D * 2, KV_BYTES = BN * D * 2, UPR = D / 8, UNITS = BN * UPR / 256;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    unsigned char* Ks = Qs + Q_BYTES;            // [STAGES][KV_BYTES]
    unsigned char* Vs = Ks + STAGES * KV_BYTES;  // [STAGES][KV_BYTES]
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];

    const WgBlock<T> w = wg_block<T, D, BN>(k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, M,
                                            Hq, Hkv);
    if (w.q0 >= w.sq.n) return;  // whole block: before any barrier
    const Seq sq = w.sq;
    const int h = w.h, q0 = w.q0, kv_len = w.kv_len, n_kt = w.n_kt, sp = sq.start, n_tokens = sq.n, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int* table = w.table;
    const T *kb = w.kb, *vb = w.vb;
    const size_t kv_stride = (size_t)Hkv * D;

    if (tid == 0) {
#pragma unroll
        for (int st = 0; st < STAGES; st++) { mbar_init(&full[st], 256); mbar_init(&empty[st], 256); }
    }
    // Q and tile 0 in one cp.async group, tile 1 in the next; the slots of tile 2 stay in registers.
    int slots[UNITS];
    wgpp_slots<D, BN>(slots, table, 0, kv_len, block_size, num_blocks);
    load_sw128_q<T, D>(Qs, q + ((size_t)sq.qs * Hq + h) * D, q0, (size_t)Hq * D, n_tokens);
    wgpp_load<T, D, BN>(Ks, Vs, kb, vb, slots, kv_stride);
    cp_async_commit();
    wgpp_slots<D, BN>(slots, table, BN, kv_len, block_size, num_blocks);
    if (n_kt > 1) wgpp_load<T, D, BN>(Ks + KV_BYTES, Vs + KV_BYTES, kb, vb, slots, kv_stride);
    cp_async_commit();
    wgpp_slots<D, BN>(slots, table, 2 * BN, kv_len, block_size, num_blocks);
    __syncthreads();  // the barriers' init before any arrival

    const int pos0 = sp + q0 + warp * 16 + g, pos1 = pos0 + 8;
    const int wg_first = sp + q0 + wg * 64;
    const int wg_last = q0 + wg * 64 < n_tokens ? sp + min(q0 + wg * 64 + 63, n_tokens - 1) : -1;  // -1: no rows
    const float sl2 = scale * LOG2E;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const unsigned char* q_wg = Qs + wg * 64 * 128;
    unsigned p[BN / 16][4];  // P of the tile whose P V is next

    // Tile 0 (and Q): this thread's copies, fenced, then everyone's.
    cp_async_wait<1>();
    fence_async_smem();
    mbar_arrive(&full[0]);
    mbar_wait(&full[0], 0);
    if (0 <= wg_last)  // warpgroup-uniform
        wgp_first<T, D, BN>(p, q_wg, Ks, 0, sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1);
    if (wg == 1) named_arrive<1>();  // warpgroup 0 issues first

    for (int j = 0; j < n_kt; j++) {
        const int k1 = (j + 1) * BN;  // first key of tile j + 1
        if (j + 1 < n_kt) {           // this thread's part of tile j + 1 (copied since iteration j - 1) is in
            cp_async_wait<0>();
            fence_async_smem();
            mbar_arrive(&full[(j + 1) % STAGES]);
        }
        if (j + 2 < n_kt) {  // refill tile j - 1's stage with tile j + 2 once every thread is done with tile j - 1
            const int st = (j + 2) % STAGES;
            if (j >= 1) mbar_wait(&empty[st], ((j - 1) / STAGES) & 1);
            wgpp_load<T, D, BN>(Ks + st * KV_BYTES, Vs + st * KV_BYTES, kb, vb, slots, kv_stride);
            cp_async_commit();
            wgpp_slots<D, BN>(slots, table, k1 + 2 * BN, kv_len, block_size, num_blocks);
        }

        const bool cur = j * BN <= wg_last, next = j + 1 < n_kt && k1 <= wg_last;  // warpgroup-uniform; next => cur
        if (next) mbar_wait(&full[(j + 1) % STAGES], ((j + 1) / STAGES) & 1);
        if (wg == 0) named_sync<1>(); else named_sync<2>();  // the other warpgroup has issued its GEMMs of this round
        // Then its turn, once ours are issued; warpgroup 1's last arrival would meet no bar.sync, so it is left out.
        const auto turn = [&] { if (wg == 0) named_arrive<2>(); else if (j + 1 < n_kt) named_arrive<1>(); };
        wgp_round<T, D, BN>(o, p, cur, next, q_wg, Ks + ((j + 1) % STAGES) * KV_BYTES, Vs + (j % STAGES) * KV_BYTES, k1,
                            sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1, turn);
        mbar_arrive(&empty[j % STAGES]);  // tile j: K read by its S (done), V by this P V (done)
    }

    const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
    T* ob = out + ((size_t)sq.qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, n_tokens, o, l0, l1, lane);
#else
    __trap();  // built for sm_90a only
#endif
}
