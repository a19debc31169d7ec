"""Sparse prefill CPU twins (kernels/combine.py, kernels/sparse_prefill.py) against plain NumPy references.

The references share no code with the twins: the combine is a Python loop over rows written from the reference
document's A.5 pseudo-code, top-k is an argsort, the indexer an explicit double loop over groups, and sparse
attention builds each query's key set as a Python set and takes a float64 softmax over it. Caches are NaN
everywhere a kernel must not read (tests/paged_cache.py), so a wrong slot shows.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.paged_cache import paged_cache
from tests.tolerance import assert_within, attention_bound_for, gamma

from kernels import sparse_prefill as sp
from kernels.combine import combine_topk_swa_indices as combine_twin
from kernels.prefill_attention import prefill_attention
from toolkit.errors import ToolkitError
from toolkit.engine.options import EngineOptions
from toolkit.model.sparse import approximates, kept_keys, query_tile, step_path

I32 = np.int32


# ---- combine ----

def ref_combine(topk, qsl, seq_lens, gather_lens, W, R, K, M, N):
    base = qsl[0]
    T = qsl[-1] - base
    Kc = -(-(K + W) // 128) * 128
    out = np.full((T, Kc), -1, np.int64)
    lens = np.zeros(T, np.int64)
    for b in range(len(seq_lens)):
        qs, qe = qsl[b] - base, qsl[b + 1] - base
        gstart = seq_lens[b] - gather_lens[b]
        for t in range(qs, qe):
            pos = seq_lens[b] - (qe - qs) + (t - qs)
            nk, nw = min((pos + 1) // R, K), min(pos + 1, W)
            row = []
            for j in range(nk):
                v = topk[t, j] if j < topk.shape[1] else -1
                row.append(b * M + v if 0 <= v < N else -1)
            row += [b * M + N + (pos - nw + 1 + j - gstart) for j in range(nw)]
            out[t, :len(row)] = row
            lens[t] = nk + nw
    return out, lens


def test_combine_worked_vector():
    """Reference document A.7 (FlagGems parity test against vLLM)."""
    topk = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], I32)
    c, n = combine_twin(topk, np.array([0, 2, 3], I32), np.array([8, 10], I32), np.array([8, 10], I32), 4, 2, 4,
                        64, 16)
    assert c.shape == (3, 128) and c.dtype == I32 and isinstance(c, np.ndarray)
    assert c[0, :7].tolist() == [1, 2, 3, 19, 20, 21, 22]
    assert c[1, :8].tolist() == [5, 6, 7, 8, 20, 21, 22, 23]
    assert c[2, :8].tolist() == [73, 74, 75, 76, 86, 87, 88, 89]
    assert (c[0, 7:] == -1).all() and (c[1:, 8:] == -1).all()
    assert n.tolist() == [7, 8, 8]


def random_combine_case(rng, n_req, K, W, R, base=0, holes=True, one_token=False):
    qlens = [1 if one_token else int(rng.integers(1, 40)) for _ in range(n_req)]
    prefixes = [int(rng.integers(0, 300)) for _ in range(n_req)]
    seq_lens = np.array([q + p for q, p in zip(qlens, prefixes)], I32)
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(I32) + base
    gather = np.array([q + min(p, W - 1) for q, p in zip(qlens, prefixes)], I32)
    N = int((seq_lens // R).max())
    M = N + int(gather.max())
    T = sum(qlens)
    Kw = max(K, 1)
    topk = rng.integers(0, max(N, 1), (T, Kw)).astype(I32)
    if holes:  # -1 holes inside the valid prefix, and out-of-range ids
        topk[rng.random(topk.shape) < 0.1] = -1
        topk[rng.random(topk.shape) < 0.05] = N + 3
    return topk, qsl, seq_lens, gather, M, N


@pytest.mark.parametrize("case", ["holes", "window_only", "one_token", "offset_qsl", "many", "big_k"])
def test_combine_random_against_reference(case):
    rng = np.random.default_rng(hash(case) % 2**32)
    for _ in range(5):
        K, W, R = {"window_only": (0, 16, 1), "big_k": (512, 128, 4)}.get(case, (int(rng.integers(1, 20)), 8, 2))
        topk, qsl, seq_lens, gather, M, N = random_combine_case(
            rng, 1 if case == "holes" else int(rng.integers(2, 6)), K, W, R,
            base=int(rng.integers(1, 50)) if case == "offset_qsl" else 0, one_token=case == "one_token")
        want, want_lens = ref_combine(topk, qsl, seq_lens, gather, W, R, K, M, N)
        dirty = np.full((len(topk) + 3, -(-(K + W) // 128) * 128), 12345, I32)  # stale values: must be overwritten
        dirty_lens = np.full(len(topk) + 3, 777, I32)
        got, got_lens = combine_twin(topk, qsl, seq_lens, gather, W, R, K, M, N, dirty, dirty_lens)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_lens, want_lens)


def test_combine_tests_can_fail():
    """The reference tells the unchecked variant (b*M + v for a -1 hole) from the bounds-checked one."""
    rng = np.random.default_rng(1)
    topk, qsl, seq_lens, gather, M, N = random_combine_case(rng, 3, 8, 8, 2)
    want, _ = ref_combine(topk, qsl, seq_lens, gather, 8, 2, 8, M, N)
    unchecked = want.copy()
    unchecked[want == -1] = 5  # any value in the holes
    assert (unchecked != want).any()


# ---- indexer and top-k ----

def ref_topk(scores, qsl, seq_lens, R, K, Q):
    """Plain reference of the top-k rule from tile-row scores: a short row takes 0..n-1, a long row its tile's K
    best candidates (blocks before (p_first+1)//R, stable argsort: the lower block wins a tie), or all of them."""
    want, tr = [], -1
    for b in range(len(seq_lens)):
        qlen = int(qsl[b + 1] - qsl[b])
        for pos in range(int(seq_lens[b]) - qlen, int(seq_lens[b])):
            if pos == int(seq_lens[b]) - qlen or pos % Q == 0:
                tr, p_first = tr + 1, pos
            n, nt = (pos + 1) // R, (p_first + 1) // R
            if n <= K:
                want.append(list(range(n)) + [-1] * (K - n))
            elif nt <= K:
                want.append(list(range(nt)) + [-1] * (K - nt))
            else:
                want.append(sorted(np.argsort(-scores[tr, :nt], kind="stable")[:K].tolist()))
    return np.array(want, I32).reshape(-1, K)


@pytest.mark.parametrize("Q", [1, 3, 8])
def test_topk_against_argsort_with_ties(Q):
    rng = np.random.default_rng(2)
    R, K = 2, 5
    seq_lens = np.array([40, 9], I32)
    qsl = np.array([3, 23, 30], I32)  # offset start; request 0 feeds 20 of 40 tokens, request 1 feeds 7 of 9
    _, _, _, p0 = sp.tile_rows(qsl, seq_lens, Q)
    N = int((seq_lens // R).max())
    scores = np.round(rng.standard_normal((len(p0), N)), 0).astype(np.float32)  # many ties
    scores[np.arange(N)[None, :] >= ((p0 + 1) // R)[:, None]] = -np.inf
    got = np.full((int(qsl[-1] - qsl[0]), K), 99, I32)
    cut = len(p0) // 2
    for r0, r1 in ((0, cut), (cut, len(p0))):  # in two chunks of tile rows, as toolkit/sparse.py calls it
        sp.topk_blocks(scores[r0:r1], qsl, seq_lens, R, K, Q, r0, got)
    np.testing.assert_array_equal(got, ref_topk(scores, qsl, seq_lens, R, K, Q))
    if Q == 8:  # the rows of request 0's tile 32..39 (all long) share one selection
        assert len({tuple(r) for r in got[12:20]}) == 1
    # a tie at the K-th score: the lower block wins
    s = np.array([[1, 3, 2, 2, 2, 0]], np.float32)
    out = np.zeros((1, 3), I32)
    sp.topk_blocks(s, np.array([0, 1], I32), np.array([12], I32), 2, 3, 1, 0, out)
    assert out[0].tolist() == [1, 2, 3]


def test_topk_short_rows_need_no_scores():
    out = sp.topk_blocks(None, np.array([0, 3], I32), np.array([7], I32), 2, 4)
    assert out.tolist() == [[0, 1, -1, -1], [0, 1, 2, -1], [0, 1, 2, -1]]
    with pytest.raises(ValueError, match="scores are needed"):
        sp.topk_blocks(None, np.array([0, 3], I32), np.array([70], I32), 2, 4)


@pytest.mark.parametrize("Q", [1, 4, 64])
def test_indexer_against_reference(Q):
    rng = np.random.default_rng(3)
    Hq, Hkv, D, R, bs = 6, 2, 8, 4, 16
    lens = [50, 23]
    qlens = [20, 23]
    kc, vc, tables = paged_cache(rng, lens, Hkv, D, block_size=bs)
    seq_lens = np.array(lens, I32)
    qsl = np.array([2, 22, 45], I32)
    q = rng.standard_normal((50, Hq, D)).astype(np.float32)
    N = max(lens) // R
    kbar = sp.compress_keys(kc, tables, seq_lens, bs, R, np.empty((len(lens), N, Hkv, D), np.float32))
    req, row, cnt, p0 = sp.tile_rows(qsl, seq_lens, Q)
    # Q 4: positions 30-31, 32-35, .., 48-49 of request 0 and 0-3, .., 20-22 of request 1
    assert cnt.sum() == sum(qlens) and len(req) == {1: 43, 4: 12, 64: 2}[Q]
    qbar = sp.query_means(q, qsl, seq_lens, Q, 0, np.zeros((len(req), Hkv, D), np.float32))
    scores = np.zeros((len(req), N), np.float32)
    sp.indexer_scores(qbar, kbar, qsl, seq_lens, R, Q, 0, scores)
    for i in range(len(req)):
        b = int(req[i])
        keys = np.stack([kc[tables[b, k // bs] * bs + k % bs] for k in range(lens[b])]).astype(np.float64)
        rows = q[qsl[0] + row[i]:qsl[0] + row[i] + cnt[i]].astype(np.float64)
        assert all((p0[i] + r) // Q == p0[i] // Q for r in range(cnt[i]))  # one tile's rows
        qm = rows.reshape(cnt[i], Hkv, Hq // Hkv, D).mean((0, 2))
        for j in range(N):
            if j >= (p0[i] + 1) // R:
                assert scores[i, j] == -np.inf
                continue
            km = keys[j * R:(j + 1) * R].mean(0)
            want = sum(max(0.0, qm[g] @ km[g]) for g in range(Hkv))
            # q-bar rounded to float32 (u), k-bar an R-key float32 sum times float32 1/R (gamma_{R+1} of mean |k|),
            # the D-term dot products, ReLU (no gain), the Hkv-term group sum: gamma_{D+R+Hkv+2} of sum |qm| mean |k|
            tol = gamma(D + R + Hkv + 2) * np.sum(np.abs(qm) * np.abs(keys[j * R:(j + 1) * R]).mean(0))
            assert abs(scores[i, j] - want) <= tol


def test_tile_rows_share_blocks_and_stay_exact():
    """With Q > 1 a row past its tile's candidates still sees every key when its tile takes all of them (the
    W - R + 2 cap puts the rest in its window), and the tile's long rows share one selection."""
    rng = np.random.default_rng(11)
    Hq, Hkv, D, bs, R, W = 4, 2, 16, 16, 2, 12
    Q = query_tile(64, W, R)
    assert Q == 12
    lens = [96]
    kc, vc, tables, seq_lens, qsl, q = make_attention_case(rng, lens, lens, Hq, Hkv, D, bs)
    K = 30  # rows from position 60 on are long; the tile 60..71 has 30 candidates: all taken
    scale = D ** -0.5
    got, topk = run_sparse(q, kc, vc, tables, seq_lens, qsl, K, W, R, bs, scale, Q=Q)
    dense = np.zeros_like(q)
    prefill_attention(q, kc, vc, tables, qsl, seq_lens, bs, scale, dense)
    base = int(qsl[0])
    tol = attention_bound_for(q, kc, vc, seq_lens, scale)  # one float32 attention vs exact
    assert_within(got[base + 60:base + 72], dense[base + 60:base + 72], 2 * tol)  # two float32 implementations
    assert np.abs(got[base + 72:base + 96] - dense[base + 72:base + 96]).max() > 2 * tol  # later tiles choose
    assert len({tuple(r) for r in topk[72:84]}) == 1 and len({tuple(r) for r in topk[84:96]}) == 1
    want = ref_sparse_attention(q, kc, vc, tables, seq_lens, qsl, topk, W, R, bs, scale)
    assert_within(got[base:base + 96], want[base:base + 96], tol)  # against the float64 reference


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(0, 60)), min_size=1, max_size=3),
       st.integers(1, 12), st.integers(1, 6), st.integers(0, 20), st.integers(1, 70), st.integers(0, 2**31 - 1))
def test_query_tiles_keep_every_key_when_the_tile_takes_all(reqs, K, R, extra, Qopt, seed):
    """The exactness argument of the query tile, on the twin's top-k with random scores: a row whose tile takes
    every candidate (or that is short itself) sees every key 0..pos through its blocks and its window, for any
    K, W >= R, R and requested Q (capped by query_tile); the long rows of a tile share one selection."""
    W = R + extra
    Q = query_tile(Qopt, W, R)
    qlens = [q for q, _ in reqs]
    lens = [q + p for q, p in reqs]
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(I32)
    seq_lens = np.array(lens, I32)
    req, row, cnt, p0 = sp.tile_rows(qsl, seq_lens, Q)
    assert (np.bincount(row.repeat(cnt) + np.concatenate([np.arange(c) for c in cnt]), minlength=qsl[-1]) == 1).all()
    N = max(max(lens) // R, 1)
    scores = np.random.default_rng(seed).standard_normal((len(req), N)).astype(np.float32)
    topk = sp.topk_blocks(scores, qsl, seq_lens, R, K, Q, 0)
    pos = np.concatenate([np.arange(p, p + q) for q, p in reqs])  # each local row's position
    for i in range(len(req)):
        long_rows = [t for t in range(row[i], row[i] + cnt[i]) if (pos[t] + 1) // R > K]
        assert len({tuple(topk[t]) for t in long_rows}) <= 1
        if (p0[i] + 1) // R > K:
            continue  # the tile chooses: approximate rows
        for t in range(row[i], row[i] + cnt[i]):
            ws = pos[t] - min(pos[t] + 1, W) + 1
            keys = set(range(ws, pos[t] + 1))
            for blk in topk[t][topk[t] >= 0]:
                keys |= set(range(blk * R, blk * R + R))
            assert set(range(pos[t] + 1)) <= keys, (t, pos[t], Q)


# ---- sparse attention ----

def make_attention_case(rng, lens, qlens, Hq, Hkv, D, bs, base=3):
    kc, vc, tables = paged_cache(rng, lens, Hkv, D, block_size=bs)
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(I32) + base
    q = rng.standard_normal((int(qsl[-1]) + 2, Hq, D)).astype(np.float32)
    return kc, vc, tables, np.array(lens, I32), qsl, q


def pipeline(q, kc, tables, seq_lens, qsl, K, W, R, bs, Q=None):
    """Indexer, top-k and combine on the twins, as toolkit/sparse.py runs them: (combined, lens, M, N, topk).
    Q: the query tile (default: the engine's, query_tile(64, W, R))."""
    Q = query_tile(64, W, R) if Q is None else Q
    T = int(qsl[-1] - qsl[0])
    N = int((seq_lens // R).max())
    gather = sp.gather_lens(qsl, seq_lens, W, np.empty(len(seq_lens), I32))
    M = N + int(gather.max())
    topk = np.empty((T, K), I32)
    if N > K:
        kbar = sp.compress_keys(kc, tables, seq_lens, bs, R, np.empty((len(seq_lens), N, *kc.shape[1:]), np.float32))
        tiles = len(sp.tile_rows(qsl, seq_lens, Q)[0])
        qbar = sp.query_means(q, qsl, seq_lens, Q, 0, np.empty((tiles, kc.shape[1], kc.shape[2]), np.float32))
        scores = sp.indexer_scores(qbar, kbar, qsl, seq_lens, R, Q, 0, np.empty((tiles, N), np.float32))
        sp.topk_blocks(scores, qsl, seq_lens, R, K, Q, 0, topk)
    else:
        sp.topk_blocks(None, qsl, seq_lens, R, K, Q, 0, topk)
    combined, clens = combine_twin(topk, qsl, seq_lens, gather, W, R, K, M, N)
    return combined, clens, M, N, topk


def run_sparse(q, kc, vc, tables, seq_lens, qsl, K, W, R, bs, scale, Q=None):
    """The twin pipeline as toolkit/sparse.py runs it (one chunk of rows)."""
    combined, clens, M, N, topk = pipeline(q, kc, tables, seq_lens, qsl, K, W, R, bs, Q)
    out = np.full_like(q, 7.0)
    sp.sparse_attention(q, kc, vc, tables, qsl, seq_lens, combined, clens, M, N, W, R, bs, scale, out)
    return out, topk


def ref_sparse_attention(q, kc, vc, tables, seq_lens, qsl, topk, W, R, bs, scale):
    """Per query: the key set {selected blocks' tokens before the window} | {window}, float64 softmax."""
    Hq, Hkv = q.shape[1], kc.shape[1]
    out = np.zeros(q.shape, np.float64)
    base, t = qsl[0], 0
    for b in range(len(seq_lens)):
        qlen = qsl[b + 1] - qsl[b]
        for i in range(qlen):
            pos = seq_lens[b] - qlen + i
            wstart = pos - min(pos + 1, W) + 1
            keys = set(range(wstart, pos + 1))
            for blk in topk[t]:
                if blk >= 0:
                    keys |= {k for k in range(blk * R, blk * R + R) if k < wstart}
            keys = sorted(keys)
            slots = [tables[b, k // bs] * bs + k % bs for k in keys]
            for h in range(Hq):
                g = h // (Hq // Hkv)
                s = kc[slots, g].astype(np.float64) @ q[base + t, h] * scale
                p = np.exp(s - s.max())
                out[base + t, h] = p @ vc[slots, g] / p.sum()
            t += 1
    return out


@pytest.mark.parametrize("Hq,Hkv,D,bs", [(4, 2, 16, 16), (7, 1, 8, 1), (14, 2, 64, 32)])
def test_sparse_equals_dense_when_covered(Hq, Hkv, D, bs):
    rng = np.random.default_rng(Hq * 100 + bs)
    lens, qlens = [70, 33, 1, 90], [70, 10, 1, 37]
    kc, vc, tables, seq_lens, qsl, q = make_attention_case(rng, lens, qlens, Hq, Hkv, D, bs)
    scale = D ** -0.5
    R, W = 4, 6
    K = max(lens) // R  # every complete block of every row
    got, _ = run_sparse(q, kc, vc, tables, seq_lens, qsl, K, W, R, bs, scale)
    dense = np.zeros_like(q)
    prefill_attention(q, kc, vc, tables, qsl, seq_lens, bs, scale, dense)
    rows = slice(qsl[0], qsl[-1])
    # two float32 attentions (sparse twin, dense twin) over the same keys
    assert_within(got[rows], dense[rows], attention_bound_for(q, kc, vc, seq_lens, scale, orders=2))
    assert (got[:qsl[0]] == 7.0).all() and (got[qsl[-1]:] == 7.0).all()  # rows outside untouched


@pytest.mark.parametrize("K,W,R", [(2, 4, 2), (3, 8, 4), (1, 1, 1), (5, 3, 3)])
def test_sparse_against_reference_when_not_covered(K, W, R):
    rng = np.random.default_rng(K * 10 + W)
    Hq, Hkv, D, bs = 6, 2, 16, 16
    lens, qlens = [60, 41, 5], [25, 41, 2]
    kc, vc, tables, seq_lens, qsl, q = make_attention_case(rng, lens, qlens, Hq, Hkv, D, bs)
    scale = D ** -0.5
    got, topk = run_sparse(q, kc, vc, tables, seq_lens, qsl, K, W, R, bs, scale)
    want = ref_sparse_attention(q, kc, vc, tables, seq_lens, qsl, topk, W, R, bs, scale)
    rows = slice(qsl[0], qsl[-1])
    tol = attention_bound_for(q, kc, vc, seq_lens, scale)
    assert_within(got[rows], want[rows], tol)  # vs float64
    dense = np.zeros_like(q)
    prefill_attention(q, kc, vc, tables, qsl, seq_lens, bs, scale, dense)
    assert np.abs(got[rows] - dense[rows]).max() > tol  # really approximate: the test can fail


# ---- parameters ----

@pytest.mark.parametrize("changes,field", [({"sparse_topk": 0}, "sparse_topk"), ({"sparse_window": 0}, "sparse_window"),
                                           ({"sparse_block": -1}, "sparse_block"),
                                           ({"sparse_window": 2, "sparse_block": 4}, "sparse_window"),
                                           ({"sparse_max_keep_pct": 0}, "sparse_max_keep_pct")])
def test_bad_parameters_are_clear_errors(changes, field):
    with pytest.raises(ToolkitError, match=field):
        EngineOptions().with_(**changes).validate()
    EngineOptions().validate()


# ---- where the sparse kernels run: the kept-key count and sparse_max_keep_pct ----

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 300)), min_size=1, max_size=4),
       st.integers(1, 40), st.integers(1, 8), st.integers(0, 40))
def test_kept_keys_counts_every_row(reqs, K, R, extra):
    """kept_keys' closed form against a loop over the rows: a row at position p keeps min(p + 1, K*R + W)."""
    W = R + extra
    opts = EngineOptions(sparse_topk=K, sparse_block=R, sparse_window=W)
    lens = tuple((n, n + cached) for n, cached in reqs)
    rows = [p for n, L in lens for p in range(L - n, L)]
    assert kept_keys(lens, opts) == (sum(min(p + 1, K * R + W) for p in rows), sum(p + 1 for p in rows))


def test_sparse_runs_only_where_the_selection_drops_most_keys():
    """Default K 512, W 128, R 4: a row keeps at most 2,176 keys. A 4,096-token prompt keeps 78% of its causal
    keys (dense runs: "sparse-skipped"), 16K keeps 25% (sparse); 2,048 tokens see every block (exact)."""
    opts = EngineOptions()
    kept, causal = kept_keys(((4096, 4096),), opts)
    assert round(100 * kept / causal) == 78
    assert [step_path(((T, T),), opts) for T in (2048, 4096, 16384)] == ["sparse-exact", "sparse-skipped",
                                                                          "sparse-approx"]
    assert step_path(((4096, 4096),), opts.with_(sparse_max_keep_pct=100)) == "sparse-approx"
    assert step_path(((16384, 16384),), opts.with_(sparse_max_keep_pct=1)) == "sparse-skipped"
    assert step_path(((4096, 4096),), opts.with_(sparse_prefill=False)) == "dense" and step_path((), opts) == ""
    # The last 1,024 tokens of a 16K prompt (a chunk after a cached prefix) keep few keys: sparse.
    assert approximates(((1024, 16384),), opts) and not approximates(((4096, 4096),), opts)
    # The step's requests are counted together: a short prompt beside a long one does not turn the long one dense.
    assert approximates(((16384, 16384), (2048, 2048)), opts)
