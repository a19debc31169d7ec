"""Batch-1 projections at the larger shapes: how close does gemv.cu get to HBM bandwidth, and does a grid of at most
one wave of blocks (each block striding over its row groups, the next row's first chunks loaded before the current
row's sums are reduced) beat one block per row group (1.5-6 waves at Llama-3.2-1B / Qwen2.5-1.5B)?

Each case is the kernel alone, 40 calls replayed from one CUDA graph, cycling over weight copies that together
exceed the 50 MB L2 (so every call reads DRAM, as a decode step's layers do). The variant's outputs must equal the
product kernel's bit for bit (same sums in the same order). Run on the GPU from the repo root:

    PYTHONPATH=. python3 dev/gemv_waves.py [blocks_per_sm,...]
"""
import sys

import cupy as cp
import numpy as np

from timing import graph_us
from toolkit.backends.cuda_kernels import OPTIONS, CudaKernels, gemv_warps_per_row, kernel_source

PEAK_GBS = 4814
SHAPES = {  # hidden, intermediate, q heads x head dim + 2 kv heads x head dim
    "qwen2.5-0.5b": (896, 4864, 14 * 64 + 2 * 2 * 64),
    "llama-3.2-1b": (2048, 8192, 32 * 64 + 2 * 8 * 64),
    "qwen2.5-1.5b": (1536, 8960, 12 * 128 + 2 * 2 * 128),
}

VARIANT = r"""
// gemv / gemv_swiglu with a grid of at most one wave: block b takes row groups b, b + gridDim.x, ...; a warp loads
// the next group's first GEMV_PF chunks before it reduces the current sums (so the weight stream does not stop
// between rows). Same per-row arithmetic as gemv.cu (the same chunks in the same order, the same shuffles).
template <int M>
__device__ __forceinline__ bool row_sums_loop(int part, int warp, int lane, int wpr, float (&acc)[M]) {
    if (wpr == 1) return true;
    __shared__ float s_part[8][M];
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == 0) s_part[warp][m] = acc[m];
    __syncthreads();
    if (!part) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            acc[m] = s_part[warp][m];
            for (int p = 1; p < wpr; p++) acc[m] += s_part[warp + p][m];
        }
    }
    __syncthreads();  // s_part is written again by the next group
    return !part;
}

template <typename T, int M>
__global__ void __launch_bounds__(256, 1)
gemv_wave(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int N, int K, int wpr) {
    constexpr int VEC = 16 / sizeof(T);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, KC = K / VEC;
    const int rpb = 8 / wpr, groups = (N + rpb - 1) / rpb, part = warp % wpr, c0 = part * 32 + lane, cs = 32 * wpr;
    auto row = [&](int g) { return reinterpret_cast<const uint4*>(w + (size_t)min(g * rpb + warp / wpr, N - 1) * K); };
    uint4 pre[GEMV_PF];
    w_prefetch(row(blockIdx.x), KC, c0, cs, pre);
    pdl_enter();
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const uint4* wr = row(g);
        const int n = g * rpb + warp / wpr;
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; m++) acc[m] = 0.0f;
        auto dot_chunk = [&](uint4 wv, int c) {
            Chunk<T> wc;
            wc.u = wv;
#pragma unroll
            for (int m = 0; m < M; m++) {
                Chunk<T> xc;
                xc.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[m] += to_f32(wc.e[e]) * to_f32(xc.e[e]);
            }
        };
#pragma unroll
        for (int p = 0; p < GEMV_PF; p++)
            if (c0 + cs * p < KC) dot_chunk(pre[p], c0 + cs * p);
#pragma unroll 4
        for (int c = c0 + cs * GEMV_PF; c < KC; c += cs) dot_chunk(__ldg(wr + c), c);
        if (g + gridDim.x < groups) w_prefetch(row(g + gridDim.x), KC, c0, cs, pre);
#pragma unroll
        for (int m = 0; m < M; m++)
            for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
        if (row_sums_loop<M>(part, warp, lane, wpr, acc) && n < N) {
#pragma unroll
            for (int m = 0; m < M; m++)
                if (lane == 0) y[(size_t)m * N + n] = from_f32<T>(acc[m]);
        }
    }
}

// 4 blocks an SM (64 registers): at gemv_swiglu's 5 (48 registers) the next unit's chunks spill.
template <typename T, int M>
__global__ void __launch_bounds__(256, 4)
gemv_swiglu_wave(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, int I, int K, int wpr) {
    constexpr int VEC = 16 / sizeof(T);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, KC = K / VEC;
    const int rpb = 8 / wpr, groups = (I + rpb - 1) / rpb, part = warp % wpr, c0 = part * 32 + lane, cs = 32 * wpr;
    auto unit = [&](int g) { return min(g * rpb + warp / wpr, I - 1); };
    auto rowp = [&](int j) { return reinterpret_cast<const uint4*>(w + (size_t)j * K); };
    uint4 pg[GEMV_PF], pu[GEMV_PF];
    w_prefetch(rowp(unit(blockIdx.x)), KC, c0, cs, pg);
    w_prefetch(rowp(I + unit(blockIdx.x)), KC, c0, cs, pu);
    pdl_enter();
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int n = g * rpb + warp / wpr, j = unit(g);
        const uint4* wg = rowp(j);
        const uint4* wu = rowp(I + j);
        float acc[2 * M];
#pragma unroll
        for (int m = 0; m < 2 * M; m++) acc[m] = 0.0f;
        auto dot2 = [&](uint4 gv, uint4 uv, int c) {
            Chunk<T> gc, uc;
            gc.u = gv, uc.u = uv;
#pragma unroll
            for (int m = 0; m < M; m++) {
                Chunk<T> xc;
                xc.u = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * K) + c);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[m] += to_f32(gc.e[e]) * to_f32(xc.e[e]);
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[M + m] += to_f32(uc.e[e]) * to_f32(xc.e[e]);
            }
        };
#pragma unroll
        for (int p = 0; p < GEMV_PF; p++)
            if (c0 + cs * p < KC) dot2(pg[p], pu[p], c0 + cs * p);
#pragma unroll 4
        for (int c = c0 + cs * GEMV_PF; c < KC; c += cs) dot2(__ldg(wg + c), __ldg(wu + c), c);
        if (g + gridDim.x < groups) {
            w_prefetch(rowp(unit(g + gridDim.x)), KC, c0, cs, pg);
            w_prefetch(rowp(I + unit(g + gridDim.x)), KC, c0, cs, pu);
        }
#pragma unroll
        for (int m = 0; m < 2 * M; m++)
            for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
        if (row_sums_loop<2 * M>(part, warp, lane, wpr, acc) && n < I) {
#pragma unroll
            for (int m = 0; m < M; m++)
                if (lane == 0) out[(size_t)m * I + n] = swiglu(from_f32<T>(acc[m]), from_f32<T>(acc[M + m]));
        }
    }
}
template __global__ void gemv_wave<__nv_bfloat16, 1>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                      int, int, int);
template __global__ void gemv_swiglu_wave<__nv_bfloat16, 1>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                             __nv_bfloat16*, int, int, int);
"""


