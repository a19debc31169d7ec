// prefill_attention_wgt<T, D, BN, LOOP, FAST>: dev variants of prefill_attention_wg whose K/V tiles arrive by TMA,
// appended by dev/prefill_attention.py after the op's source and dev/prefill_attention_wgp.cu (it uses their Seq,
// wg_keys, wg_store, load_sw128_q, mbar_* and wgp_* helpers). Same arguments as prefill_attention_wg, then the two tensor
// maps (K and V of the layer: a [num_slots, Hkv * D] matrix each, boxes of 64 columns x 16 rows, 128-byte swizzle,
// in global memory) and num_slots; same grid and output; smem (128 + 2 * STAGES * BN) * D * 2 bytes + 1 KB.
//
// What it tries: in wg every thread gathers its share of each K/V tile with cp.async (4-16 copies, their addresses
// from a slot list staged in smem) and the block meets at two __syncthreads a tile, so both warpgroups issue their
// GEMMs at the same moments and run their softmax at the same moments. Here warp 0 is also the producer: its lanes
// issue one TMA box each (16 keys x 64 dims of K or V: a page of the 16-slot paged cache, so the box never spans two
// blocks) into a ring of STAGES K/V stages, and a stage's "full" mbarrier completes when all its bytes landed (expect
// tx). The consumers wait on it; each warp arrives on the stage's "empty" mbarrier when its P V of the tile is done;
// warp 0 refills the stage of tile j - 1 after its own tile j, so a lagging warpgroup holds back only the refill,
// not the other warpgroup. Nothing block-wide is left in the loop.
// Pages past the block's keys are loaded from row num_slots, past the tensor: TMA fills them with zeros. The last
// page of a sequence is loaded whole; its slots past the sequence are masked out of S, but V's rows there hold what
// the cache held (never written: any bits), and 0 x NaN is NaN, so a warpgroup zeroes V's rows past k_hi in the tile
// that holds them before reading it.
// LOOP 0: wg's loop (S, softmax, P V, each waited); 1: wgp's (S(j + 1) issued with P(j) V(j),
// dev/prefill_attention_wgp.cu); 2: wgp's with wgpp's ping-pong (a warpgroup issues its GEMMs only after the other
// issued its own, named barriers 1 and 2), so one's softmax runs during the other's GEMMs.
// FAST (LOOP 0 only): a leaner softmax. In SASS, mma.cuh's exp2f is 4 instructions (a compare with -126, a
// predicated halving, MUFU.EX2, a predicated squaring: the fix-up for results below 2^-126), and the scale is its own
// FMUL before the FADD of the max; a score costs about 8.5 issue slots in all. Here exp2 is ex2.approx.ftz (the
// MUFU alone: a result below 2^-126 becomes 0 instead of a denormal) and the scale is folded into its argument,
// exp2(s * sl2 - m) as one FFMA, the maxima taken over the raw scores (sl2 > 0 keeps their order, and rounding keeps
// it too, so the maxima are those of the scaled scores): about 4.5 slots a score.
// Measured (an H100, sessions 20 and 21, experiments/NOTEBOOK.md): LOOP 0 within -3% to +2.4% of wg at 4,096
// tokens, LOOP 1 and 2 10-25% slower. FAST gains 1-4% over LOOP 0, and at D 128 / BN 128 it is 6-7% faster than the
// plan's wg (the same softmax in wg itself gained nothing: -1.6% to +3.2%).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Barrier 3 + wg over one warpgroup's 128 threads (ids as immediates: a register id reserves all 16 barriers).
__device__ __forceinline__ void wg_bar(int wg) {
    if (wg == 0) asm volatile("bar.sync 3, 128;\n" ::: "memory");
    else asm volatile("bar.sync 4, 128;\n" ::: "memory");
}
#endif

constexpr int WGT_BOX_ROWS = 16;  // keys a TMA box: the engine's cache block (a box must not span two blocks)

