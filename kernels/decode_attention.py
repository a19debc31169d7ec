"""Single-query attention for one decode step, CPU twin of decode_attention.cu.

The new token (already in the KV cache at position length-1) attends keys 0..length-1. That is exactly prefill
attention with one query at start_pos = length - 1, so this reuses the same online-softmax kernel: one work item per
query head, run in parallel only for long contexts. (The GPU needs a split-sequence, flash-decoding kernel only
because one query per head cannot fill it.)
"""
import numpy as np

from kernels.prefill_attention import attention, check_shapes


def decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, length: int, scale: float,
                     out: np.ndarray) -> None:
    """q: float32[Hq, D]; k_cache, v_cache: float32[Hkv, S, D]; length: keys 0..length-1 are attended;
    out: float32[Hq, D], written in place."""
    # [None] views (never copies, unlike reshape of a non-contiguous array) give the [T=1, Hq, D] layout.
    q3, out3 = q[None], out[None]
    check_shapes("decode_attention", q3, k_cache, v_cache, length, out3)
    attention(q3, k_cache, v_cache, int(length) - 1, scale, out3)
