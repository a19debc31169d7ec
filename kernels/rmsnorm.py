"""Residual add + RMSNorm, CPU twin of rmsnorm.cu.

    if x is not None: residual += x          (written back: the next layer continues from it)
    out = weight * (residual * rsqrt(mean(residual^2) + eps))

Fusing both into one pass per row saves a [T, H] temporary and a second sweep over memory. The sum of squares is
accumulated in float64: free at these sizes and it keeps this twin a tight reference for the GPU kernel.
Aliasing is safe: `out` may be `x` or `residual` (each row is fully read before it is written).
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _add_rmsnorm(x, has_x, residual, weight, eps, out):
    T, H = residual.shape
    for t in range(T):
        ss = 0.0
        for i in range(H):
            r = residual[t, i]
            if has_x:
                r += x[t, i]  # fp32 add, like HF's `hidden_states + residual`
                residual[t, i] = r
            ss += np.float64(r) * np.float64(r)
        inv = np.float32(1.0 / np.sqrt(ss / H + eps))
        for i in range(H):
            # HF order: normalise in fp32 first, then scale by the weight.
            out[t, i] = weight[i] * (residual[t, i] * inv)


_NO_X = np.zeros((0, 0), np.float32)  # numba handles Optional arrays poorly: pass an empty array + a flag instead


def add_rmsnorm(x, residual: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """x: float32[T, H] or None; residual: float32[T, H] (updated in place when x is given); weight: float32[H];
    out: float32[T, H], written in place."""
    if residual.ndim != 2 or out.shape != residual.shape or weight.shape != residual.shape[1:]:
        raise ValueError(f"add_rmsnorm: residual {residual.shape}, weight {weight.shape}, out {out.shape}")
    if x is not None and x.shape != residual.shape:
        raise ValueError(f"add_rmsnorm: x {x.shape} != residual {residual.shape}")
    _add_rmsnorm(_NO_X if x is None else x, x is not None, residual, weight, float(eps), out)


def add_rmsnorm_partials(parts: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float,
                         out: np.ndarray) -> None:
    """add_rmsnorm with x = parts[0] + ... + parts[S-1] (float32 [S, T, H], added in slice order): the partial
    products of a GEMM split over K (twin of rmsnorm.cu's add_rmsnorm_partials)."""
    if parts.ndim != 3 or parts.shape[1:] != residual.shape:
        raise ValueError(f"add_rmsnorm_partials: parts {parts.shape}, residual {residual.shape}")
    add_rmsnorm(parts.sum(axis=0), residual, weight, eps, out)  # (NumPy adds an outer axis's slices in order)