// Stages of the K/V ring: as many as two blocks an SM leave room for at D 64 / BN 64, else what one block's 227 KB
// hold.
template <int D, int BN> struct WgtStages { static constexpr int value = D * BN <= 64 * 64 ? 4 : 3; };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Warp 0: tile j's K and V boxes into stage st. Lane 0 arms the full barrier with the stage's bytes first.
template <int D, int BN>
__device__ __forceinline__ void wgt_produce(int lane, int k0, int k_hi, unsigned char* Kt, unsigned char* Vt,
                                            const void* tmk, const void* tmv, const int* table, int block_size,
                                            int num_blocks, int num_slots, int kvh, unsigned long long* full) {
    constexpr int PAGES = BN / WGT_BOX_ROWS, CH = D / 64, OPS = 2 * PAGES * CH;
    if (lane == 0) mbar_expect_tx(full, 2 * BN * D * 2);
    __syncwarp();
#pragma unroll
    for (int i = lane; i < OPS; i += 32) {
        const int kv = i / (PAGES * CH), p = i % (PAGES * CH) / CH, ch = i % CH, key = k0 + p * WGT_BOX_ROWS;
        int row = num_slots;  // past the tensor: zeros
        if (key < k_hi) {
            const int blk = min(max(table[key / block_size], 0), num_blocks - 1);
            row = blk * block_size + key % block_size;
        }
        unsigned char* dst = (kv ? Vt : Kt) + ch * BN * 128 + p * WGT_BOX_ROWS * 128;
        tma_load_2d(dst, kv ? tmv : tmk, kvh * D + ch * 64, row, full);
    }
}

// V's rows r0..BN-1 of a tile to zero (see above), then fenced for wgmma and the warpgroup met.
template <int D, int BN>
__device__ __forceinline__ void wgt_zero_rows(unsigned char* Vt, int r0, int wg) {
    constexpr int UPR = D / 8;
    for (int cc = (threadIdx.x & 127) + r0 * UPR; cc < BN * UPR; cc += 128)
        *reinterpret_cast<uint4*>(Vt + sw128_offset(BN, cc / UPR, cc % UPR)) = make_uint4(0, 0, 0, 0);
    fence_async_smem();
    wg_bar(wg);
}

