// gemm_small.cu -- y[m, n] = sum_k x[m, k] * w[n, k] for up to 32 rows, on tensor cores: the projections of a
// decode step at batch 2-32. Like gemv.cu this is a weight stream: each weight byte is used M <= 32 times, far
// too few for the GEMM to be compute-bound, so what matters is keeping enough weight bytes in flight. cuBLAS
// picks GEMM tilings built for reuse (and a separate split-K reduce kernel after the down projection); here
// every weight byte goes straight from DRAM into mma.sync's B registers, with no shared-memory staging.
//
// Layout (row-major, HF's [out, in] weights): x T[M, K]; w T[N, K]; y TO[M, N]. T is bf16 or fp16 (fp32 goes to
// cuBLAS); K % 64 == 0 and 16-byte aligned rows (the wrapper checks).
//
// Work split. A block (4 warps) owns 64 output columns and one of S slices of the k-range, grid = (ceil(N / 64), S);
// each warp owns 16 of the columns (2 mma n-tiles) over the whole slice, so no two warps add into the same output.
//   - The block first copies its slice of x (every row, a few KB) into shared memory, where all 4 warps read it.
//   - Each warp keeps GM_PF chunks of its weights in flight (a ring of registers, refilled as each chunk is used),
//     the first GM_PF issued before it waits for the previous kernel (PDL: the weights are constants).
//   - S is chosen so that ~1,000 warps stream weights at once (the H200 needs ~5 MB in flight to reach its DRAM
//     bandwidth); small projections are split along k to get there.
//   S == 1: each warp writes its outputs.
//   S > 1:  each block writes its fp32 tile to ws[slice] and counts itself in counters[column block]; the last one
//           adds the S tiles in slice order (so the result does not depend on which block finished last),
//           writes y and resets the counter for the next launch (graph replays included). The tiles stay in L2.
//
// Fragments without ldmatrix. mma.m16n8k16 (mma.cuh) wants lane (g = lane / 4, c = lane % 4) to hold
// k = 2c, 2c+1 and 2c+8, 2c+9 of its row (A) or column (B). A dot product does not care which physical k is
// called which logical k, as long as A and B agree, so lane c instead loads the 16 contiguous elements
// [16c, 16c + 16) of each 64-wide chunk (two 16-byte loads; the 4 lanes of a row read 128 contiguous bytes) and
// mma step s (0..3) treats elements 4s..4s+3 of them as its logical k = 2c, 2c+1, 2c+8, 2c+9.
// tests/test_gemm_small_layout.py replays this mapping in NumPy.
#include "dtype.cuh"
#include "mma.cuh"
#include "pdl.cuh"

constexpr int GM_WARPS = 4;   // warps per block, 16 output columns each
constexpr int GM_COLS = 64;   // output columns per block
constexpr int GM_K = 64;      // k per chunk: 4 mma k-steps, 16 elements (two 16-byte loads) per lane
constexpr int GM_PF = 4;      // weight chunks in flight per warp
constexpr int GM_PAD = 8;     // elements of padding per shared-memory row of x (spreads the rows over the banks)

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a constant after unrolling
}

template <typename TO> __device__ __forceinline__ void store_pair(TO* p, float a, float b, bool both) {
    p[0] = from_f32<TO>(a);
    if (both) p[1] = from_f32<TO>(b);
}

// x T[M, K], w T[N, K], y TO[M, N]; ws float[S, M, NP] (NP = N rounded up to 64) and counters[ceil(N / 64)] for
// S > 1. Dynamic shared memory: MT * 16 rows of (chunks_per_slice * 64 + GM_PAD) elements of T.
template <typename T, typename TO, int MT>
__global__ void __launch_bounds__(GM_WARPS * 32)
gemm_small(const T* __restrict__ x, const T* __restrict__ w, TO* __restrict__ y, float* __restrict__ ws,
           unsigned* __restrict__ counters, int M, int N, int K, int chunks_per_slice) {
    constexpr int ROWS = MT * 16;
    extern __shared__ __align__(16) unsigned char gm_smem[];
    T* xs = reinterpret_cast<T*>(gm_smem);
    __shared__ bool s_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int n0 = blockIdx.x * GM_COLS, slice = blockIdx.y, S = gridDim.y;
    const int kc0 = slice * chunks_per_slice, nck = min(K / GM_K - kc0, chunks_per_slice);
    const int XS = chunks_per_slice * GM_K + GM_PAD;  // shared row stride (elements)
    const int NP = (N + GM_COLS - 1) / GM_COLS * GM_COLS;

    // Lane (g, c) streams weight rows n0 + 16 warp + 8j + g (j = 0, 1), elements [16c, 16c + 16) of each chunk.
    // Rows past N are clamped to N - 1: loaded, multiplied, never stored.
    const uint4* wrow[2];
#pragma unroll
    for (int j = 0; j < 2; j++)
        wrow[j] = reinterpret_cast<const uint4*>(w + (size_t)min(n0 + 16 * warp + 8 * j + g, N - 1) * K) +
                  kc0 * 8 + 2 * c;
    uint4 wv[GM_PF][2][2];
    auto load_w = [&](int p, int chunk) {
        if (chunk < nck) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                wv[p][j][0] = __ldg(wrow[j] + chunk * 8);
                wv[p][j][1] = __ldg(wrow[j] + chunk * 8 + 1);
            }
        }
    };
