"""Greedy pick, CPU twin of argmax.cu: out[r] = argmax(logits[r]), lowest index on ties, -1 for a row with a NaN.

NumPy's argmax is SIMD-vectorised and returns the lowest index on ties; a Numba loop over a 150k vocabulary is a
scalar loop and several times slower (see platform notes), so this stays NumPy.
"""
import numpy as np


def argmax(logits: np.ndarray) -> np.ndarray:
    """logits: float32[R, V] (or [V]) -> int32[R] (or a 0-d array) of each row's largest value's index."""
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"argmax: expected non-empty rows, got shape {logits.shape}")
    idx = np.argmax(logits, axis=-1).astype(np.int32)  # np.argmax stops at the first NaN of a row
    nan = np.isnan(np.take_along_axis(logits, idx[..., None].astype(np.intp), axis=-1)[..., 0])
    return np.where(nan, np.int32(-1), idx).astype(np.int32)
