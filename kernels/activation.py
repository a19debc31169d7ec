"""SwiGLU activation, CPU twin of activation.cu: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); and its
silu_mul_scaled form, which first applies the RMSNorm scale that gemm_skinny_norm (the plan's skinny_norm) left over.

gate_up is the fused projection [T, 2I]: gate in the first I columns, up in the last I. One fused loop reads both
halves once and writes `out` without the [T, I] temporaries a NumPy expression would allocate.
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _silu_mul(gate_up, out):
    T, I = out.shape
    for t in range(T):
        for i in range(I):
            g = gate_up[t, i]
            # For g << 0, exp(-g) overflows to inf and g / inf = -0.0: the correct limit, no NaN.
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, I + i]


def silu_mul(gate_up: np.ndarray, out: np.ndarray) -> None:
    """gate_up: float32[T, 2I]; out: float32[T, I], written in place."""
    if gate_up.ndim != 2 or out.shape != (gate_up.shape[0], gate_up.shape[1] // 2) or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up {gate_up.shape}, out {out.shape}")
    _silu_mul(gate_up, out)


def silu_mul_scaled(gate_up: np.ndarray, parts: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[t] = silu(inv_t * gate) * (inv_t * up) with inv_t = rsqrt(sum over tiles of parts[:, t] / H + eps),
    H = 16 * tiles: the scale of the RMSNorm whose weight gemm_skinny_norm already applied (W (inv h * w) = inv
    W (h * w)). gate_up: float32[T, 2I]; parts: float32[tiles, T]; out: float32[T, I], written in place."""
    T = gate_up.shape[0]
    if parts.ndim != 2 or parts.shape[1] != T:
        raise ValueError(f"silu_mul_scaled: gate_up {gate_up.shape}, parts {parts.shape}")
    ss = parts.astype(np.float64).sum(axis=0)
    inv = (1.0 / np.sqrt(ss / (16 * parts.shape[0]) + eps)).astype(np.float32)
    silu_mul(gate_up * inv[:, None], out)
