"""Varlen causal attention over a paged KV cache, CPU twin of prefill_attention.cu (and home of the shared core).

Layout (SPEC "Paged KV cache layout"): k_cache, v_cache are [num_slots, Hkv, D]; key j of sequence b lives at slot
block_tables[b, j // block_size] * block_size + j % block_size. The queries of sequence b are rows
query_start_loc[b] .. query_start_loc[b+1]-1 of the flat q [N, Hq, D]; with q_len = the row count and L = seq_lens[b]
(the context length, this step's keys already written by rope_qkv), query i sits at position L - q_len + i and
attends keys 0..that position. GQA: query head h reads kv head h // (Hq // Hkv).

The core (attend) mirrors the GPU algorithm, FlashAttention's online softmax, rather than materialising a [T, T]
score matrix. A work item is one kv head and a block of queries of one sequence; its rows are every (query, head)
pair of the block over the `group` query heads that share the kv head, so each K/V tile is read once for all of
them. The item sweeps its keys in tiles of BK, looking each tile's slots up in the block table once (K/V are read
in place, no gather copy), and keeps per row a running max m, running denominator l and unnormalised output acc.
When a tile raises the max from m to m', the old acc and l are rescaled by exp(m - m'), so every exp argument is
<= 0 and nothing overflows. Decode (kernels/decode_attention.py) is the same core with one query per item.
"""
import numpy as np
from numba import njit, prange

ROWS = 16  # (query, head) rows per work item: K/V tile reuse vs. enough items to keep both cores busy
BK = 64    # keys per tile: a K tile (BK * D * 4 bytes = 16 KiB at D = 64) stays in L1 across the item's rows

# Reassociation lets LLVM vectorise the q.k dot product (a reduction); no nnan/ninf, so IEEE inf/NaN still hold.
_FM = {"reassoc", "contract"}

# Waking the idle OpenMP threads costs ~40 us on a 2-vCPU box (passive wait policy), as much as a whole serial
# decode step over ~2k keys with 6 heads of 64; below this many q.k multiply-adds one thread is faster.
PARALLEL_MIN_MACS = 1 << 20


