"""Batched single-query attention for one decode step over a paged KV cache, CPU twin of decode_attention.cu.

Sequence b's new token (already in the cache at position seq_lens[b] - 1) attends keys 0..seq_lens[b]-1, found
through block_tables[b] (layout in kernels/prefill_attention.py). That is the prefill core with one query, so this
reuses its online-softmax `attend`: one work item per (sequence, kv head), whose rows are the `group` query heads
sharing that kv head, so each K/V tile is read once per group instead of once per query head. Items run in
parallel only when the step is big enough to pay for waking the worker threads. (The GPU needs a split-sequence,
flash-decoding kernel only because B * Hkv items cannot fill it.) seq_lens[b] == 0 marks a padding row: out[b] = 0.
"""
import numpy as np
from numba import njit, prange

import kernels.prefill_attention as _prefill
from kernels.prefill_attention import attend, bad_sequence, check_shapes, check_tables


# Two drivers, not one function jitted twice: numba's on-disk cache is keyed by function, not by compile flags.
@njit(cache=True, nogil=True, parallel=True)
def _decode_parallel(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out):
    Hkv = k_cache.shape[1]
    group = q.shape[1] // Hkv
    for item in prange(seq_lens.shape[0] * Hkv):
        b, kvh = item // Hkv, item % Hkv
        attend(q, b, 1, kvh * group, group, k_cache, v_cache, kvh, block_tables[b], block_size, seq_lens[b] - 1,
               scale, out)


@njit(cache=True, nogil=True)
def _decode_serial(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out):
    Hkv = k_cache.shape[1]
    group = q.shape[1] // Hkv
    for item in range(seq_lens.shape[0] * Hkv):
        b, kvh = item // Hkv, item % Hkv
        attend(q, b, 1, kvh * group, group, k_cache, v_cache, kvh, block_tables[b], block_size, seq_lens[b] - 1,
               scale, out)


@njit(cache=True, nogil=True)
def _decode(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, min_macs):
    """Validates (returns the first bad sequence, or -1), then runs the serial or parallel driver by size. One
    compiled entry point: the choice costs no extra Python-level dispatch on the per-token path."""
    bad = check_tables(block_tables, seq_lens, block_size, k_cache.shape[0])
    if bad >= 0:
        return bad
    keys = 0
    for b in range(seq_lens.shape[0]):
        keys += seq_lens[b]
    if keys * q.shape[1] * q.shape[2] >= min_macs:
        _decode_parallel(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out)
    else:
        _decode_serial(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out)
    return -1


def decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                     seq_lens: np.ndarray, block_size: int, scale: float, out: np.ndarray) -> None:
    """q, out: float32[B, Hq, D]; k_cache, v_cache: float32[num_slots, Hkv, D]; block_tables: int32[B, M];
    seq_lens: int32[B] (0 = padding row). out is written in place."""
    check_shapes("decode_attention", q, k_cache, v_cache, block_tables, seq_lens, block_size, out)
    if q.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"decode_attention: q {q.shape} has not one row per sequence (seq_lens {seq_lens.shape})")
    bad = _decode(q, k_cache, v_cache, block_tables, seq_lens, int(block_size), np.float32(scale), out,
                  _prefill.PARALLEL_MIN_MACS)
    if bad >= 0:
        raise bad_sequence("decode_attention", bad, block_tables, seq_lens, block_size, k_cache.shape[0])
