"""A decode step's gate_up projection with SwiGLU as its epilogue, CPU twin of gemm_wg.cu: out[m, i] =
silu(x[m] . w[i]) * (x[m] . w[I + i]) for w = gate_up [2I, K], with silu_mul's roundings on the product.

The GPU kernel is a whole GEMM on Hopper's wgmma (TMA loads, warp-specialised, SwiGLU in registers); what it
computes is the plain product followed by silu_mul, so the twin is that: NumPy's matmul (BLAS, as the CPU backend's
`linear`), then kernels/activation.py's silu_mul.
"""
import numpy as np

from .gemv import swiglu_projection


def _matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    np.matmul(x, w.T, out=out)


def gemm_wg_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K], any M; w: float32[2I, K]; out: float32[M, I], written in place."""
    swiglu_projection("gemm_wg_swiglu", _matmul, x, w, out)
