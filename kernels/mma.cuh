// mma.cuh -- tensor-core building blocks for sm_80+ kernels: ldmatrix, mma.sync m16n8k16 (fp32 accumulate),
// fp32 pair packing, cp.async, and the steps of one warp's FlashAttention-2 tile (S = QK^T, online softmax,
// O += PV, store), shared by kernels/prefill_attention.cu and kernels/sparse_attention_tc.cu. Include it after
// dtype.cuh (NEG_INF, the element types).
// Fragment layouts of mma.m16n8k16 (g = lane / 4, c = lane % 4):
//    A (16x16, row-major)  a0: (row g, cols 2c, 2c+1)  a1: (row g+8, cols 2c, 2c+1)  a2/a3: the same, cols +8
//    B (16x8, "col")       b0: (k 2c, 2c+1; col n = g)   b1: (k 2c+8, 2c+9; col n = g)
//    C (16x8, fp32)        c0, c1: (row g, cols 2c, 2c+1)  c2, c3: (row g+8, cols 2c, 2c+1)
// ldmatrix.x4 loads four 8x8 b16 matrices (lanes 8i..8i+7 give matrix i's row addresses); .trans gives the
// transposed fragment, which turns a row-major V[key][d] tile into the B operand of P.V.
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// c += a * b on one 16x8x16 tile; the element type picks the instruction (overloads on a tag pointer).
__device__ __forceinline__ void mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1, const __nv_bfloat16*) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1, const __half*) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two fp32 -> one register of two 16-bit values (lo in the low half), as an A fragment wants them.
__device__ __forceinline__ unsigned pack2(float lo, float hi, const __nv_bfloat16*) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, const __half*) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// Async 16-byte global -> shared copy; pred false zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(pred ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Stage ROWS rows into smem rows of LD elements: smem row r <- base + (row0 + r) * stride if row0 + r < n_valid,
// else zeros. An invalid row's source address is clamped to `base`, so no address ever leaves the tensor.
// (128 threads per block.)
template <typename T, int D, int LD, int ROWS>
__device__ __forceinline__ void load_rows(T* dst, const T* base, int row0, size_t stride, int n_valid) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int i = 0; i < ROWS * CPR / 128; i++) {
        const int c = threadIdx.x + i * 128, r = c / CPR, col = (c % CPR) * 8;
        const bool ok = row0 + r < n_valid;
        cp_async16(dst + r * LD + col, base + (ok ? (size_t)(row0 + r) * stride : 0) + col, ok);
    }
}

// The same for a K or V tile gathered from the paged cache: smem row r <- base + slots[r] * stride, zeros for -1.
template <typename T, int D, int LD, int ROWS>
__device__ __forceinline__ void load_slot_rows(T* dst, const T* base, const int* slots, size_t stride) {
    constexpr int CPR = D / 8;
#pragma unroll
    for (int i = 0; i < ROWS * CPR / 128; i++) {
        const int c = threadIdx.x + i * 128, r = c / CPR, col = (c % CPR) * 8, slot = slots[r];
        cp_async16(dst + r * LD + col, base + (slot >= 0 ? (size_t)slot * stride : 0) + col, slot >= 0);
    }
}

// ---- One warp's 16 query rows of a FlashAttention-2 tile (rows g and g + 8 in each thread) ----------------------
// Shared by prefill_attention_tc and sparse_attention_tc: they differ in where the keys come from and in the
// mask, not in this arithmetic. Qs, Kt and Vt are smem tiles with rows of LD elements (TK key rows for Kt, Vt).

// S = Q K^T: 16 rows x TK keys = TK/8 n-tiles. K rows are keys, i.e. K^T stored "col": the B fragments come
// straight from ldmatrix (non-trans): matrices = keys 0-7|8-15 (lane >> 4) x dims 0-7|8-15. The Q A-fragment
// is re-read from smem per tile (4% of the tile's ldmatrix) rather than held in 16 registers.
template <typename T, int D, int TK, int LD>
__device__ __forceinline__ void qk_tile(float (&s)[TK / 8][4], const T* Qs, const T* Kt, int warp, int lane) {
    const T* tag = nullptr;
    // Matrix i of an ldmatrix.x4 gets its row addresses from lanes 8i..8i+7: row lane & 7, and
    // (lane >> 3) & 1 / lane >> 4 select which 8-row / 8-column half the matrix covers.
    const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < TK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        unsigned qf[4];  // a0..a3 = rows 0-7|8-15 x cols 0-7|8-15 of the 16x16 block
        ldmatrix_x4(qf, Qs + (warp * 16 + lr) * LD + kk * 16 + lc);
#pragma unroll
        for (int p = 0; p < TK / 16; p++) {
            unsigned b[4];  // b[0], b[1]: keys 16p..16p+7;  b[2], b[3]: keys 16p+8..16p+15
            ldmatrix_x4(b, Kt + (p * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma(s[2 * p], qf, b[0], b[1], tag);
            mma(s[2 * p + 1], qf, b[2], b[3], tag);
        }
    }
}

// The online softmax of one tile. s: log2-scaled scores, -inf where masked; mx0, mx1: this thread's maxima of
// its two rows. A row lives in the 4 lanes of a quad, so the maxima are reduced over it; then s becomes
// P = exp2(s - m_new), and m and l (this thread's partial row sums: alpha is the same across the quad, so they
// are reduced once at the end) are rescaled; a0, a1 = alpha of the two rows, O's factor. EMPTY: a row may have seen
// no key yet and keep m = -inf; 0 is then subtracted instead, so exp2(-inf) = 0 and never NaN (false where every
// row sees a key of tile 0).
template <int TK, bool EMPTY>
__device__ __forceinline__ void softmax_rows(float (&s)[TK / 8][4], float mx0, float mx1, float& m0, float& m1,
                                             float& l0, float& l1, float& a0, float& a1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float b0 = EMPTY && mn0 == NEG_INF ? 0.0f : mn0, b1 = EMPTY && mn1 == NEG_INF ? 0.0f : mn1;
    a0 = exp2f(m0 - b0);  // exp2(-inf) = 0 on a row's first keys
    a1 = exp2f(m1 - b1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < TK / 8; n++) {
        s[n][0] = exp2f(s[n][0] - b0); s[n][1] = exp2f(s[n][1] - b0);
        s[n][2] = exp2f(s[n][2] - b1); s[n][3] = exp2f(s[n][3] - b1);
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * a0 + sum0;
    l1 = l1 * a1 + sum1;
}

// O's rows scaled by their alphas (softmax_rows).
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], float a0, float a1) {
#pragma unroll
    for (int n = 0; n < D / 8; n++) { o[n][0] *= a0; o[n][1] *= a0; o[n][2] *= a1; o[n][3] *= a1; }
}