// FAST's pieces. ex2.approx.ftz: exp2 on the MUFU alone (-inf gives 0).
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// causal_scale_tile without the scale: raw scores, -inf above the rows' positions, this thread's raw maxima.
template <int TK>
__device__ __forceinline__ void causal_mask_tile(float (&s)[TK / 8][4], bool diag, int k0, int c, int pos0, int pos1,
                                                 float& mx0, float& mx1) {
#pragma unroll
    for (int n = 0; n < TK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[n][e];
            if (diag && k0 + n * 8 + 2 * c + (e & 1) > (e < 2 ? pos0 : pos1)) v = NEG_INF;
            s[n][e] = v;
            if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
}
// softmax_rows on raw scores: m, l and alpha as there (m in log2 units), P = exp2(s * sl2 - m) by one FFMA and the
// MUFU. Every row sees a key of the block's first tile (softmax_rows' EMPTY false).
template <int TK>
__device__ __forceinline__ void softmax_rows_raw(float (&s)[TK / 8][4], float sl2, float mx0, float mx1, float& m0,
                                                 float& m1, float& l0, float& l1, float& a0, float& a1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
    a0 = ex2_ftz(m0 - mn0);
    a1 = ex2_ftz(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < TK / 8; n++) {
        s[n][0] = ex2_ftz(fmaf(s[n][0], sl2, -mn0)); s[n][1] = ex2_ftz(fmaf(s[n][1], sl2, -mn0));
        s[n][2] = ex2_ftz(fmaf(s[n][2], sl2, -mn1)); s[n][3] = ex2_ftz(fmaf(s[n][3], sl2, -mn1));
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * a0 + sum0;
    l1 = l1 * a1 + sum1;
}

#endif

template <typename T, int D, int BN, int LOOP, bool FAST>
__global__ void __launch_bounds__(256, D * BN <= 64 * 64 ? 2 : 1)
prefill_attention_wgt(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                      const int* __restrict__ block_tables, const int* __restrict__ query_start_loc,
                      const int* __restrict__ seq_lens, int block_size, int M, int num_blocks, float scale, int Hq,
                      int Hkv, int n_splits, float* __restrict__ ws_o, float* __restrict__ ws_ml,
                      T* __restrict__ out, const void* __restrict__ tmk, const void* __restrict__ tmv,
                      int num_slots) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(D % 64 == 0 && BN % 64 == 0 && 2 * (BN / WGT_BOX_ROWS) * (D / 64) <= 32, "a box a lane");
    static_assert(!FAST || LOOP == 0, "the lean softmax is in wg's loop only");
    constexpr int STAGES = WgtStages<D, BN>::value, Q_BYTES = WG_BQ * D * 2, KV_BYTES = BN * D * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // 1,024-byte aligned
    unsigned char* Ks = Qs + Q_BYTES;            // [STAGES][KV_BYTES]
    unsigned char* Vs = Ks + STAGES * KV_BYTES;  // [STAGES][KV_BYTES]
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];

    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (Hq / Hkv), tid = threadIdx.x;
    const int split = blockIdx.z % n_splits;
    const int q0 = (gridDim.z / n_splits - 1 - blockIdx.z / n_splits) * WG_BQ;  // heaviest query tiles first
    const Seq sq = sequence(query_start_loc, seq_lens, b, M * block_size);
    if (q0 >= sq.n) return;  // whole block: before any barrier
    const int sp = sq.start, n_tokens = sq.n;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int kv_len = min(sp + min(q0 + WG_BQ, n_tokens), sq.len);
    int k_lo, k_hi;
    if (!wg_keys(kv_len, split, n_splits, BN, k_lo, k_hi)) return;
    const int n_kt = max(1, (k_hi - k_lo + BN - 1) / BN);
    const int* table = block_tables + (size_t)b * M;

    if (tid == 0) {
#pragma unroll
        for (int st = 0; st < STAGES; st++) { mbar_init(&full[st], 1); mbar_init(&empty[st], 8); }
        fence_barrier_init();
    }
    load_sw128_q<T, D>(Qs, q + ((size_t)sq.qs * Hq + h) * D, q0, (size_t)Hq * D, n_tokens);
    cp_async_commit();
    __syncthreads();  // the barriers' init before any use
    if (warp == 0)
        for (int t = 0; t < min(STAGES, n_kt); t++)
            wgt_produce<D, BN>(lane, k_lo + t * BN, k_hi, Ks + t * KV_BYTES, Vs + t * KV_BYTES, tmk, tmv, table,
                               block_size, num_blocks, num_slots, kvh, &full[t]);
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();  // Q

    const int pos0 = sp + q0 + warp * 16 + g, pos1 = pos0 + 8;
    const int wg_first = sp + q0 + wg * 64;
    const int wg_last = q0 + wg * 64 < n_tokens ? sp + min(q0 + wg * 64 + 63, n_tokens - 1) : -1;  // -1: no rows
    const float sl2 = scale * LOG2E;
    float o[D / 8][4];
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const unsigned char* q_wg = Qs + wg * 64 * 128;
    // Warp 0, after its tile j: tile j - 1 + STAGES into tile j - 1's stage, once every warp is done with tile j - 1.
    const auto refill = [&](int j) {
        const int t = j - 1 + STAGES, st = (j - 1) % STAGES;
        if (warp == 0 && j >= 1 && t < n_kt) {
            mbar_wait(&empty[st], ((j - 1) / STAGES) & 1);
            wgt_produce<D, BN>(lane, k_lo + t * BN, k_hi, Ks + st * KV_BYTES, Vs + st * KV_BYTES, tmk, tmv, table,
                               block_size, num_blocks, num_slots, kvh, &full[st]);
        }
    };
    // Tile t has arrived; a warpgroup that will read it zeroes its V rows past the keys (the last tile only).
    const auto arrived = [&](int t) {
        const int st = t % STAGES, k0 = k_lo + t * BN;
        mbar_wait(&full[st], (t / STAGES) & 1);
        if (k_hi - k0 < BN && k0 <= wg_last) wgt_zero_rows<D, BN>(Vs + st * KV_BYTES, k_hi - k0, wg);
    };

    if constexpr (LOOP == 0) {
        for (int j = 0; j < n_kt; j++) {
            const int st = j % STAGES, k0 = k_lo + j * BN;
            arrived(j);
            if (k0 <= wg_last) {  // warpgroup-uniform
                const unsigned char* Kt = Ks + st * KV_BYTES;
                const unsigned char* Vt = Vs + st * KV_BYTES;
                float s[BN / 8][4];
                wg_scores<T, D, BN>(s, q_wg, Kt);
                float mx0 = NEG_INF, mx1 = NEG_INF;
                if constexpr (FAST) {
                    causal_mask_tile<BN>(s, k0 + BN - 1 > wg_first, k0, c, pos0, pos1, mx0, mx1);
                    float a0, a1;
                    softmax_rows_raw<BN>(s, sl2, mx0, mx1, m0, m1, l0, l1, a0, a1);
                    rescale_rows<D>(o, a0, a1);
                } else {
                    causal_scale_tile<BN>(s, sl2, k0 + BN - 1 > wg_first, k0, c, pos0, pos1, mx0, mx1);
                    softmax_tile<D, BN, false>(s, mx0, mx1, m0, m1, l0, l1, o);
                }
                unsigned p[BN / 16][4];
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) p_fragment<T, BN>(p[kk], s, kk);
                float (&od)[D / 2] = reinterpret_cast<float (&)[D / 2]>(o);
                wgmma_keep(od);
                wgmma_keep(p);
                wgmma_fence();
                wg_pv<T, D, BN>(od, p, Vt);
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_keep(od);
                wgmma_keep(p);
            }
            if (lane == 0) mbar_arrive(&empty[st]);
            refill(j);
        }
    } else {
        unsigned p[BN / 16][4];  // P of the tile whose P V is next
        arrived(0);
        if (k_lo <= wg_last)
            wgp_first<T, D, BN>(p, q_wg, Ks, k_lo, sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1);
        if (LOOP == 2 && wg == 1) named_arrive<1>();  // warpgroup 0 issues first
        for (int j = 0; j < n_kt; j++) {
            const int k1 = k_lo + (j + 1) * BN;
            if (j + 1 < n_kt) arrived(j + 1);
            const bool cur = k_lo + j * BN <= wg_last, next = j + 1 < n_kt && k1 <= wg_last;
            if (LOOP == 2) {  // the other warpgroup has issued its GEMMs of this round
                if (wg == 0) named_sync<1>(); else named_sync<2>();
            }
            // Then its turn, once ours are issued; warpgroup 1's last arrival would meet no bar.sync: left out.
            const auto turn = [&] {
                if (LOOP == 2) { if (wg == 0) named_arrive<2>(); else if (j + 1 < n_kt) named_arrive<1>(); }
            };
            wgp_round<T, D, BN>(o, p, cur, next, q_wg, Ks + ((j + 1) % STAGES) * KV_BYTES,
                                Vs + (j % STAGES) * KV_BYTES, k1, sl2, wg_first, c, pos0, pos1, m0, m1, l0, l1,
                                turn);
            if (lane == 0) mbar_arrive(&empty[j % STAGES]);
            refill(j);
        }
    }

    wg_store<T, D>(out, ws_o, ws_ml, sq, h, Hq, q0 + warp * 16 + g, split, n_splits, o, m0, m1, l0, l1, lane);
#else
    __trap();  // built for sm_90a only
#endif
}
