"""combine_topk_swa_indices, CPU twin of combine.cu: DeepSeek-V4's merge of top-k blocks and the sliding window.

    topk_indices [T, Kw] (local block numbers, -1 padded)   query_start_loc [B+1] (a slice: rebased by qsl[0])
    seq_lens [B], gather_lens [B]                            W, R, K, M, N (ints)
        -> combined [T, Kc] int32 (workspace row ids, -1 tail to Kc = ceil((K + W) / 128) * 128), lens [T] int32

Row t of request b (rows [qsl[b] - qsl[0], qsl[b+1] - qsl[0])) sits at position pos = seq_len - qlen + (t - qs),
the queries being the request's trailing tokens. Its row is
    [ b*M + v  for the first nk = min((pos+1)//R, K) top-k entries v (-1 unless 0 <= v < N: bounds-checked),
      b*M + N + (pos - nw + 1 + j - gstart) for j < nw = min(pos+1, W)  (the window, ascending),
      -1 ... ]                                                              and lens[t] = nk + nw,
with gstart = seq_len - gather_len (the first gathered window token). The workspace these ids point into holds,
per request b, the compressed entries at rows [b*M, b*M + N) and the gathered window tokens at [b*M + N, ...)
(reference A.4); toolkit/sparse.py reads the same ids straight from the paged cache instead.
The kernel writes the whole row, tail included, so a reused output buffer never leaks stale ids.
"""
import numpy as np
from numba import njit, prange

ALIGN = 128  # FlashMLA's B_TOPK: combined rows are padded to a multiple of this


@njit(cache=True, nogil=True, parallel=True)
def _combine(topk_indices, qsl, seq_lens, gather_lens, W, R, K, M, N, out, lens):
    B = seq_lens.shape[0]
    base = qsl[0]
    Kw, Kc = topk_indices.shape[1], out.shape[1]
    for b in range(B):
        qs, qe = qsl[b] - base, qsl[b + 1] - base
        qlen, L = qe - qs, seq_lens[b]
        gstart = L - gather_lens[b]
        off = np.int64(b) * M
        for t in prange(qs, qe):
            pos = L - qlen + (t - qs)
            nk = min((pos + 1) // R, K)
            nw = min(pos + 1, W)
            for j in range(nk):
                v = topk_indices[t, j] if j < Kw else -1
                out[t, j] = off + v if 0 <= v < N else -1
            for j in range(nw):
                out[t, nk + j] = off + N + (pos - nw + 1 + j - gstart)
            for j in range(nk + nw, Kc):
                out[t, j] = -1
            lens[t] = nk + nw


def combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size: int,
                             compress_ratio: int, topk: int, M: int, N: int, out=None, lens=None):
    """NumPy arrays in, (combined int32[T, Kc], lens int32[T]) out; `out`/`lens` may be reused buffers."""
    B = seq_lens.shape[0]
    T = int(query_start_loc[B] - query_start_loc[0]) if B else 0
    if topk_indices.ndim != 2 or topk_indices.shape[0] < T or query_start_loc.shape != (B + 1,) \
            or gather_lens.shape != (B,):
        raise ValueError(f"combine_topk_swa_indices: topk_indices {topk_indices.shape}, query_start_loc "
                         f"{query_start_loc.shape}, seq_lens {seq_lens.shape}, gather_lens {gather_lens.shape}")
    if compress_ratio < 1 or window_size < 1 or topk < 0:
        raise ValueError(f"combine_topk_swa_indices: W={window_size}, R={compress_ratio}, K={topk}")
    Kc = -(-(topk + window_size) // ALIGN) * ALIGN
    out = np.empty((T, Kc), np.int32) if out is None else out[:T]
    lens = np.empty(T, np.int32) if lens is None else lens[:T]
    if out.shape != (T, Kc):
        raise ValueError(f"combine_topk_swa_indices: out {out.shape} != ({T}, {Kc})")
    i32 = np.int32
    _combine(np.asarray(topk_indices, i32), np.asarray(query_start_loc, i32), np.asarray(seq_lens, i32),
             np.asarray(gather_lens, i32), int(window_size), int(compress_ratio), int(topk), int(M), int(N),
             out, lens)
    return out, lens
