"""The tiled route of sparse attention (kernels/sparse_attention_tc.py, the twin of the tensor-core kernel) against
the per-query twin (kernels/sparse_prefill.py) and a set-based reference of the tile unions.

Cases cover several requests, cached prefixes (chunked prefill: a chunk's queries sit at the end of the request),
a query_start_loc slice that does not start at 0, requests longer than one 64-query tile, block sizes that do not
divide 64, covered tiles (dense causal) next to approximate ones, and caches that are NaN outside every sequence.
"""
import numpy as np
import pytest
from tests.kernels.test_sparse_kernels import make_attention_case, pipeline
from tests.tolerance import assert_within, attention_bound_for

from kernels import sparse_attention_tc as tc
from kernels import sparse_prefill as sp
from kernels.combine import combine_topk_swa_indices as combine_twin
from toolkit.model.sparse import query_tile

I32 = np.int32


def union_buffers(B: int, tiles: int, cap: int) -> tuple:
    """Tile-union lists (ublk, umask, ucount) for B requests of `tiles` tiles of `cap` blocks, as the engine's."""
    return np.full((B * tiles, cap), -1, I32), np.zeros((B * tiles, cap), np.uint64), np.zeros(B * tiles, I32)


def ref_union(qsl, seq_lens, topk, W, R, K, tiles):
    """{tile: {block: set of rows}} from the top-k lists directly (no combine, no bit tricks)."""
    out = {}
    base = qsl[0]
    for b in range(len(seq_lens)):
        n = qsl[b + 1] - qsl[b]
        start = seq_lens[b] - n
        for i in range(tiles):
            rows = range(i * 64, min(n, i * 64 + 64))
            if not rows or (start + rows[-1] + 1) // R <= K:
                continue
            u = {}
            for r in rows:
                pos = start + r
                ws = pos - min(pos + 1, W) + 1
                for j in topk[qsl[b] - base + r, :min((pos + 1) // R, K)]:
                    if j >= 0 and j * R < ws:
                        u.setdefault(int(j), set()).add(r - i * 64)
            out[b * tiles + i] = u
    return out


CASES = [  # lens, qlens, K, W, R
    ([700, 300, 1500], [700, 120, 900], 64, 128, 4),
    ([700, 300, 1500], [700, 120, 900], 512, 128, 4),  # every row covered: dense causal tiles
    ([260, 199, 90], [200, 199, 7], 5, 12, 3),         # R does not divide 64
    ([333, 1, 150], [90, 1, 150], 3, 5, 5),
    ([400, 129], [130, 129], 9, 1, 1),
]


@pytest.mark.parametrize("lens,qlens,K,W,R", CASES)
def test_tiled_equals_per_query_twin(lens, qlens, K, W, R):
    rng = np.random.default_rng(sum(lens) + K)
    Hq, Hkv, D, bs = 6, 2, 16, 16
    kc, vc, tables, seq_lens, qsl, q = make_attention_case(rng, lens, qlens, Hq, Hkv, D, bs, base=5)
    scale = D ** -0.5
    combined, clens, M, N, topk = pipeline(q, kc, tables, seq_lens, qsl, K, W, R, bs)
    tiles, cap = tc.n_tiles(max(qlens)), tc.union_cap(N, K)
    ublk, umask, ucount = tc.tile_union(qsl, seq_lens, combined, clens, M, N, W, R, K, 1,
                                        *union_buffers(len(lens), tiles, cap))
    want_u = ref_union(qsl, seq_lens, topk, W, R, K, tiles)
    for ti, u in want_u.items():
        n = int(ucount[ti])
        assert ublk[ti, :n].tolist() == sorted(u)
        for j, m in zip(ublk[ti, :n], umask[ti, :n]):
            assert {r for r in range(64) if (int(m) >> r) & 1} == u[int(j)]
    want = np.full_like(q, 7.0)
    sp.sparse_attention(q, kc, vc, tables, qsl, seq_lens, combined, clens, M, N, W, R, bs, scale, want)
    got = np.full_like(q, 7.0)
    tc.tiled_attention(q, kc, vc, tables, qsl, seq_lens, ublk, umask, ucount, W, R, K, bs, scale, got)
    rows = slice(qsl[0], qsl[-1])
    assert np.isfinite(got[rows]).all()
    # the per-query twin: float32 attention (one bound); the tiled twin: a float64 softmax rounded to float32
    # (u |out|, far inside a second bound)
    assert_within(got[rows], want[rows], attention_bound_for(q, kc, vc, seq_lens, scale, orders=2))
    assert (got[:qsl[0]] == 7.0).all() and (got[qsl[-1]:] == 7.0).all()


@pytest.mark.parametrize("lens,qlens,K,W,R", CASES)
@pytest.mark.parametrize("Q", [None, 1, 2])
def test_long_rows_of_a_query_tile_share_their_topk_entries(lens, qlens, K, W, R, Q):
    """What sparse_tile_union's GPU kernel relies on: the long rows ((pos+1)//R > K) of one query tile have the
    same first K combined entries, so the kernel walks one of them for all (kernels/sparse_attention_tc.cu)."""
    rng = np.random.default_rng(sum(lens) + K + (Q or 0))
    kc, vc, tables, seq_lens, qsl, q = make_attention_case(rng, lens, qlens, 6, 2, 16, 16, base=5)
    combined, clens, M, N, topk = pipeline(q, kc, tables, seq_lens, qsl, K, W, R, 16, Q)
    Q = query_tile(64, W, R) if Q is None else Q  # as pipeline() ran it
    for b in range(len(seq_lens)):
        n = qsl[b + 1] - qsl[b]
        start = seq_lens[b] - n
        groups = {}
        for r in range(n):
            pos = start + r
            if (pos + 1) // R > K:
                groups.setdefault(pos // Q, []).append(qsl[b] - qsl[0] + r)
        for rows in groups.values():
            for t in rows[1:]:
                np.testing.assert_array_equal(combined[t, :K], combined[rows[0], :K])


def test_union_is_about_k_blocks_when_neighbours_agree():
    """Rows that select the same blocks give a union of K blocks with full masks, whatever N is: the point of
    tiling (on random data neighbours disagree and the union approaches every block: see the README)."""
    T, K, R, W = 256, 8, 4, 8
    N = T // R
    pos = np.arange(T)
    n = (pos + 1) // R
    topk = np.where(n[:, None] <= K, np.where(np.arange(K)[None, :] < n[:, None], np.arange(K), -1),
                    np.arange(0, 2 * K, 2)[None, :]).astype(I32)  # long rows: blocks 0, 2, .., 2K-2
    qsl, seq_lens = np.array([0, T], I32), np.array([T], I32)
    gather = sp.gather_lens(qsl, seq_lens, W, np.empty(len(seq_lens), I32))
    M = N + int(gather.max())
    combined, clens = combine_twin(topk, qsl, seq_lens, gather, W, R, K, M, N)
    ublk, umask, ucount = tc.tile_union(qsl, seq_lens, combined, clens, M, N, W, R, K, 1,
                                        *union_buffers(1, 4, tc.union_cap(N, K)))
    for ti in (1, 2, 3):
        assert ucount[ti] == K and ublk[ti, :K].tolist() == list(range(0, 2 * K, 2))
        assert (umask[ti, :K] == np.uint64(2**64 - 1)).all()
