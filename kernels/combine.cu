// combine.cu -- DeepSeek-V4's combine_topk_swa_indices (reference A.5, bounds-checked) and the gather lengths.
// CPU twin: kernels/combine.py (bit-identical output).
//
// Row t (chunk-local: query_start_loc is rebased by qsl[0]) of request b, at position pos = seq_len - qlen + i:
//     nk = min((pos+1)/R, K), nw = min(pos+1, W)
//     out[t, j]      = b*M + v  (v = topk[t, j], -1 unless 0 <= v < N; j >= Kw reads -1)   j < nk
//     out[t, nk + j] = b*M + N + (pos - nw + 1 + j - gstart)                              j < nw
//     out[t, nk + nw .. Kc) = -1,  lens[t] = nk + nw,  gstart = seq_len - gather_len
// The tail is written here, so a reused output buffer never leaks stale ids (no separate fill kernel).
// Kc is a multiple of 128, so every output row starts 512-byte aligned (given an aligned base): stores are int4.
// Top-k loads are scalar (the input is often a strided / offset view; reference A.9).
//
// Two work splits (toolkit/bench/sparse.py times them; the flat warp grid is what the engine launches):
//   combine_flat_warp   grid ceil(T / 4), block 128: one warp per row, the row's request by binary search in qsl
//   combine_persistent  grid (workers, num_reqs), block 128: vLLM's layout, block (w, b) does rows qs+w, qs+w+workers..
#include "dtype.cuh"
#include "paged.cuh"

// One row, its Kc/4 int4 chunks strided over `n` cooperating threads (thread index i).
__device__ __forceinline__ void combine_row(const int* __restrict__ topk, int topk_stride, int Kw, int t, int b,
                                            const int* __restrict__ qsl, const int* __restrict__ seq_lens,
                                            const int* __restrict__ gather_lens, int W, int R, int K, int M, int N,
                                            int Kc, int* __restrict__ out, int* __restrict__ lens, int i, int n) {
    const int base = qsl[0];
    const int qs = qsl[b] - base, qlen = qsl[b + 1] - qsl[b], L = seq_lens[b];
    const int pos = L - qlen + (t - qs);
    const int nk = min((pos + 1) / R, K), nw = min(pos + 1, W);
    const long long off = (long long)b * M;
    const int wbase = (int)(off + N) + (pos - nw + 1) - (L - gather_lens[b]);  // id of window entry 0
    const int* trow = topk + (size_t)t * topk_stride;
    int4* orow = reinterpret_cast<int4*>(out + (size_t)t * Kc);
    for (int c = i; c < Kc / 4; c += n) {
        int v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 4 * c + e;
            if (j < nk) {
                const int x = j < Kw ? trow[j] : -1;
                v[e] = (x >= 0 && x < N) ? (int)(off + x) : -1;
            } else if (j < nk + nw) {
                v[e] = wbase + (j - nk);
            } else {
                v[e] = -1;
            }
        }
        orow[c] = make_int4(v[0], v[1], v[2], v[3]);
    }
    if (i == 0) lens[t] = nk + nw;
}

extern "C" __global__ void __launch_bounds__(128)
combine_flat_warp(const int* __restrict__ topk, int topk_stride, int Kw, const int* __restrict__ qsl, int num_reqs,
                  const int* __restrict__ seq_lens, const int* __restrict__ gather_lens, int T, int W, int R, int K,
                  int M, int N, int Kc, int* __restrict__ out, int* __restrict__ lens) {
    const int t = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (t >= T) return;
    const int b = find_request(qsl, num_reqs, t);
    combine_row(topk, topk_stride, Kw, t, b, qsl, seq_lens, gather_lens, W, R, K, M, N, Kc, out, lens,
                threadIdx.x & 31, 32);
}

extern "C" __global__ void __launch_bounds__(128)
combine_persistent(const int* __restrict__ topk, int topk_stride, int Kw, const int* __restrict__ qsl, int num_reqs,
                   const int* __restrict__ seq_lens, const int* __restrict__ gather_lens, int T, int W, int R, int K,
                   int M, int N, int Kc, int* __restrict__ out, int* __restrict__ lens) {
    const int b = blockIdx.y, base = qsl[0];
    const int qs = qsl[b] - base, qe = qsl[b + 1] - base;
    for (int t = qs + blockIdx.x; t < qe; t += gridDim.x)
        combine_row(topk, topk_stride, Kw, t, b, qsl, seq_lens, gather_lens, W, R, K, M, N, Kc, out, lens,
                    threadIdx.x, 128);
}

// gather_lens[b] = qlen + min(prefix, W - 1) (reference A.12, compute_prefill_gather_lens).
extern "C" __global__ void prefill_gather_lens(const int* __restrict__ qsl, const int* __restrict__ seq_lens,
                                               int num_reqs, int W, int* __restrict__ out) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= num_reqs) return;
    const int qlen = qsl[b + 1] - qsl[b];
    out[b] = qlen + min(seq_lens[b] - qlen, W - 1);
}
