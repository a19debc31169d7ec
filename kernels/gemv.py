"""Small-batch projection, CPU twin of gemv.cu: y[m, n] = sum_k x[m, k] * w[n, k] (y = x @ w.T).

On the CPU BLAS already streams the weights at memory speed for any number of rows, so the twin is the same
matmul the CPU backend's `linear` uses; it exists so the GPU kernel has a reference under its own name.
"""
import numpy as np

MAX_ROWS = 4  # gemv.cu is instantiated for M = 1..4


def gemv(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 4); w: float32[N, K]; out: float32[M, N], written in place."""
    M, K = x.shape
    if not 1 <= M <= MAX_ROWS or w.shape[1] != K or out.shape != (M, w.shape[0]):
        raise ValueError(f"gemv: x {x.shape}, w {w.shape}, out {out.shape} (1 <= M <= {MAX_ROWS})")
    np.matmul(x, w.T, out=out)
