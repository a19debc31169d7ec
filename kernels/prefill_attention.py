"""Causal multi-head attention over a prompt chunk, CPU twin of prefill_attention.cu.

Query t sits at absolute position p = start_pos + t and attends keys 0..p of the KV cache (the cache already holds
the start_pos earlier tokens plus this chunk, written by rope_qkv). GQA: query head h reads kv head h // (Hq // Hkv).

The CPU version mirrors the GPU algorithm (FlashAttention's online softmax) rather than materialising a [T, T]
score matrix: a work item is (q head, block of BQ queries); it sweeps the keys in tiles of BK, keeping per query a
running max m, running denominator l and unnormalised output acc. When a tile raises the max from m to m', the
old acc and l are rescaled by exp(m - m'), so every exp argument is <= 0 and nothing overflows. A K/V tile is
reused by all BQ queries of the block while it is still in L1. Work items run in parallel (prange) when the
call is big enough to pay for waking the worker threads.
"""
import numpy as np
from numba import njit, prange

BQ = 16   # queries per work item: K/V tile reuse vs. enough items to keep both cores busy
BK = 64   # keys per tile: a K tile (BK * D * 4 bytes = 16 KiB at D = 64) stays in L1 across the block

# Reassociation lets LLVM vectorise the q.k dot product (a reduction); no nnan/ninf, so IEEE inf/NaN still hold.
_FM = {"reassoc", "contract"}


@njit(cache=True, nogil=True, fastmath=_FM)
def attend_rows(q, t0, h, n, k_cache, v_cache, kvh, last0, scale, out):
    """Row i < n is query q[t0 + i, h] attending keys 0..last0 + i of kv head kvh; result to out[t0 + i, h]."""
    D = q.shape[2]
    acc = np.zeros((n, D), np.float32)
    m = np.full(n, -np.inf, np.float32)
    l = np.zeros(n, np.float32)
    s = np.empty(BK, np.float32)
    for k0 in range(0, last0 + n, BK):
        for i in range(n):
            end = min(k0 + BK, last0 + i + 1)  # causal: keys past this query's position are never read
            if end <= k0:
                continue
            mx = m[i]
            for j in range(k0, end):
                dot = np.float32(0.0)
                for d in range(D):
                    dot += q[t0 + i, h, d] * k_cache[kvh, j, d]
                dot *= scale
                s[j - k0] = dot
                mx = max(mx, dot)
            corr = np.exp(m[i] - mx)  # exp(-inf) = 0 on the first tile, when acc and l are still 0
            l[i] *= corr
            for d in range(D):
                acc[i, d] *= corr
            for j in range(k0, end):
                pj = np.exp(s[j - k0] - mx)
                l[i] += pj
                for d in range(D):
                    acc[i, d] += pj * v_cache[kvh, j, d]
            m[i] = mx
    for i in range(n):
        inv = np.float32(1.0) / l[i]
        for d in range(D):
            out[t0 + i, h, d] = acc[i, d] * inv


@njit(cache=True, nogil=True)
def _work_item(item, nqb, T):
    """Work item -> (q head, first query, number of queries)."""
    h = item // nqb
    r = item % nqb
    # Causal blocks get costlier with t; prange hands each thread a contiguous range of items, so visit blocks
    # zig-zag (0, last, 1, last-1, ...) to give any contiguous range a fair mix of cheap and costly blocks.
    qb = r // 2 if r % 2 == 0 else nqb - 1 - r // 2
    t0 = qb * BQ
    return h, t0, min(BQ, T - t0)


# Two drivers, not one function jitted twice: numba's on-disk cache is keyed by function, not by compile flags.
@njit(cache=True, nogil=True, parallel=True)
def attention_parallel(q, k_cache, v_cache, start_pos, scale, out):
    T, Hq, _ = q.shape
    group = Hq // k_cache.shape[0]
    nqb = (T + BQ - 1) // BQ
    for item in prange(Hq * nqb):
        h, t0, n = _work_item(item, nqb, T)
        attend_rows(q, t0, h, n, k_cache, v_cache, h // group, start_pos + t0, scale, out)


@njit(cache=True, nogil=True)
def attention_serial(q, k_cache, v_cache, start_pos, scale, out):
    T, Hq, _ = q.shape
    group = Hq // k_cache.shape[0]
    nqb = (T + BQ - 1) // BQ
    for item in range(Hq * nqb):
        h, t0, n = _work_item(item, nqb, T)
        attend_rows(q, t0, h, n, k_cache, v_cache, h // group, start_pos + t0, scale, out)


# Waking the idle OpenMP threads costs ~40 us on a 2-vCPU box (passive wait policy), as much as a whole serial
# decode step over ~2k keys with 6 heads of 64; below this many q.k multiply-adds one thread is faster.
PARALLEL_MIN_MACS = 1 << 20


def attention(q, k_cache, v_cache, start_pos, scale, out):
    """Runs the causal kernel on q [T, Hq, D] at positions start_pos.., picking serial or parallel by size."""
    T, Hq, D = q.shape
    macs = Hq * D * T * (start_pos + (T + 1) // 2)
    run = attention_parallel if macs >= PARALLEL_MIN_MACS else attention_serial
    run(q, k_cache, v_cache, int(start_pos), np.float32(scale), out)


def check_shapes(op, q, k_cache, v_cache, n_keys, out):
    """Shared by the prefill and decode wrappers: q, out [T, Hq, D]; caches [Hkv, S, D] holding n_keys keys."""
    T, Hq, D = q.shape
    Hkv, S, Dk = k_cache.shape
    if out.shape != q.shape or v_cache.shape != k_cache.shape or Dk != D:
        raise ValueError(f"{op}: q {q.shape}, out {out.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    if Hq % Hkv:
        raise ValueError(f"{op}: {Hq} query heads is not a multiple of {Hkv} kv heads")
    if not 0 < n_keys <= S:
        raise ValueError(f"{op}: {n_keys} keys do not fit a cache of {S}")


def prefill_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, start_pos: int, scale: float,
                      out: np.ndarray) -> None:
    """q: float32[T, Hq, D]; k_cache, v_cache: float32[Hkv, S, D] holding keys 0..start_pos+T-1;
    out: float32[T, Hq, D], written in place."""
    check_shapes("prefill_attention", q, k_cache, v_cache, start_pos + q.shape[0], out)
    if start_pos < 0:
        raise ValueError(f"prefill_attention: start_pos {start_pos} < 0")
    attention(q, k_cache, v_cache, start_pos, scale, out)
