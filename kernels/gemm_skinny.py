"""Skinny projection, CPU twin of gemm_skinny.cu: y[m, n] = sum_k x[m, k] * w[n, k] (y = x @ w.T) for a few rows,
and its SwiGLU form (the gate_up projection with silu(gate) * up as the epilogue).

On the CPU BLAS streams the weights at memory speed for any number of rows, so the twin is the matmul the CPU
backend's `linear` uses; it exists so the GPU kernel has a reference under its own name. `fragment_order`
replays the kernel's k permutation (which physical k each mma step treats as which logical k), so a test can
check in NumPy that it covers every k once.
"""
import numpy as np

from .gemv import projection, swiglu_projection

MAX_ROWS = 32  # gemm_skinny.cu is instantiated for NT = 1, 2, 4 n-tiles of 8 rows
K_CHUNK = 32   # GS_K: k per chunk


def gemm_skinny(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 32); w: float32[N, K]; out: float32[M, N], written in place."""
    projection("gemm_skinny", MAX_ROWS, x, w, out)


def gemm_skinny_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for w = gate_up [2I, K]: the projection, then silu_mul's
    rounding, as gemm_skinny.cu's SWIGLU epilogue does it. float32, M <= MAX_ROWS."""
    swiglu_projection("gemm_skinny_swiglu", gemm_skinny, x, w, out)


def fragment_order() -> np.ndarray:
    """order[s, c, q] = the physical k (0..31) of a chunk that lane c of a row gives mma step s as its q-th
    logical k (q = 0..3: logical 2c, 2c + 1, 2c + 8, 2c + 9): lane c loads elements [8c, 8c + 8), and step s
    takes words 2s (elements 8c + 4s, + 1) and 2s + 1 (elements 8c + 4s + 2, + 3)."""
    s, c, q = np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij")
    return 8 * c + 4 * s + q


def logical_k(s: int, c: int, q: int) -> int:
    """mma.m16n8k16's logical k for lane c's q-th A/B element (mma.cuh: k = 2c, 2c + 1, 2c + 8, 2c + 9)."""
    return 2 * c + (q & 1) + 8 * (q >> 1)
