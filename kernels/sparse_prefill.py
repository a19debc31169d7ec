"""Sparse prefill: indexer, top-k over key blocks, sparse attention. CPU twin of sparse_prefill.cu.

For the B prefill requests of a step (rows [qsl[b], qsl[b+1]) of the flat q, local row t = row - qsl[0],
positions ending at seq_lens[b] - 1) and block size R:

    compress_keys   k_cache (paged) -> kbar [B, Nmax, Hkv, D] fp32   kbar[b, j, g] = mean of the post-RoPE keys
                                                                     j*R .. j*R+R-1 of head g (complete blocks)
    query_means     q [rows, Hq, D] -> qbar [T, Hkv, D] fp32         mean of the queries of group g's heads
    indexer_scores  qbar, kbar -> scores [T, Nmax] fp32              sum_g ReLU(qbar_g[t] . kbar_g[j]) for
                                                                     j < (pos+1)//R, -inf beyond (causal)
    topk_blocks     scores -> topk [T, K] int32                      the K best blocks in ascending block order
                                                                     (ties: the lower block wins), -1 padded;
                                                                     all blocks 0..n-1 when n = (pos+1)//R <= K
    (kernels/combine.py merges topk with the window into workspace row ids)
    sparse_attention  combined ids -> out [rows, Hq, D]              softmax over the union of the selected
                                                                     blocks' tokens before the window and the
                                                                     window's tokens, each token once

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


def compress_keys(k_cache, block_tables, seq_lens, block_size: int, R: int, n_max: int, out=None):
    """kbar [B, n_max, Hkv, D]: block means of every request's complete blocks (zeros past seq_len // R)."""
    B = seq_lens.shape[0]
    Hkv, D = k_cache.shape[1:]
    out = np.empty((B, n_max, Hkv, D), np.float32) if out is None else out
    _compress(k_cache, block_tables, seq_lens, int(block_size), int(R), out)
    return out


def query_means(q, row0: int, T: int, Hkv: int):
    """qbar [T, Hkv, D]: rows row0..row0+T-1 of q [rows, Hq, D], averaged over each group's query heads."""
    Hq, D = q.shape[1:]
    return q[row0:row0 + T].reshape(T, Hkv, Hq // Hkv, D).mean(axis=2, dtype=np.float32)


def row_positions(query_start_loc, seq_lens):
    """(request, position) of every local row of the call."""
    base = int(query_start_loc[0])
    req, pos = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for b in range(seq_lens.shape[0]):
        n = int(query_start_loc[b + 1]) - int(query_start_loc[b])
        req.append(np.full(n, b, np.int64))
        pos.append(np.arange(int(seq_lens[b]) - n, int(seq_lens[b]), dtype=np.int64))
    return np.concatenate(req), np.concatenate(pos)


def gather_lens(query_start_loc, seq_lens, W: int, out=None):
    """Window tokens each request needs (reference A.12): q_len + min(prefix, W - 1)."""
    qlen = np.diff(query_start_loc).astype(np.int64)
    g = qlen + np.minimum(seq_lens - qlen, W - 1)
    out = np.empty(seq_lens.shape[0], np.int32) if out is None else out
    out[:] = g
    return out


def indexer_scores(q, kbar, query_start_loc, seq_lens, R: int, r0: int, out):
    """out [rows, Nmax] fp32 for local rows r0..r0+rows-1: sum over kv groups of ReLU(qbar . kbar), where qbar
    is the mean of the group's query heads; -inf for blocks the row may not see ((pos+1)//R and beyond)."""
    rows, Nmax = out.shape
    Hkv = kbar.shape[2]
    req, pos = row_positions(query_start_loc, seq_lens)
    req, pos = req[r0:r0 + rows], pos[r0:r0 + rows]
    qbar = query_means(q, int(query_start_loc[0]) + r0, rows, Hkv)
    for b in np.unique(req):
        sel = np.nonzero(req == b)[0]
        # [g, t, D] x [g, D, j] -> [g, t, j], ReLU, sum over g.
        s = np.matmul(qbar[sel].transpose(1, 0, 2), kbar[b].transpose(1, 2, 0))
        out[sel] = np.maximum(s, 0).sum(axis=0, dtype=np.float32)
    out[np.arange(Nmax)[None, :] >= ((pos + 1) // R)[:, None]] = -np.inf
    return out


@njit(cache=True, nogil=True, parallel=True)
def _topk(scores, pos, r0, R, K, out):
    for i in prange(pos.shape[0]):
        t = r0 + i
        n = (pos[i] + 1) // R
        for j in range(K):
            out[t, j] = -1
        if n <= K:  # short row: every complete block, no scores read
            for j in range(n):
                out[t, j] = j
            continue
        # Stable sort of -score: equal scores keep ascending block order, so the lower block wins a tie at K.
        order = np.argsort(-scores[i, :n], kind="mergesort")
        keep = np.sort(order[:K])
        for j in range(K):
            out[t, j] = keep[j]


def topk_blocks(scores, query_start_loc, seq_lens, R: int, K: int, r0: int = 0, out=None):
    """Rows r0..r0+rows-1 of topk int32 [T, K] from scores [rows, Nmax] (rows = all T when scores is None: then
    every row must be short, (pos+1)//R <= K, and takes 0..n-1 without reading any score)."""
    _, pos = row_positions(query_start_loc, seq_lens)
    out = np.empty((len(pos), K), np.int32) if out is None else out
    if scores is None:
        if len(pos) and ((pos + 1) // R).max() > K:
            raise ValueError("topk_blocks: scores are needed when a row has more than K complete blocks")
        scores = np.zeros((len(pos) - r0, 1), np.float32)
    pos = pos[r0:r0 + scores.shape[0]]
    _topk(scores, pos, int(r0), int(R), int(K), out)
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
    """out[qsl[0]:qsl[B]] = attention of those q rows over their combined key sets (see the module doc)."""
    B = seq_lens.shape[0]
    T = int(query_start_loc[B] - query_start_loc[0]) if B else 0
    if combined.shape[0] < T or lens.shape[0] < T or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"sparse_attention: combined {combined.shape}, lens {lens.shape} for {T} rows, "
                         f"q {q.shape}, k_cache {k_cache.shape}")
    if T:
        _sparse_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, int(M),
                          int(N), int(W), int(R), int(block_size), np.float32(scale), out)
