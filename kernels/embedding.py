"""Token embedding lookup, CPU twin of embedding.cu: out[t] = table[ids[t]].

A row gather is exactly what np.take does (one memcpy per row), so NumPy is as fast as a loop could be.
"""
import numpy as np


def embedding(ids: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """ids: int32[T]; table: float32[V, H]; out: float32[T, H], written in place."""
    if out.shape != (ids.shape[0], table.shape[1]):
        raise ValueError(f"embedding: out {out.shape} != (T={ids.shape[0]}, H={table.shape[1]})")
    # np.take would silently accept negative ids (Python-style wrap-around); a negative token id is a bug upstream.
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise IndexError(f"embedding: token id out of range [0, {table.shape[0]})")
    # Bounds are checked above, so mode="clip" never clips; it only skips the buffered copy that the default
    # mode="raise" makes when `out` is given.
    np.take(table, ids, axis=0, out=out, mode="clip")
