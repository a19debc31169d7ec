"""Sparse prefill: indexer, top-k over key blocks, sparse attention. CPU twin of sparse_prefill.cu.

For the B prefill requests of a step (rows [qsl[b], qsl[b+1]) of the flat q, local row t = row - qsl[0],
positions ending at seq_lens[b] - 1), block size R and query tile Q (toolkit/sparse.py query_tile():
sparse_query_tile, at most W - R + 2). A request's queries form tile rows by pos // Q; tiles are aligned to
positions, so a prompt prefilled in chunks has the same tiles as in one step wherever a chunk boundary falls on a
multiple of Q (a tile cut by a boundary is two tile rows, each with its own queries' mean). The steps, one
function each: compress_keys (key block means kbar) -> query_means (tile means qbar) -> indexer_scores ->
topk_blocks -> kernels/combine.py (the top-k blocks and the window as workspace row ids) -> sparse_attention.

Q = 1 is the issue's per-query score. Q = 64 (the default) lets 64 neighbouring queries share one selection, so
the tensor-core kernel's 64-query tile reads K blocks instead of the union of 64 different sets (README, "Sparse
prefill"). A row's blocks past its tile's candidates start at or after p_first - R + 2 and its window at
pos - W + 1 <= p_first + Q - W, so with Q <= W - R + 2 they are all in its window: a row whose tile takes every
candidate sees every key 0..pos, and the exactness invariant holds for any Q.

Workspace row ids (reference A.4): request b owns ids [b*M, b*M + M); id b*M + j < b*M + N is key block j
(tokens [jR, jR+R)), id b*M + N + i is window token gstart + i, gstart = seq_len - gather_len. The keys are read
from the paged cache through the block table (slot = table[k // bs] * bs + k % bs): nothing is gathered.
When every complete block is selected the key set is exactly 0..pos (W >= R), so the result is dense causal
attention: the exactness invariant the tests check.
"""
import numpy as np
from numba import njit, prange

_FM = {"reassoc", "contract"}