#pragma unroll
    for (int p = 0; p < GM_PF; p++) load_w(p, p);
    pdl_enter();

    // x[:, slice] -> shared memory (zeros for rows past M), every 16-byte piece in flight at once (cp.async; a
    // load-then-store loop would wait an L2 round trip per piece). .cg reads L2: x was just written by the previous
    // kernel, and a stale line in this SM's L1 must not be read.
    const int per_row = nck * 8;  // uint4 per row
    for (int t = threadIdx.x; t < ROWS * per_row; t += blockDim.x) {
        const int m = t / per_row, q = t % per_row;
        cp_async16(xs + m * XS + q * 8, x + (size_t)min(m, M - 1) * K + kc0 * GM_K + q * 8, m < M);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc[MT][2][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    for (int base = 0; base < nck; base += GM_PF) {
#pragma unroll
        for (int p = 0; p < GM_PF; p++) {
            const int chunk = base + p;
            if (chunk >= nck) break;  // warp-uniform
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint4 xv[MT][2];  // rows 16i + g and 16i + g + 8, elements 16c + 8h .. + 8 of the chunk
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        xv[i][r] = *reinterpret_cast<const uint4*>(xs + (16 * i + 8 * r + g) * XS + chunk * GM_K +
                                                                   16 * c + 8 * h);
#pragma unroll
                for (int e = 0; e < 4; e += 2)  // k-steps 2h and 2h + 1: words e, e + 1
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        const unsigned a[4] = {word(xv[i][0], e), word(xv[i][1], e), word(xv[i][0], e + 1),
                                               word(xv[i][1], e + 1)};
#pragma unroll
                        for (int j = 0; j < 2; j++)
                            mma(acc[i][j], a, word(wv[p][j][h], e), word(wv[p][j][h], e + 1),
                                static_cast<const T*>(nullptr));
                    }
            }
            load_w(p, chunk + GM_PF);
        }
    }

    // Lane (g, c) holds rows 16i + g (acc 0, 1) and 16i + g + 8 (acc 2, 3), columns 2c, 2c + 1 of n-tile j.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int m = 16 * i + 8 * r + g, n = n0 + 16 * warp + 8 * j + 2 * c;
                if (m >= M || n >= N) continue;
                if (S == 1)
                    store_pair(y + (size_t)m * N + n, acc[i][j][2 * r], acc[i][j][2 * r + 1], n + 1 < N);
                else
                    *reinterpret_cast<float2*>(ws + ((size_t)slice * M + m) * NP + n) =
                        make_float2(acc[i][j][2 * r], acc[i][j][2 * r + 1]);
            }
    if (S == 1) return;

    // Split-k: the last block of this column block adds the S slices in order, 4 columns a thread at a time.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const int rows = min(M, ROWS);
    for (int t = threadIdx.x; t < rows * (GM_COLS / 4); t += blockDim.x) {
        const int m = t / (GM_COLS / 4), n = n0 + 4 * (t % (GM_COLS / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int q = 0; q < S; q++) {  // L2 reads (__ldcg): other blocks wrote these
            const float4 u = __ldcg(reinterpret_cast<const float4*>(ws + ((size_t)q * M + m) * NP + n));
            v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
        }
        TO* out = y + (size_t)m * N;
        if (n < N) out[n] = from_f32<TO>(v.x);
        if (n + 1 < N) out[n + 1] = from_f32<TO>(v.y);
        if (n + 2 < N) out[n + 2] = from_f32<TO>(v.z);
        if (n + 3 < N) out[n + 3] = from_f32<TO>(v.w);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
}