// softmax_rows, then O rescaled at once.
template <int D, int TK, bool EMPTY>
__device__ __forceinline__ void softmax_tile(float (&s)[TK / 8][4], float mx0, float mx1, float& m0, float& m1,
                                             float& l0, float& l1, float (&o)[D / 8][4]) {
    float a0, a1;
    softmax_rows<TK, EMPTY>(s, mx0, mx1, m0, m1, l0, l1, a0, a1);
    rescale_rows<D>(o, a0, a1);
}

// A causal tile's scores in log2 units: s *= sl2, and where the tile reaches past the rows' first position (diag),
// key k0 + 8n + 2c + e % 2 above the row's position (pos0 for row g, pos1 for row g + 8) becomes -inf. mx0, mx1
// (start them at -inf): this thread's maxima of its two rows.
template <int TK>
__device__ __forceinline__ void causal_scale_tile(float (&s)[TK / 8][4], float sl2, bool diag, int k0, int c, int pos0,
                                                  int pos1, float& mx0, float& mx1) {
#pragma unroll
    for (int n = 0; n < TK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = s[n][e] * sl2;
            if (diag && k0 + n * 8 + 2 * c + (e & 1) > (e < 2 ? pos0 : pos1)) v = NEG_INF;
            s[n][e] = v;
            if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
}

// The A fragment of P for k-step kk of P V, rounded to T. The S accumulators of n-tiles 2kk and 2kk+1 (keys
// 16kk..16kk+15) are exactly it: a0 = (row g, keys 2c..) = s[2kk][0,1], a1 = (row g+8) = s[2kk][2,3], a2 = (row g,
// keys 8+2c..) = s[2kk+1][0,1], a3 = s[2kk+1][2,3]. (wgmma takes the same fragment from registers: wgmma.cuh.)
template <typename T, int TK>
__device__ __forceinline__ void p_fragment(unsigned (&a)[4], const float (&s)[TK / 8][4], int kk) {
    const T* tag = nullptr;
    a[0] = pack2(s[2 * kk][0], s[2 * kk][1], tag);
    a[1] = pack2(s[2 * kk][2], s[2 * kk][3], tag);
    a[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], tag);
    a[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], tag);
}

// O += P V (P from p_fragment). V[key][d] is row-major, so the B fragments (k = key, n = d) come from
// ldmatrix.trans: matrices = keys 0-7|8-15 x dims 0-7|8-15.
template <typename T, int D, int TK, int LD>
__device__ __forceinline__ void pv_tile(float (&o)[D / 8][4], const float (&s)[TK / 8][4], const T* Vt, int lane) {
    const T* tag = nullptr;
    const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < TK / 16; kk++) {
        unsigned a[4];
        p_fragment<T, TK>(a, s, kk);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned b[4];  // b[0], b[1]: dims 16dp..16dp+7;  b[2], b[3]: dims 16dp+8..16dp+15
            ldmatrix_x4_trans(b, Vt + (kk * 16 + lr) * LD + dp * 16 + lc);
            mma(o[2 * dp], a, b[0], b[1], tag);
            mma(o[2 * dp + 1], a, b[2], b[3], tag);
        }
    }
}

// Finish the row sums across the quad, normalise and store, two values per 32-bit store: output row t0 (row
// pointer out0) gets c0, c1 of each n-tile (dims 8n + 2c, +1), row t1 gets c2, c3; rows >= n_rows are not
// stored, and a row that saw no key (l = 0; only bad input) is stored as zeros.
template <typename T, int D>
__device__ __forceinline__ void store_tile_rows(T* out0, T* out1, int t0, int t1, int n_rows,
                                                const float (&o)[D / 8][4], float l0, float l1, int lane) {
    const T* tag = nullptr;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    unsigned* p0 = reinterpret_cast<unsigned*>(out0 + 2 * (lane & 3));
    unsigned* p1 = reinterpret_cast<unsigned*>(out1 + 2 * (lane & 3));
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        if (t0 < n_rows) p0[n * 4] = pack2(o[n][0] * inv0, o[n][1] * inv0, tag);
        if (t1 < n_rows) p1[n * 4] = pack2(o[n][2] * inv1, o[n][3] * inv1, tag);
    }
}