def bf16(shape, scale):  # random bf16 values as the backend stores them (uint16 bits): fp32's top half
    return ((cp.random.standard_normal(shape, cp.float32) * scale).view(cp.uint32) >> 16).astype(cp.uint16)


def projection_cases(shape):
    """The batch-1 projections of a shape: (name, N, K, op, MB, weight copies past the L2, x [1, K], outputs), op
    "gemv" or "swiglu" (gate_up). The o projection's K, q heads x head dim, equals the hidden size at all three."""
    H, I, QKV = SHAPES[shape]
    for name, N, K, op in (("qkv", QKV, H, "gemv"), ("o", H, H, "gemv"), ("gate_up", 2 * I, H, "swiglu"),
                           ("down", H, I, "gemv")):
        mb = N * K * 2 / 1e6
        copies = [bf16((N, K), 0.05) for _ in range(max(2, int(120 / mb) + 1))]
        yield name, N, K, op, mb, copies, bf16((1, K), 1.0), N // 2 if op == "swiglu" else N


def main():
    per_sm = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "4,8").split(",")]
    k = CudaKernels("bfloat16")
    mod = cp.RawModule(code=kernel_source("gemv") + VARIANT, options=OPTIONS,
                       name_expressions=("gemv_wave<__nv_bfloat16, 1>", "gemv_swiglu_wave<__nv_bfloat16, 1>"))
    fns = {"gemv": mod.get_function("gemv_wave<__nv_bfloat16, 1>"),
           "swiglu": mod.get_function("gemv_swiglu_wave<__nv_bfloat16, 1>")}
    n_sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    cp.random.seed(0)
    print("| shape | projection | N x K | MB | product us (% HBM) | " +
          " | ".join(f"{b}/SM us (% HBM)" for b in per_sm) + " | same bits |")
    print("|---|---|---|---:|---:|" + "---:|" * len(per_sm) + "---|")
    for shape in SHAPES:
        for name, N, K, op, mb, copies, x, n_out in projection_cases(shape):
            y = cp.empty((1, n_out), cp.uint16)
            y2 = cp.empty((1, n_out), cp.uint16)
            prod = k.gemv_swiglu if op == "swiglu" else k.gemv
            t_prod = graph_us(cp, lambda i: prod(x, copies[i % len(copies)], y), n=40)
            wpr = gemv_warps_per_row(K // 8)
            groups = -(-n_out // (8 // wpr))
            cells = []
            for b in per_sm:
                grid = min(groups, b * n_sm)
                args = lambda i: (x, copies[i % len(copies)], y2, np.int32(n_out), np.int32(K), np.int32(wpr))
                t = graph_us(cp, lambda i: fns[op]((grid,), (256,), args(i)), n=40)
                cells.append(f"{t:.2f} ({mb * 1e3 / t / PEAK_GBS * 100:.0f}%)")
            prod(x, copies[0], y)
            fns[op]((min(groups, per_sm[0] * n_sm),), (256,), (x, copies[0], y2, np.int32(n_out), np.int32(K),
                                                                np.int32(wpr)))
            same = bool((y == y2).all())
            pct = mb * 1e3 / t_prod / PEAK_GBS * 100
            print(f"| {shape} | {name} | {N} x {K} | {mb:.1f} | {t_prod:.2f} ({pct:.0f}%) | " + " | ".join(cells)
                  + f" | {same} |", flush=True)


if __name__ == "__main__":
    main()
