"""Small-batch projection on tensor cores, CPU twin of gemm_small.cu: y[m, n] = sum_k x[m, k] * w[n, k].

On the CPU BLAS already streams the weights at memory speed for any number of rows, so the twin is the matmul
the CPU backend's `linear` uses, with the kernel's limits; it is the reference the GPU kernel is tested against.
`lane_k` is the kernel's fragment mapping (which elements of a 64-wide k-chunk a lane feeds to which mma step),
replayed in NumPy by tests/test_gemm_small_layout.py.
"""
import numpy as np

MAX_ROWS, K_CHUNK = 32, 64  # gemm_small<T, TO, MT> has MT <= 2 m16 tiles; SG_K


def gemm_small(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 32, K % 64 == 0); w: float32[N, K]; out: float32[M, N], written in place."""
    M, K = x.shape
    if not 1 <= M <= MAX_ROWS or K % K_CHUNK or w.shape[1] != K or out.shape != (M, w.shape[0]):
        raise ValueError(f"gemm_small: x {x.shape}, w {w.shape}, out {out.shape} "
                         f"(1 <= M <= {MAX_ROWS}, K % {K_CHUNK} == 0)")
    np.matmul(x, w.T, out=out)


def lane_k(c: int, step: int) -> tuple:
    """The chunk offsets lane c (= lane % 4) feeds to mma k-step `step` (0..3) as its logical k = 2c, 2c+1 (b0,
    a0/a1) and 2c+8, 2c+9 (b1, a2/a3): the lane loads elements [16c, 16c + 16) as two uint4; step s reads uint4
    s >> 1, words 2(s & 1) and 2(s & 1) + 1, i.e. elements 16c + 4s .. 16c + 4s + 3."""
    h, e = step >> 1, 2 * (step & 1)  # the kernel's uint4 and first word
    base = 16 * c + 8 * h + 2 * e
    return (base, base + 1), (base + 2, base + 3)
