// mma.cuh -- tensor-core building blocks for sm_80+ kernels: ldmatrix, mma.sync m16n8k16 (fp32 accumulate),
// fp32 pair packing and cp.async, shared by kernels/prefill_attention.cu and kernels/sparse_attention_tc.cu.
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
