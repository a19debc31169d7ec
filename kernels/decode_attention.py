"""Batched single-query attention for one decode step over a paged KV cache, CPU twin of decode_attention.cu.

Sequence b's new token (already in the cache at position seq_lens[b] - 1) attends keys 0..seq_lens[b]-1, found
through block_tables[b] (layout in kernels/prefill_attention.py). That is the prefill core with one query, so this
reuses its online-softmax `attend`: one work item per (sequence, kv head), whose rows are the `group` query heads
sharing that kv head, so each K/V tile is read once per group instead of once per query head. Items run in
parallel only when the step is big enough to pay for waking the worker threads. (The GPU needs a split-sequence,
flash-decoding kernel only because B * Hkv items cannot fill it.) seq_lens[b] == 0 marks a padding row: out[b] = 0.
The jitted entry point (`decode`, over the prefill drivers) lives beside `attend` in kernels/prefill_attention.py:
numba's cache does not notice a change to a callee in another file (tests/kernels/test_numba_cache.py).
"""
import numpy as np

import kernels.prefill_attention as _prefill


def decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                     seq_lens: np.ndarray, block_size: int, scale: float, out: np.ndarray) -> None:
    """q, out: float32[B, Hq, D]; k_cache, v_cache: float32[num_slots, Hkv, D]; block_tables: int32[B, M];
    seq_lens: int32[B] (0 = padding row). out is written in place."""
    _prefill.check_shapes("decode_attention", q, k_cache, v_cache, block_tables, seq_lens, block_size, out)
    if q.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"decode_attention: q {q.shape} has not one row per sequence (seq_lens {seq_lens.shape})")
    bad = _prefill.decode(q, k_cache, v_cache, block_tables, seq_lens, int(block_size), np.float32(scale), out,
                          _prefill.PARALLEL_MIN_MACS)
    if bad >= 0:
        raise _prefill.bad_sequence("decode_attention", bad, block_tables, seq_lens, block_size, k_cache.shape[0])
