"""Skinny projection, CPU twin of gemm_skinny.cu: y[m, n] = sum_k x[m, k] * w[n, k] (y = x @ w.T) for a few rows,
its SwiGLU form (the gate_up projection with silu(gate) * up as the epilogue), its RoPE form
(gemm_skinny_rope: the qkv projection with rope_qkv as the epilogue) and its norm form (gemm_skinny_norm: the o
projection with add_rmsnorm's add and the norm weight as the epilogue, the norm's scale left to silu_mul_scaled).

The twin is kernels/gemv.py's `projection`, a matmul (that file says why). (The kernel's fragment layout is
replayed in NumPy by tests/kernels/test_gemm_skinny_layout.py.)
"""
import numpy as np

from .gemv import projection, rope_projection, swiglu_projection

MAX_ROWS = 32  # gemm_skinny.cu is instantiated for NT = 1, 2, 4 n-tiles of 8 rows


def gemm_skinny(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 32); w: float32[N, K]; out: float32[M, N], written in place."""
    projection("gemm_skinny", MAX_ROWS, x, w, out)


def gemm_skinny_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """swiglu_projection over gemm_skinny, as gemm_skinny.cu's SWIGLU epilogue does it. float32, M <= MAX_ROWS."""
    swiglu_projection("gemm_skinny_swiglu", gemm_skinny, x, w, out)


def gemm_skinny_rope(x: np.ndarray, w: np.ndarray, bias, cos: np.ndarray, sin: np.ndarray, positions: np.ndarray,
                     slot_mapping: np.ndarray, n_heads: int, n_kv_heads: int, q_out: np.ndarray, k_cache: np.ndarray,
                     v_cache: np.ndarray) -> None:
    """rope_projection over gemm_skinny, as gemm_skinny.cu's RoPE epilogue does it. float32, M <= MAX_ROWS."""
    rope_projection(gemm_skinny, x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
                    v_cache)


def gemm_skinny_norm(x: np.ndarray, w: np.ndarray, residual: np.ndarray, weight: np.ndarray, x_out: np.ndarray,
                     parts: np.ndarray) -> None:
    """residual += x @ w.T; x_out = residual * weight; parts[q, m] = the sum of residual[m, 16q:16q + 16]^2, in
    column order (the kernel's epilogue; kernels/activation.py's silu_mul_scaled applies the rest of the norm).
    float32, M <= MAX_ROWS, N % 16 == 0; parts float32[N / 16, M] (or larger: the first rows and columns)."""
    M, N = residual.shape
    if N % 16 or parts.shape[0] < N // 16 or parts.shape[1] < M:
        raise ValueError(f"gemm_skinny_norm: residual {residual.shape}, parts {parts.shape} (N % 16 == 0)")
    o = np.empty((M, N), np.float32)
    gemm_skinny(x, w, o)
    residual += o
    np.multiply(residual, weight, out=x_out)
    sq = (residual * residual).reshape(M, N // 16, 16)
    acc = sq[:, :, 0].copy()
    for k in range(1, 16):
        acc += sq[:, :, k]
    parts[:N // 16, :M] = acc.T
