"""Sparse prefill attention by query tiles: CPU twin of sparse_attention_tc.cu (NumPy, for tests).

The result is kernels/sparse_prefill.py's sparse_attention (each row: its selected blocks' tokens before its window
start ws = pos - min(pos+1, W) + 1, plus the window [ws, pos], each token once); the route is the GPU kernel's:

    combined, lens (kernels/combine.py)
      tile_union       -> ublk  int32 [B*tiles, cap]   per tile of TQ = 64 consecutive queries of a request, the
                          umask uint64 [B*tiles, cap]  ascending blocks some row selected that have a token before
                          ucount int32 [B*tiles]       that row's window, and bit r = row r selected it; count 0
                                                       for a covered tile ((pos_last+1)//R <= K: every block)
      tiled_attention  -> out                          per tile: the union's keys (row r sees key k iff bit r and
                                                       k < lo(r)) then the window span [lo(0), pos_last] (iff
                                                       lo(r) <= k <= pos(r)); lo = ws, or 0 in a covered tile

Tile ti = b * tiles + i holds request b's local queries 64i..64i+63 (tiles = ceil(max query count / 64)); cap is
the list pitch, at least the most distinct blocks a tile can hold (min(N, 64 K)). Tiles past a request's queries
are not written. A covered tile assumes what combine produces from top-k (every block 0..n-1 of each row).
"""
import numpy as np

TQ = 64           # queries per tile (the GPU kernel's 64-row CTA)
UNION_CAP = 8192  # blocks per shared-memory pass of the GPU union kernel (64 KiB of masks)


def n_tiles(max_query_len: int) -> int:
    return -(-int(max_query_len) // TQ)


def union_cap(N: int, K: int) -> int:
    return max(1, min(int(N), TQ * int(K)))


def tile_union(query_start_loc, seq_lens, combined, lens, M: int, N: int, W: int, R: int, K: int, Q: int, ublk,
               umask, ucount):
    """Every row's entries, one row at a time. Q (the query tile sparse_topk selected with) only matters to the GPU
    kernel, which reads one row for the long rows of a query tile, whose top-k entries are the same: for combined
    rows made from sparse_topk's output with that Q the two agree bit for bit (tests/test_gpu_sparse.py)."""
    B = seq_lens.shape[0]
    tiles = ublk.shape[0] // max(B, 1)
    base = int(query_start_loc[0])
    Kc = combined.shape[1]
    for b in range(B):
        qs, n = int(query_start_loc[b]) - base, int(query_start_loc[b + 1] - query_start_loc[b])
        start = int(seq_lens[b]) - n
        for i in range(tiles):
            q0, ti = i * TQ, b * tiles + i
            if q0 >= n:
                continue
            rows = min(TQ, n - q0)
            pos_last = start + q0 + rows - 1
            if (pos_last + 1) // R <= K:
                ucount[ti] = 0
                continue
            nmax = min(N, (pos_last + 1) // R)
            masks = np.zeros(nmax, np.uint64)
            for r in range(rows):
                t, pos = qs + q0 + r, start + q0 + r
                ws = pos - min(pos + 1, W) + 1
                v = combined[t, :min(int(lens[t]), Kc)].astype(np.int64)
                j = v - b * M
                j = np.unique(j[(v >= 0) & (j >= 0) & (j < nmax) & (j * R < ws)])
                masks[j] |= np.uint64(1 << r)
            nz = np.nonzero(masks)[0]
            ublk[ti, :len(nz)] = nz
            umask[ti, :len(nz)] = masks[nz]
            ucount[ti] = len(nz)
    return ublk, umask, ucount


def tiled_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask, ucount, W: int,
                    R: int, K: int, block_size: int, scale: float, out):
    """out rows qsl[0]..qsl[B]-1 from the tile lists (float64 softmax per row over its allowed keys)."""
    B = seq_lens.shape[0]
    tiles = ublk.shape[0] // max(B, 1)
    Hq, D = q.shape[1:]
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    for b in range(B):
        qs, n = int(query_start_loc[b]), int(query_start_loc[b + 1] - query_start_loc[b])
        L = int(seq_lens[b])
        start = L - n
        for i in range(tiles):
            q0, ti = i * TQ, b * tiles + i
            if q0 >= n:
                continue
            rows = min(TQ, n - q0)
            pos = start + q0 + np.arange(rows)
            pos_last = int(pos[-1])
            covered = (pos_last + 1) // R <= K
            lo = np.zeros(rows, np.int64) if covered else pos - np.minimum(pos + 1, W) + 1
            cnt = 0 if covered else int(ucount[ti])
            ukeys = (ublk[ti, :cnt].astype(np.int64)[:, None] * R + np.arange(R)).ravel()
            umasks = np.repeat(umask[ti, :cnt], R)
            bit = ((umasks[None, :] >> np.arange(rows, dtype=np.uint64)[:, None]) & np.uint64(1)).astype(bool)
            ok_u = bit & (ukeys[None, :] < lo[:, None])
            wkeys = np.arange(int(lo[0]), pos_last + 1)
            ok_w = (wkeys[None, :] >= lo[:, None]) & (wkeys[None, :] <= pos[:, None])
            keys = np.concatenate([ukeys, wkeys])
            ok = np.concatenate([ok_u, ok_w], axis=1) & (keys < L)[None, :]
            keys = np.where(keys < L, keys, 0)
            slots = block_tables[b, keys // block_size].astype(np.int64) * block_size + keys % block_size
            for g in range(Hkv):
                kg = k_cache[slots, g].astype(np.float64)  # [nk, D]
                vg = v_cache[slots, g].astype(np.float64)
                qg = q[qs + q0:qs + q0 + rows, g * G:(g + 1) * G].astype(np.float64)  # [rows, G, D]
                s = np.einsum("rgd,kd->rgk", qg, kg) * scale
                s = np.where(ok[:, None, :], s, -np.inf)
                s -= s.max(axis=2, keepdims=True)
                p = np.exp(s)
                o = np.einsum("rgk,kd->rgd", p, vg) / p.sum(axis=2, keepdims=True)
                out[qs + q0:qs + q0 + rows, g * G:(g + 1) * G] = o
    return out
