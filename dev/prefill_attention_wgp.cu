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
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <typename T, int D, int BN>
__device__ __forceinline__ void wgp_qk(float (&s)[BN / 8][4], const unsigned char* q_wg, const unsigned char* Kt) {
    float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
    const T* tag = nullptr;  // picks the instruction's dtype
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma_ss(sd, sw128_desc(q_wg + (kk >> 2) * WG_BQ * 128 + (kk & 3) * 32, 16),
                 sw128_desc(Kt + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16), kk > 0, tag);
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
    constexpr int STAGES = 3, Q_BYTES = WG_BQ * D * 2, KV_BYTES = BN * D * 2, UPR = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    unsigned char* Ks = Qs + Q_BYTES;            // [STAGES][KV_BYTES]
    unsigned char* Vs = Ks + STAGES * KV_BYTES;  // [STAGES][KV_BYTES]
    __shared__ int s_slot[STAGES][BN];           // cache slots of the keys of tiles in flight (-1: none)

    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv), tid = threadIdx.x;
    const int q0 = (gridDim.z - 1 - blockIdx.z) * WG_BQ;  // heaviest query tiles are scheduled first
    const Seq sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    if (q0 >= sq.n) return;  // whole block: before any barrier
    const int sp = sq.start, n_tokens = sq.n;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int kv_len = min(sp + min(q0 + WG_BQ, n_tokens), sq.len);  // keys up to the block's last query
    const int n_kt = max(1, (kv_len + BN - 1) / BN);  // >= 1: zero keys (bad input) give 0, not NaN
    const int* table = block_tables + (size_t)b * M;
    const size_t kv_stride = (size_t)Hkv * D;
    const T* kb = k_cache + (size_t)kvh * D;
    const T* vb = v_cache + (size_t)kvh * D;

    // Slots of tiles 0..2; Q (zeros past the sequence's rows) and tile 0 in one cp.async group, tile 1 in the next.
#pragma unroll
    for (int t = 0; t < STAGES; t++)
        if (tid < BN) s_slot[t][tid] = key_slot(table, t * BN + tid, kv_len, block_size, num_blocks);
    const T* qb = q + ((size_t)sq.qs * Hq + h) * D;
#pragma unroll
    for (int i = 0; i < WG_BQ * UPR / 256; i++) {
        const int cc = tid + i * 256, r = cc / UPR, u = cc % UPR;
        const bool ok = q0 + r < n_tokens;
        cp_async16(Qs + sw128_offset(WG_BQ, r, u), qb + (ok ? (size_t)(q0 + r) * Hq * D : 0) + u * 8, ok);
    }
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
    const T* tag = nullptr;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float (&od)[D / 2] = reinterpret_cast<float (&)[D / 2]>(o);
    const unsigned char* q_wg = Qs + wg * 64 * 128;
    unsigned p[BN / 16][4];  // P of the tile whose P V is next, as the A operand of its k-steps

    // Tile 0: S, softmax, P (O is still 0: nothing to overlap).
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
    if (0 <= wg_last) {  // warpgroup-uniform
        float s[BN / 8][4];
        float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
        wgmma_fence();
        wgp_qk<T, D, BN>(s, q_wg, Ks);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_keep(sd);
        float mx0 = NEG_INF, mx1 = NEG_INF, a0, a1;
        causal_scale_tile<BN>(s, sl2, BN - 1 > wg_first, 0, c, pos0, pos1, mx0, mx1);
        softmax_rows<BN, false>(s, mx0, mx1, m0, m1, l0, l1, a0, a1);  // tile 0 holds key 0: every row sees one
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) p_fragment<T, BN>(p[kk], s, kk);
    }

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
        float s[BN / 8][4];
        float (&sd)[BN / 2] = reinterpret_cast<float (&)[BN / 2]>(s);
        wgmma_keep(od);  // o rescaled and p written by ordinary instructions: all of it before the fence
        wgmma_keep(p);
        wgmma_fence();
        if (next) {
            wgp_qk<T, D, BN>(s, q_wg, Ks + ((j + 1) % STAGES) * KV_BYTES);
            wgmma_commit();
        }
        if (cur) {
            const unsigned char* Vt = Vs + (j % STAGES) * KV_BYTES;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)  // keys 16kk.. are 2 8-row groups of every column chunk: +2 KB
                wgmma_rs(od, p[kk], sw128_desc(Vt + kk * 2048, BN * 128), tag);
            wgmma_commit();
        }
        float a0 = 1.0f, a1 = 1.0f;
        if (next) {  // S(j + 1) is done; its softmax runs while P(j) V(j) may still be on the tensor cores
            wgmma_wait<1>();
            wgmma_keep(sd);
            float mx0 = NEG_INF, mx1 = NEG_INF;
            causal_scale_tile<BN>(s, sl2, k1 + BN - 1 > wg_first, k1, c, pos0, pos1, mx0, mx1);
            softmax_rows<BN, false>(s, mx0, mx1, m0, m1, l0, l1, a0, a1);
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

    const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
    T* ob = out + ((size_t)sq.qs * Hq + h) * D;
    store_tile_rows<T, D>(ob + (size_t)t0 * Hq * D, ob + (size_t)t1 * Hq * D, t0, t1, n_tokens, o, l0, l1, lane);
#else
    __trap();  // built for sm_90a only
#endif
}
