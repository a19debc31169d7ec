"""Greedy pick, CPU twin of argmax.cu.

NumPy's argmax is SIMD-vectorised and returns the lowest index on ties; a Numba loop over a 150k vocabulary is a
scalar loop and several times slower (see platform notes), so this stays NumPy.
"""
import numpy as np


def argmax(logits: np.ndarray) -> int:
    """logits: float32[V] -> index of the largest value (lowest index on ties), as a Python int."""
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"argmax: expected a non-empty 1-D array, got shape {logits.shape}")
    return int(np.argmax(logits))