@njit(cache=True, nogil=True, parallel=True)
def _compress(k_cache, block_tables, seq_lens, bs, R, out):
    B, Nmax, Hkv, D = out.shape
    for item in prange(B * Nmax):
        b, j = item // Nmax, item % Nmax
        n = seq_lens[b] // R
        for g in range(Hkv):
            for d in range(D):
                out[b, j, g, d] = 0.0
        if j >= n:
            continue
        for k in range(j * R, j * R + R):
            slot = block_tables[b, k // bs] * bs + k % bs
            for g in range(Hkv):
                for d in range(D):
                    out[b, j, g, d] += k_cache[slot, g, d]
        inv = np.float32(1.0) / np.float32(R)
        for g in range(Hkv):
            for d in range(D):
                out[b, j, g, d] *= inv


def compress_keys(k_cache, block_tables, seq_lens, block_size: int, R: int, out):
    """out = kbar [B, N, Hkv, D]: means of the post-RoPE keys of every request's complete blocks (zeros past
    seq_len // R)."""
    _compress(k_cache, block_tables, seq_lens, int(block_size), int(R), out)
    return out


def tile_rows(query_start_loc, seq_lens, Q: int):
    """The tile rows of a call, in request order: request b's queries (positions L-q_len .. L-1) grouped by
    pos // Q. Returns int64 arrays (request, first local row, row count, first position), one entry per tile row."""
    base = int(query_start_loc[0])
    cols = ([], [], [], [])
    for b in range(seq_lens.shape[0]):
        n = int(query_start_loc[b + 1]) - int(query_start_loc[b])
        if n <= 0:
            continue
        P0, qs = int(seq_lens[b]) - n, int(query_start_loc[b]) - base
        for i in range(P0 // Q, (P0 + n - 1) // Q + 1):
            lo, hi = max(P0, i * Q), min(P0 + n, (i + 1) * Q)
            for col, v in zip(cols, (b, qs + lo - P0, hi - lo, lo)):
                col.append(v)
    return tuple(np.array(c, np.int64) for c in cols)


def query_means(q, query_start_loc, seq_lens, Q: int, r0: int, out):
    """out [rows, Hkv, D] fp32 for tile rows r0..r0+rows-1: the mean of the tile's queries over its rows and over
    each KV group's query heads (q [flat rows, Hq, D]; Q = 1: one row's q-bar, the issue's per-query score)."""
    rows, Hkv, D = out.shape
    if not rows:
        return out
    _, row, cnt, _ = tile_rows(query_start_loc, seq_lens, Q)
    row, cnt = row[r0:r0 + rows], cnt[r0:r0 + rows]
    base, G = int(query_start_loc[0]), q.shape[1] // Hkv
    lo, hi = int(row[0]), int(row[-1] + cnt[-1])  # a chunk's tile rows cover consecutive local rows
    per_row = q[base + lo:base + hi].reshape(hi - lo, Hkv, G, D).astype(np.float64).mean(axis=2)
    out[:] = np.add.reduceat(per_row, row - lo, axis=0) / cnt[:, None, None]
    return out


def gather_lens(query_start_loc, seq_lens, W: int, out):
    """out [B] = the window tokens each request needs (reference A.12): q_len + min(prefix, W - 1)."""
    qlen = np.diff(query_start_loc).astype(np.int64)
    out[:] = qlen + np.minimum(seq_lens - qlen, W - 1)
    return out


def indexer_scores(qbar, kbar, query_start_loc, seq_lens, R: int, Q: int, r0: int, out):
    """out [rows, Nmax] fp32 for tile rows r0..r0+rows-1: sum over KV groups of ReLU(qbar . kbar) (qbar from
    query_means); -inf for the blocks the tile's first row may not see ((p_first+1)//R and beyond)."""
    rows, Nmax = out.shape
    req, _, _, p0 = tile_rows(query_start_loc, seq_lens, Q)
    req, p0 = req[r0:r0 + rows], p0[r0:r0 + rows]
    for b in np.unique(req):
        sel = np.nonzero(req == b)[0]
        # [g, t, D] x [g, D, j] -> [g, t, j], ReLU, sum over g.
        s = np.matmul(qbar[sel].transpose(1, 0, 2), kbar[b].transpose(1, 2, 0))
        out[sel] = np.maximum(s, 0).sum(axis=0, dtype=np.float32)
    out[np.arange(Nmax)[None, :] >= ((p0 + 1) // R)[:, None]] = -np.inf
    return out


@njit(cache=True, nogil=True)
def _descending_order(x):
    """kernels/prefill_attention.py descending_order (stable, NaN last), copied rather than imported: a cached
    kernel calls no np.sort / np.argsort (see there), and no jitted function of another file (numba's cache does
    not notice when a callee in another file changes)."""
    n = x.shape[0]
    a = np.arange(n)
    b = np.empty(n, np.int64)
    w = 1
    while w < n:
        for lo in range(0, n, 2 * w):
            mid, hi = min(lo + w, n), min(lo + 2 * w, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if i < mid and (j >= hi or not (x[a[j]] > x[a[i]] or (x[a[i]] != x[a[i]] and x[a[j]] == x[a[j]]))):
                    b[k] = a[i]
                    i += 1
                else:
                    b[k] = a[j]
                    j += 1
        a, b = b, a
        w *= 2
    return a


@njit(cache=True, nogil=True, parallel=True)
def _topk(scores, row, cnt, p0, r0, R, K, out):
    for i in prange(scores.shape[0]):
        tr = r0 + i
        sel = np.full(K, -1, np.int32)
        nt = (p0[tr] + 1) // R  # blocks complete for the tile's first row: the tile chooses among these
        if (p0[tr] + cnt[tr]) // R > K:  # some row of the tile is long: it needs the tile's selection
            if nt <= K:
                sel[:nt] = np.arange(nt)
            else:
                # Stable descending order: equal scores keep ascending block order, so the lower block wins a tie.
                order = _descending_order(scores[i, :nt])
                keep = np.zeros(nt, np.bool_)
                for r in range(K):
                    keep[order[r]] = True
                c = 0
                for j in range(nt):  # the K kept blocks in ascending order
                    if keep[j]:
                        sel[c] = j
                        c += 1
        for r in range(cnt[tr]):
            t, n = row[tr] + r, (p0[tr] + r + 1) // R
            if n <= K:  # short row: every complete block, in order
                for j in range(K):
                    out[t, j] = j if j < n else -1
            else:
                out[t, :] = sel


def topk_blocks(scores, query_start_loc, seq_lens, R: int, K: int, Q: int = 1, r0: int = 0, out=None):
    """Query rows of topk int32 [T, K] from the scores of tile rows r0..r0+rows-1 (scores [rows, Nmax]). A row
    with n = (pos+1)//R <= K takes all blocks 0..n-1 without any score; any other row its tile's selection: the K
    best of the tile's candidates in ascending block order (ties: the lower block wins), or all of them if there
    are <= K; -1 pads. scores None: all tile rows, and every query row must have n <= K."""
    _, row, cnt, p0 = tile_rows(query_start_loc, seq_lens, Q)
    out = np.empty((int(cnt.sum()), K), np.int32) if out is None else out
    if scores is None:
        if len(cnt) and ((p0 + cnt) // R).max() > K:  # (a tile row's last position is p0 + cnt - 1)
            raise ValueError("topk_blocks: scores are needed when a row has more than K complete blocks")
        scores = np.zeros((len(row) - r0, 1), np.float32)
    _topk(scores, row, cnt, p0, int(r0), int(R), int(K), out)
    return out


@njit(cache=True, nogil=True, parallel=True, fastmath=_FM)
def _sparse_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, combined, lens, M, N, W, R, bs, scale,
                      out):
    B = seq_lens.shape[0]
    Hq, D = q.shape[1], q.shape[2]
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    base = qsl[0]
    T = qsl[B] - base
    for t in prange(T):
        b = 0
        while qsl[b + 1] - base <= t:
            b += 1
        qs, qlen, L = qsl[b] - base, qsl[b + 1] - qsl[b], seq_lens[b]
        pos = L - qlen + (t - qs)
        prefix = L - qlen
        gstart = prefix - min(prefix, W - 1)
        wstart = pos - min(pos + 1, W) + 1  # first window token: block tokens from here on are the window's
        # Key positions of this row, each once: selected blocks' tokens before the window, then the window.
        keys = np.empty(lens[t] * R, np.int64)
        nkeys = 0
        for j in range(lens[t]):
            r = combined[t, j]
            if r < 0:
                continue
            local = r - np.int64(b) * M
            if local < N:
                for k in range(local * R, min(local * R + R, wstart)):
                    keys[nkeys] = k
                    nkeys += 1
            else:
                keys[nkeys] = gstart + local - N
                nkeys += 1
        s = np.empty(nkeys, np.float32)
        row = base + t
        for g in range(Hkv):
            for hh in range(G):
                h = g * G + hh
                mx = -np.inf
                for i in range(nkeys):
                    k = keys[i]
                    slot = block_tables[b, k // bs] * bs + k % bs
                    dot = np.float32(0.0)
                    for d in range(D):
                        dot += q[row, h, d] * k_cache[slot, g, d]
                    s[i] = dot * scale
                    mx = max(mx, s[i])
                acc = np.zeros(D, np.float32)
                tot = np.float32(0.0)
                for i in range(nkeys):
                    p = np.exp(s[i] - mx)
                    tot += p
                    k = keys[i]
                    slot = block_tables[b, k // bs] * bs + k % bs
                    for d in range(D):
                        acc[d] += p * v_cache[slot, g, d]
                inv = np.float32(1.0) / tot if tot > 0 else np.float32(0.0)
                for d in range(D):
                    out[row, h, d] = acc[d] * inv


def sparse_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, M: int, N: int,
                     W: int, R: int, block_size: int, scale: float, out):
    """out[qsl[0]:qsl[B]] = attention of those q rows over their combined key sets (workspace row ids: the module
    doc): softmax over the union of the selected blocks' tokens before the window and the window's tokens, each once."""
    B = seq_lens.shape[0]
    T = int(query_start_loc[B] - query_start_loc[0]) if B else 0
    if combined.shape[0] < T or lens.shape[0] < T or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"sparse_attention: combined {combined.shape}, lens {lens.shape} for {T} rows, "
                         f"q {q.shape}, k_cache {k_cache.shape}")
    if T:
        _sparse_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, int(M),
                          int(N), int(W), int(R), int(block_size), np.float32(scale), out)
