"""A decode step's gate_up projection with SwiGLU as its epilogue, CPU twin of gemm_wg.cu: out[m, i] =
silu(x[m] . w[i]) * (x[m] . w[I + i]) for w = gate_up [2I, K], with silu_mul's roundings on the product; the
_scaled form scales each row by its RMSNorm inv first, as silu_mul_scaled does.

The GPU kernel is a whole GEMM on Hopper's wgmma (TMA loads, warp-specialised, SwiGLU in registers); what it
computes is the plain product followed by silu_mul, so the twin is that: NumPy's matmul (BLAS, as the CPU backend's
`linear`), then kernels/activation.py's silu_mul (or silu_mul_scaled).
"""
import numpy as np

from .activation import silu_mul_scaled
from .gemv import swiglu_projection


def _matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    np.matmul(x, w.T, out=out)


def gemm_wg_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K], any M; w: float32[2I, K]; out: float32[M, I], written in place."""
    swiglu_projection("gemm_wg_swiglu", _matmul, x, w, out)


def gemm_wg_swiglu_scaled(x: np.ndarray, w: np.ndarray, parts: np.ndarray, eps: float, out: np.ndarray) -> None:
    """gemm_wg_swiglu, each row scaled by rsqrt(sum of parts[:, m] / (16 tiles) + eps) before SwiGLU; parts:
    float32[tiles, M]."""
    M, K = x.shape
    I = w.shape[0] // 2
    if w.shape != (2 * I, K) or out.shape != (M, I) or parts.ndim != 2 or parts.shape[1] != M:
        raise ValueError(f"gemm_wg_swiglu_scaled: x {x.shape}, w {w.shape}, parts {parts.shape}, out {out.shape}")
    gate_up = np.empty((M, 2 * I), np.float32)
    _matmul(x, w, gate_up)
    silu_mul_scaled(gate_up, parts, eps, out)
