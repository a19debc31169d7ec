"""Small-batch projection, CPU twin of gemv.cu: y[m, n] = sum_k x[m, k] * w[n, k] (y = x @ w.T), its SwiGLU form
(gemv_swiglu: the gate_up projection with silu(gate) * up as the epilogue) and its RoPE form (gemv_rope: the qkv
projection with rope_qkv as the epilogue).

On the CPU BLAS already streams the weights at memory speed for any number of rows, so the twin is the same
matmul the CPU backend's `linear` uses; it exists so the GPU kernel has a reference under its own name.
"""
import numpy as np

from .activation import silu_mul
from .rope import rope_qkv

MAX_ROWS = 4  # gemv.cu is instantiated for M = 1..4


def projection(op: str, max_rows: int, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out = x @ w.T for x float32[M, K] (1 <= M <= max_rows), w float32[N, K], out float32[M, N] (in place); the
    twin of every small-batch projection kernel (this file's gemv, gemm_skinny.py's), named `op` in its errors."""
    M, K = x.shape
    if not 1 <= M <= max_rows or w.shape[1] != K or out.shape != (M, w.shape[0]):
        raise ValueError(f"{op}: x {x.shape}, w {w.shape}, out {out.shape} (1 <= M <= {max_rows})")
    np.matmul(x, w.T, out=out)


def swiglu_projection(op: str, project, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for w = gate_up [2I, K]: `project` into gate_up, then
    silu_mul's rounding, as a kernel with SwiGLU in its epilogue does it; named `op` in its errors."""
    M, K = x.shape
    I = w.shape[0] // 2
    if w.shape != (2 * I, K) or out.shape != (M, I):
        raise ValueError(f"{op}: x {x.shape}, w {w.shape}, out {out.shape} (w [2I, K], out [M, I])")
    gate_up = np.empty((M, 2 * I), np.float32)
    project(x, w, gate_up)
    silu_mul(gate_up, out)


def rope_projection(project, x: np.ndarray, w: np.ndarray, bias, cos: np.ndarray, sin: np.ndarray,
                    positions: np.ndarray, slot_mapping: np.ndarray, n_heads: int, n_kv_heads: int, q_out: np.ndarray,
                    k_cache: np.ndarray, v_cache: np.ndarray) -> None:
    """The qkv projection by `project`, then rope_qkv's twin (no q/k norms): q -> q_out [M, Hq, D], K/V -> the
    caches at slot_mapping, with rope_qkv's skips; what a kernel with RoPE in its epilogue computes."""
    qkv = np.empty((x.shape[0], w.shape[0]), np.float32)
    project(x, w, qkv)
    rope_qkv(qkv, bias, None, None, 0.0, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
             v_cache)


def gemv(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 4); w: float32[N, K]; out: float32[M, N], written in place."""
    projection("gemv", MAX_ROWS, x, w, out)


def gemv_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """swiglu_projection over gemv, as gemv.cu's gemv_swiglu does it. float32, M <= MAX_ROWS."""
    swiglu_projection("gemv_swiglu", gemv, x, w, out)


def gemv_rope(x: np.ndarray, w: np.ndarray, bias, cos: np.ndarray, sin: np.ndarray, positions: np.ndarray,
              slot_mapping: np.ndarray, n_heads: int, n_kv_heads: int, q_out: np.ndarray, k_cache: np.ndarray,
              v_cache: np.ndarray) -> None:
    """rope_projection over gemv, as gemv.cu's gemv_rope does it. float32, M <= MAX_ROWS."""
    rope_projection(gemv, x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
                    v_cache)