@njit(cache=True, nogil=True, fastmath=_FM)
def attend(q, t0, n, h0, nh, k_cache, v_cache, kvh, table, block_size, last0, scale, out):
    """Rows (i < n, hh < nh): query q[t0 + i, h0 + hh] attends keys 0..last0 + i of kv head kvh, read through the
    block table row `table`; result to out[t0 + i, h0 + hh]. A row with no key (last0 + i < 0) gets zeros."""
    D = q.shape[2]
    acc = np.zeros((n * nh, D), np.float32)
    m = np.full(n * nh, -np.inf, np.float32)
    l = np.zeros(n * nh, np.float32)
    s = np.empty(BK, np.float32)
    slots = np.empty(BK, np.int64)
    for k0 in range(0, last0 + n, BK):
        kend = min(k0 + BK, last0 + n)
        for j in range(k0, kend):  # one block-table lookup per key per item, shared by all rows
            slots[j - k0] = table[j // block_size] * block_size + j % block_size
        for i in range(n):
            end = min(kend, last0 + i + 1)  # causal: keys past this query's position are never read
            if end <= k0:
                continue
            for hh in range(nh):
                r = i * nh + hh
                h = h0 + hh
                mx = m[r]
                for j in range(k0, end):
                    slot = slots[j - k0]
                    dot = np.float32(0.0)
                    for d in range(D):
                        dot += q[t0 + i, h, d] * k_cache[slot, kvh, d]
                    dot *= scale
                    s[j - k0] = dot
                    mx = max(mx, dot)
                corr = np.exp(m[r] - mx)  # exp(-inf) = 0 on the first tile, when acc and l are still 0
                l[r] *= corr
                for d in range(D):
                    acc[r, d] *= corr
                for j in range(k0, end):
                    pj = np.exp(s[j - k0] - mx)
                    l[r] += pj
                    slot = slots[j - k0]
                    for d in range(D):
                        acc[r, d] += pj * v_cache[slot, kvh, d]
                m[r] = mx
    for i in range(n):
        for hh in range(nh):
            r = i * nh + hh
            inv = np.float32(1.0) / l[r] if l[r] > 0 else np.float32(0.0)
            for d in range(D):
                out[t0 + i, h0 + hh, d] = acc[r, d] * inv


@njit(cache=True, nogil=True)
def check_tables(block_tables, seq_lens, block_size, num_slots):
    """Index of the first sequence whose length exceeds its block-table row or whose blocks (up to its length) lie
    outside the cache, else -1. Numba does not bounds-check, so this is what keeps a bad table from reading
    arbitrary memory."""
    M = block_tables.shape[1]
    num_blocks = num_slots // block_size
    for b in range(seq_lens.shape[0]):
        L = seq_lens[b]
        if L < 0 or L > M * block_size:
            return b
        for blk in range((L + block_size - 1) // block_size):
            if block_tables[b, blk] < 0 or block_tables[b, blk] >= num_blocks:
                return b
    return -1


@njit(cache=True, nogil=True)
def descending_order(x):
    """Indices of x by descending value, equal values in ascending index, NaN last: a bottom-up merge sort.

    Written out because a cached kernel must not call numba's np.sort / np.argsort (nor partition, unique,
    searchsorted, sorted). Numba names a compiled function by qualified name, argument types and a per-process
    counter, and its sort factory makes np.sort's and np.argsort's helpers under one name with the same types: two
    cache files written by different processes can then hold one symbol with two bodies, and the first one loaded
    serves both. That is how sparse_prefill's cached np.sort once stood in for _plan's np.argsort (garbage work
    items, then MemoryError or a segfault; tests/kernels/test_numba_cache.py)."""
    n = x.shape[0]
    a = np.arange(n)
    b = np.empty(n, np.int64)
    w = 1
    while w < n:
        for lo in range(0, n, 2 * w):
            mid, hi = min(lo + w, n), min(lo + 2 * w, n)
            i, j = lo, mid
            for k in range(lo, hi):
                # Take the right run's head only when it ranks strictly first: ties keep index order (stable).
                if i < mid and (j >= hi or not (x[a[j]] > x[a[i]] or (x[a[i]] != x[a[i]] and x[a[j]] == x[a[j]]))):
                    b[k] = a[i]
                    i += 1
                else:
                    b[k] = a[j]
                    j += 1
        a, b = b, a
        w *= 2
    return a


@njit(cache=True, nogil=True)
def _plan(query_start_loc, seq_lens, bq):
    """Query blocks of every sequence as rows (sequence, first row, n, position of the first query), ordered so that
    any contiguous range of blocks mixes cheap and costly ones: prange hands each thread a contiguous range of
    items, and causal blocks deep into a long sequence cost far more than early ones. Blocks are sorted by cost and
    visited zig-zag (costliest, cheapest, 2nd costliest, ...)."""
    B = seq_lens.shape[0]
    nblk = 0
    for b in range(B):
        nblk += (query_start_loc[b + 1] - query_start_loc[b] + bq - 1) // bq
    blocks = np.empty((nblk, 4), np.int64)
    cost = np.empty(nblk, np.int64)
    k = 0
    for b in range(B):
        q_len = query_start_loc[b + 1] - query_start_loc[b]
        for t in range(0, q_len, bq):
            n = min(bq, q_len - t)
            last0 = seq_lens[b] - q_len + t
            blocks[k, 0], blocks[k, 1], blocks[k, 2], blocks[k, 3] = b, query_start_loc[b] + t, n, last0
            cost[k] = n * (last0 + n)
            k += 1
    order = descending_order(cost)
    zig = np.empty((nblk, 4), np.int64)
    for r in range(nblk):
        zig[r] = blocks[order[r // 2 if r % 2 == 0 else nblk - 1 - r // 2]]
    return zig


# Two drivers, not one function jitted twice: numba's on-disk cache is keyed by function, not by compile flags.
@njit(cache=True, nogil=True, parallel=True)
def _prefill_parallel(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out):
    Hkv = k_cache.shape[1]
    group = q.shape[1] // Hkv
    nblk = blocks.shape[0]
    for item in prange(Hkv * nblk):
        kvh, r = item // nblk, item % nblk
        b, t0, n, last0 = blocks[r, 0], blocks[r, 1], blocks[r, 2], blocks[r, 3]
        attend(q, t0, n, kvh * group, group, k_cache, v_cache, kvh, block_tables[b], block_size, last0, scale, out)


@njit(cache=True, nogil=True)
def _prefill_serial(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out):
    Hkv = k_cache.shape[1]
    group = q.shape[1] // Hkv
    nblk = blocks.shape[0]
    for item in range(Hkv * nblk):
        kvh, r = item // nblk, item % nblk
        b, t0, n, last0 = blocks[r, 0], blocks[r, 1], blocks[r, 2], blocks[r, 3]
        attend(q, t0, n, kvh * group, group, k_cache, v_cache, kvh, block_tables[b], block_size, last0, scale, out)


@njit(cache=True, nogil=True)
def _prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale, out, min_macs):
    """Validates (returns the first bad sequence, or -1), then runs the serial or parallel driver by size."""
    B = seq_lens.shape[0]
    if query_start_loc[0] < 0 or query_start_loc[B] > q.shape[0]:
        return B
    for b in range(B):
        q_len = query_start_loc[b + 1] - query_start_loc[b]
        if q_len < 0 or q_len > seq_lens[b]:
            return b
    bad = check_tables(block_tables, seq_lens, block_size, k_cache.shape[0])
    if bad >= 0:
        return bad
    Hq, D = q.shape[1], q.shape[2]
    bq = max(1, ROWS // (Hq // k_cache.shape[1]))
    blocks = _plan(query_start_loc, seq_lens, bq)
    macs = 0
    for r in range(blocks.shape[0]):
        macs += blocks[r, 2] * (blocks[r, 3] + (blocks[r, 2] + 1) // 2) * Hq * D
    if macs >= min_macs:
        _prefill_parallel(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out)
    else:
        _prefill_serial(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out)
    return -1


@njit(cache=True, nogil=True)
def decode(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, min_macs):
    """One decode step (kernels/decode_attention.py): validates (returns the first bad sequence, or -1), then runs
    the prefill drivers by size, one query block per sequence (its row b, at position seq_lens[b] - 1). One
    compiled entry point: the choice costs no extra Python-level dispatch on the per-token path."""
    bad = check_tables(block_tables, seq_lens, block_size, k_cache.shape[0])
    if bad >= 0:
        return bad
    B = seq_lens.shape[0]
    blocks = np.empty((B, 4), np.int64)
    keys = 0
    for b in range(B):
        blocks[b, 0], blocks[b, 1], blocks[b, 2], blocks[b, 3] = b, b, 1, seq_lens[b] - 1
        keys += seq_lens[b]
    if keys * q.shape[1] * q.shape[2] >= min_macs:
        _prefill_parallel(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out)
    else:
        _prefill_serial(q, k_cache, v_cache, block_tables, blocks, block_size, scale, out)
    return -1


def check_shapes(op, q, k_cache, v_cache, block_tables, seq_lens, block_size, out):
    """Shared by the prefill and decode wrappers: dtypes, q/out [rows, Hq, D], caches [num_slots, Hkv, D]."""
    for name, a, dt in (("q", q, np.float32), ("out", out, np.float32), ("k_cache", k_cache, np.float32),
                        ("v_cache", v_cache, np.float32), ("block_tables", block_tables, np.int32),
                        ("seq_lens", seq_lens, np.int32)):
        if a.dtype != dt:
            raise ValueError(f"{op}: {name} dtype {a.dtype} != {np.dtype(dt)}")
    if q.ndim != 3 or out.shape != q.shape or k_cache.ndim != 3 or v_cache.shape != k_cache.shape \
            or k_cache.shape[2] != q.shape[2]:
        raise ValueError(f"{op}: q {q.shape}, out {out.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"{op}: {q.shape[1]} query heads is not a multiple of {k_cache.shape[1]} kv heads")
    if seq_lens.ndim != 1 or block_tables.ndim != 2 or block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"{op}: block_tables {block_tables.shape} must be [B, M] for seq_lens {seq_lens.shape} [B]")
    if block_size < 1:
        raise ValueError(f"{op}: block_size {block_size} < 1")


def bad_sequence(op, b, block_tables, seq_lens, block_size, num_slots, extra=""):
    """The ValueError for sequence b, rejected by check_tables or the query-range checks."""
    L = int(seq_lens[b])
    used = block_tables[b, :max(0, min(-(-L // block_size), block_tables.shape[1]))].tolist()
    return ValueError(f"{op}: sequence {b}: seq_len {L}{extra}, blocks {used} of block_size {block_size}: out of "
                      f"range (block table row holds {block_tables.shape[1]} blocks, cache {num_slots} slots)")


def prefill_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                      query_start_loc: np.ndarray, seq_lens: np.ndarray, block_size: int, scale: float,
                      out: np.ndarray) -> None:
    """q, out: float32[N, Hq, D] (only rows query_start_loc[0]..query_start_loc[B]-1 are read / written);
    k_cache, v_cache: float32[num_slots, Hkv, D]; block_tables: int32[B, M]; query_start_loc: int32[B+1];
    seq_lens: int32[B], context lengths including this step's queries."""
    op = "prefill_attention"
    check_shapes(op, q, k_cache, v_cache, block_tables, seq_lens, block_size, out)
    B = seq_lens.shape[0]
    if query_start_loc.dtype != np.int32 or query_start_loc.shape != (B + 1,):
        raise ValueError(f"{op}: query_start_loc {query_start_loc.dtype}{query_start_loc.shape} != int32[{B + 1}]")
    bad = _prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, int(block_size), np.float32(scale),
                   out, PARALLEL_MIN_MACS)
    if bad == B:
        raise ValueError(f"{op}: query_start_loc {query_start_loc[0]}..{query_start_loc[B]} "
                         f"outside q's {q.shape[0]} rows")
    if bad >= 0:
        raise bad_sequence(op, bad, block_tables, seq_lens, block_size, k_cache.shape[0],
                           f", q_len {query_start_loc[bad + 1] - query_start_loc[bad]}")


# -- key splits (prefill_attention_wg's split mode and prefill_attention_merge, prefill_attention.cu) -------------
MIN_SPLIT_KEYS = 256  # WG_MIN_SPLIT_KEYS in prefill_attention.cu


def split_keys(kv_len: int, n_splits: int, bn: int, min_keys: int = MIN_SPLIT_KEYS) -> int:
    """Keys a split takes of a query tile whose keys are 0..kv_len-1: kv_len spread over n_splits in whole tiles of
    bn keys, at least min_keys; splits 0..ceil(kv_len / chunk) - 1 are the non-empty ones (split_keys in the .cu)."""
    c = -(-kv_len // n_splits)
    return max(min_keys, -(-c // bn) * bn)


def _tile_rows(query_start_loc, seq_lens, b, max_len, bq):
    """Sequence b's rows: (first flat row, n, start position, len) and, per row t, its tile's kv_len."""
    qs, n = int(query_start_loc[b]), int(query_start_loc[b + 1] - query_start_loc[b])
    L = min(max(int(seq_lens[b]), 0), max_len)
    start = max(L - n, 0)
    t = np.arange(n)
    kv_len = np.minimum(start + np.minimum(t // bq * bq + bq, n), L)
    return qs, n, start, kv_len


def prefill_attention_splits(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale,
                             n_splits, bq, bn, min_keys=MIN_SPLIT_KEYS):
    """What prefill_attention_wg's blocks write with n_splits > 1, in float64 for the rows the merge reads: ws_o
    [N, Hq, n_splits, D] (unnormalised outputs), ws_ml [N, Hq, n_splits, 2] (running max in log2 units, sum); NaN
    where a split holds no key of the row. A reference for tests: the split of query t of sequence b is keys
    [s * chunk, min((s + 1) * chunk, its tile's kv_len)) up to its position, chunk = split_keys(kv_len, ...).
    bq, bn, min_keys: the kernel's queries a block, keys a tile and fewest keys a split (smaller ones in tests)."""
    N, Hq, D = q.shape
    Hkv, max_len = k_cache.shape[1], block_tables.shape[1] * block_size
    ws_o = np.full((N, Hq, n_splits, D), np.nan)
    ws_ml = np.full((N, Hq, n_splits, 2), np.nan)
    l2 = scale / np.log(2.0)  # scores in log2 units, as the kernel keeps them
    for b in range(seq_lens.shape[0]):
        qs, n, start, kv_len = _tile_rows(query_start_loc, seq_lens, b, max_len, bq)
        for t in range(n):
            chunk = split_keys(int(kv_len[t]), n_splits, bn, min_keys)
            last = min(start + t, int(kv_len[t]) - 1)  # the row's last key
            for s in range(n_splits):
                lo, hi = s * chunk, min((s + 1) * chunk - 1, last)
                if lo > hi:
                    continue
                keys = np.arange(lo, hi + 1)
                slots = block_tables[b, keys // block_size] * block_size + keys % block_size
                for h in range(Hq):
                    kvh = h // (Hq // Hkv)
                    sc = k_cache[slots, kvh].astype(np.float64) @ q[qs + t, h].astype(np.float64) * l2
                    m = sc.max()
                    p = np.exp2(sc - m)
                    ws_o[qs + t, h, s] = p @ v_cache[slots, kvh].astype(np.float64)
                    ws_ml[qs + t, h, s] = m, p.sum()
    return ws_o, ws_ml


def prefill_attention_merge(ws_o, ws_ml, query_start_loc, seq_lens, max_len, bq, bn, out, min_keys=MIN_SPLIT_KEYS):
    """CPU twin of prefill_attention_merge: out[row, h] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the
    splits that hold a key of the row (s * chunk < min(position + 1, kv_len)), M their max; zeros for a row with
    no key. Rows outside query_start_loc[0]..query_start_loc[B]-1 are not written."""
    n_splits = ws_o.shape[2]
    for b in range(seq_lens.shape[0]):
        qs, n, start, kv_len = _tile_rows(query_start_loc, seq_lens, b, max_len, bq)
        for t in range(n):
            seen = min(start + t + 1, int(kv_len[t]))
            nv = min(n_splits, -(-seen // split_keys(int(kv_len[t]), n_splits, bn, min_keys))) if seen > 0 else 0
            if nv == 0:
                out[qs + t] = 0
                continue
            m = ws_ml[qs + t, :, :nv, 0]
            f = np.exp2(m - m.max(axis=1, keepdims=True))  # [Hq, nv]
            L = (f * ws_ml[qs + t, :, :nv, 1]).sum(axis=1)
            out[qs + t] = (f[:, :, None] * ws_o[qs + t, :, :nv]).sum(axis=1) / L[:, None]
