"""Launcher of gemm_small (kernels/gemm_small.cu): the decode projections at 2-32 rows on tensor cores.

A plan per shape (rows, N, K, k-slices) holds the grid and the split-k workspace, made on the first call
(the runner's eager run before each capture), so a step allocates nothing and can be captured.
"""
import math

import numpy as np

F32 = np.dtype(np.float32)

ROWS_PER_TILE, MAX_TILES = 16, 2  # gemm_small<T, TO, MT>: MT = 1, 2 m16 tiles
COLS, K_CHUNK, WARPS, PAD = 64, 64, 4, 8  # GM_COLS, GM_K, GM_WARPS, GM_PAD in gemm_small.cu
MAX_SLICE_CHUNKS = 16  # a block's slice of x in shared memory: at most 32 rows x 1,024 elements (64 KB)
WARPS_PER_SM = 8       # streaming warps to aim for: each keeps 4 chunks (8 KB) of weights in flight


def gemm_small_slices(n: int, k: int, n_sm: int) -> int:
    """How many slices of K the grid splits into: enough for WARPS_PER_SM streaming warps per SM (each block has
    4, over 64 columns), and no slice longer than MAX_SLICE_CHUNKS. Each extra slice costs an fp32 partial tile,
    written and read back through L2."""
    col_blocks, chunks = -(-n // COLS), k // K_CHUNK
    want = math.ceil(WARPS_PER_SM * n_sm / (WARPS * col_blocks))
    return max(1, min(chunks, max(want, -(-chunks // MAX_SLICE_CHUNKS))))


def gemm_small(kernels, x, w, out, slices=None):
    """out[M, N] = x[M, K] @ w[N, K].T for 1 <= M <= 32 (see CudaKernels.gemm_small)."""
    kernels._check("gemm_small", kernels.storage, x, w)
    M, K = x.shape
    N = w.shape[0]
    if (kernels.itemsize != 2 or not 1 <= M <= ROWS_PER_TILE * MAX_TILES or w.shape[1] != K or K % K_CHUNK
            or out.shape != (M, N)):
        raise ValueError(f"gemm_small: x {x.shape}, w {w.shape}, out {out.shape} in {kernels.dtype} (16-bit "
                         f"types, 1 <= M <= {ROWS_PER_TILE * MAX_TILES}, K % {K_CHUNK} == 0)")
    to = "float" if out.dtype == F32 else kernels.ctype
    kernels._check("gemm_small", F32 if to == "float" else kernels.storage, out)
    key = (M, N, K, slices, to)
    plan = kernels._gemm_plans.get(key)
    if plan is None:
        plan = kernels._gemm_plans[key] = _plan(kernels, M, N, K, slices, to)
    fn, grid, ws, counters, ints, smem = plan
    kernels._go(fn, grid, (WARPS * 32,), (x, w, out, ws, counters, *ints), smem)


def _plan(kernels, M, N, K, slices, to):
    cp = kernels.cp
    if kernels._n_sm is None:
        kernels._n_sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    chunks = K // K_CHUNK
    S = max(-(-chunks // MAX_SLICE_CHUNKS), min(chunks, slices or gemm_small_slices(N, K, kernels._n_sm)))
    per_slice = -(-chunks // S)
    S = -(-chunks // per_slice)  # no empty slice
    col_blocks = -(-N // COLS)
    ws = cp.empty((S, M, col_blocks * COLS) if S > 1 else 1, cp.float32)  # fp32 partial tiles of the slices
    counters = cp.zeros(col_blocks, cp.uint32)  # the kernel leaves them zeroed
    tiles = -(-M // ROWS_PER_TILE)
    smem = tiles * ROWS_PER_TILE * (per_slice * K_CHUNK + PAD) * kernels.itemsize  # the block's slice of x
    fn = kernels._fn("gemm_small", f"gemm_small<{kernels.ctype}, {to}, {tiles}>", smem)
    ints = tuple(np.int32(v) for v in (M, N, K, per_slice))  # the launch's int arguments, made once
    return fn, (col_blocks, S), ws, counters, ints, smem
