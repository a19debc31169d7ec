"""Streamed projection, CPU twin of gemm_stream.cu: y = x @ w.T for 1-32 rows with the weights streamed through
shared memory (the MLP's gate_up, with SwiGLU as its epilogue, and down, in a decode step of 2-32 rows).

On the CPU BLAS streams the weights at memory speed for any number of rows, so the twin is the matmul the CPU
backend's `linear` uses; it exists so the GPU kernel has a reference under its own name. `block_tiles` and
`tile_rows` replay the kernel's work split (which block owns which tiles, which weight rows a tile holds), so a
test can check in NumPy that every weight row is streamed once and that SwiGLU's gate and up meet in one lane.
"""
import numpy as np

from .gemv import projection, swiglu_projection

MAX_ROWS = 32  # gemm_stream.cu is instantiated for NT = 1, 2, 4 n-tiles of 8 rows


def gemm_stream(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """x: float32[M, K] (M <= 32); w: float32[N, K]; out: float32[M, N], written in place."""
    projection("gemm_stream", MAX_ROWS, x, w, out)


def gemm_stream_swiglu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for w = gate_up [2I, K]: the projection, then silu_mul's
    rounding, as gemm_stream.cu's SWIGLU epilogue does it. float32, M <= MAX_ROWS."""
    swiglu_projection("gemm_stream_swiglu", gemm_stream, x, w, out)


def block_tiles(b: int, tiles: int, blocks: int) -> range:
    """The tiles block b of a slice owns: [b T / B, (b + 1) T / B) (gemm_stream.cu's t0, nt)."""
    return range(b * tiles // blocks, (b + 1) * tiles // blocks)


def tile_rows(t: int, n: int, swiglu: bool) -> list:
    """The 16 weight rows of tile t, as the mma tile's rows 0-15 (gemm_stream.cu's copy_tile source): 16 t..16 t+15,
    or with swiglu (n = I) gate rows 8 t..8 t+7 then up rows I + 8 t..; a lane holds rows g and g + 8."""
    if swiglu:
        return [8 * t + r for r in range(8)] + [n + 8 * t + r for r in range(8)]
    return [16 * t + r for r in range(16)]
