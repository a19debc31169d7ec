"""Sparse prefill CUDA kernels against their CPU twins at realistic shapes (H200; skipped without a GPU).

combine and top-k must be bit-identical to the twins (same inputs); the indexer and sparse attention read bf16
caches and are compared with the twins run on the same bf16 values upcast to fp32 (bf16 tolerance).
Shapes: Qwen2.5-0.5B's attention (14 query heads, 2 kv heads, head dim 64), several requests with cached
prefixes, a query_start_loc slice that does not start at 0, block size 16 and shuffled block tables.
"""
import numpy as np
import pytest
from tests.paged_cache import paged_cache
from tests.kernels.test_sparse_kernels import pipeline, random_combine_case
from tests.kernels.test_sparse_tiled import union_buffers

from kernels import sparse_prefill as sp
from kernels.combine import combine_topk_swa_indices as combine_twin
from kernels.prefill_attention import prefill_attention
from toolkit.model.sparse import query_tile

pytestmark = pytest.mark.gpu
I32 = np.int32


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    return cp, be


def bf16(a):
    import ml_dtypes

    return np.ascontiguousarray(a, np.float32).astype(ml_dtypes.bfloat16)


def up(cp, a):
    """fp32 host -> (device bf16 bits, the same values as fp32 on the host)."""
    b = bf16(a)
    return cp.asarray(b.view(np.uint16)), b.astype(np.float32)


def test_combine_bit_identical(cuda):
    cp, be = cuda
    t = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], I32)
    args = (np.array([0, 2, 3], I32), np.array([8, 10], I32), np.array([8, 10], I32))
    c, n = cp.empty((3, 128), cp.int32), cp.empty(3, cp.int32)  # T = 3 rows, K + W = 8 padded to 128
    be._sparse.combine(cp.asarray(t), *map(cp.asarray, args), 4, 2, 4, 64, 16, c, n)  # W 4, R 2, K 4, M 64, N 16
    assert c.get()[2, :8].tolist() == [73, 74, 75, 76, 86, 87, 88, 89] and n.get().tolist() == [7, 8, 8]
    rng = np.random.default_rng(0)
    for K, W, R in ((512, 128, 4), (0, 16, 1), (7, 8, 2), (3, 5, 5)):
        for workers in (None, 128, 256):  # the engine's warp a row; the persistent layout bench sparse compares
            topk, qsl, seq_lens, gather, M, N = random_combine_case(rng, 4, K, W, R, base=17)
            want, want_lens = combine_twin(topk, qsl, seq_lens, gather, W, R, K, M, N)
            full_qsl = cp.asarray(np.concatenate([[0, 5, 17], qsl]).astype(I32))  # a slice that starts at 17
            out = cp.full(want.shape, 999, cp.int32)  # dirty buffer
            lens = cp.full(len(want_lens), 999, cp.int32)
            be._sparse.combine(cp.asarray(topk), full_qsl[3:], cp.asarray(seq_lens), cp.asarray(gather), W, R, K, M,
                               N, out, lens, workers=workers)
            np.testing.assert_array_equal(out.get(), want)
            np.testing.assert_array_equal(lens.get(), want_lens)


def case(rng, cp, lens=(700, 300, 1500), qlens=(700, 120, 900), Hq=14, Hkv=2, D=64, bs=16):
    kc, vc, tables = paged_cache(rng, list(lens), Hkv, D, block_size=bs)
    kc, vc = np.nan_to_num(kc, nan=1e4), np.nan_to_num(vc, nan=1e4)  # bf16 keeps no NaN payload reliably
    qsl = (np.concatenate([[0], np.cumsum(qlens)]) + 3).astype(I32)
    q = rng.standard_normal((int(qsl[-1]) + 1, Hq, D)).astype(np.float32)
    seq_lens = np.array(lens, I32)
    dq, q = up(cp, q)
    dk, kc = up(cp, kc)
    dv, vc = up(cp, vc)
    dev = dict(q=dq, k=dk, v=dv, tables=cp.asarray(tables), qsl=cp.asarray(qsl), seq_lens=cp.asarray(seq_lens))
    return dev, (q, kc, vc, tables, qsl, seq_lens)


@pytest.mark.parametrize("Q", [1, 64, 13])
def test_indexer_and_topk(cuda, Q):
    cp, be = cuda
    rng = np.random.default_rng(1)
    dev, (q, kc, vc, tables, qsl, seq_lens) = case(rng, cp)
    R, K, bs = 4, 64, 16
    N = int((seq_lens // R).max())
    T = int(qsl[-1] - qsl[0])
    kbar = sp.compress_keys(kc, tables, seq_lens, bs, R, np.empty((len(seq_lens), N, *kc.shape[1:]), np.float32))
    dkbar = cp.empty(kbar.shape, cp.float32)
    be.sparse_compress_keys(dev["k"], dev["tables"], dev["seq_lens"], bs, R, dkbar)
    np.testing.assert_allclose(dkbar.get(), kbar, rtol=1e-5, atol=1e-5)
    req, _, cnt, _ = sp.tile_rows(qsl, seq_lens, Q)
    tiles, max_tiles = len(req), int(np.bincount(req).max())
    qbar = sp.query_means(q, qsl, seq_lens, Q, 0, np.empty((tiles, 2, 64), np.float32))
    scores = sp.indexer_scores(qbar, kbar, qsl, seq_lens, R, Q, 0, np.empty((tiles, N), np.float32))
    r0 = tiles // 6  # one chunk of tile rows, across a request boundary
    rows = {1: 1000, 64: 20, 13: 80}[Q]
    assert req[r0] == 0 and req[r0 + rows - 1] > 0
    dqbar = cp.full((rows, 2, 64), 7.0, cp.float32)
    be.sparse_query_means(dev["q"], dev["qsl"], dev["seq_lens"], Q, r0, dqbar, max_tiles)
    np.testing.assert_allclose(dqbar.get(), qbar[r0:r0 + rows], rtol=1e-4, atol=1e-5)
    dscores = cp.empty((rows, N), cp.float32)
    be.sparse_scores(dqbar, dkbar, dev["qsl"], dev["seq_lens"], R, Q, r0, dscores, max_tiles)
    got = dscores.get()
    want = scores[r0:r0 + rows]
    assert (np.isinf(got) == np.isinf(want)).all()
    fin = np.isfinite(want)
    assert np.abs(got[fin] - want[fin]).max() <= 1e-3 * np.abs(want[fin]).max()
    # top-k on identical scores, rounded so that ties are common: bit-identical to the twin
    tied = np.round(scores * 4) / 4
    want_topk = np.full((T, K), 7, I32)
    sp.topk_blocks(tied, qsl, seq_lens, R, K, Q, 0, want_topk)
    dtopk = cp.full((T, K), 7, cp.int32)
    cut = tiles // 3
    be.sparse_topk(cp.asarray(tied[:cut]), dev["qsl"], dev["seq_lens"], R, K, Q, 0, dtopk, cut)
    be.sparse_topk(cp.asarray(tied[cut:]), dev["qsl"], dev["seq_lens"], R, K, Q, cut, dtopk, tiles - cut)
    np.testing.assert_array_equal(dtopk.get(), want_topk)


@pytest.mark.parametrize("K,W,R", [(64, 128, 4), (512, 128, 4), (3, 8, 2)])
def test_sparse_attention(cuda, K, W, R):
    cp, be = cuda
    rng = np.random.default_rng(K + W)
    dev, (q, kc, vc, tables, qsl, seq_lens) = case(rng, cp)
    bs, scale = 16, 64 ** -0.5
    combined, clens, M, N, _ = pipeline(q, kc, tables, seq_lens, qsl, K, W, R, bs)
    want = np.zeros_like(q)
    sp.sparse_attention(q, kc, vc, tables, qsl, seq_lens, combined, clens, M, N, W, R, bs, scale, want)
    dout = cp.zeros(dev["q"].shape, cp.uint16)
    be.sparse_attention(dev["q"], dev["k"], dev["v"], dev["tables"], dev["qsl"], dev["seq_lens"],
                        cp.asarray(combined), cp.asarray(clens), M, N, W, R, bs, scale, dout)
    got = be.to_host(dout)
    rows = slice(qsl[0], qsl[-1])
    err = np.abs(got[rows] - want[rows]).max()
    assert err <= 2e-2 * max(1.0, np.abs(want[rows]).max()), err
    if N <= K:  # every block covered: dense attention
        dense = np.zeros_like(q)
        prefill_attention(q, kc, vc, tables, qsl, seq_lens, bs, scale, dense)
        assert np.abs(got[rows] - dense[rows]).max() <= 2e-2 * max(1.0, np.abs(dense[rows]).max())


def test_engine_sparse_gpu_matches_cpu(stories_dir, monkeypatch):
    import toolkit.model.sparse as sparse
    from toolkit.engine.build import build_engine
    from toolkit.engine.options import EngineOptions

    monkeypatch.setattr(sparse, "DENSE_WHEN_EXACT", False)
    ids = list(np.random.default_rng(0).integers(1, 512, 300))
    tight = EngineOptions(sparse_topk=8, sparse_window=16, sparse_block=4, sparse_max_keep_pct=100)
    got = build_engine(stories_dir, device="cuda", dtype="float32", max_context=512, options=tight,
                       warmup=False).logits(ids)
    want = build_engine(stories_dir, device="cpu", max_context=512, options=tight, warmup=False).logits(ids)
    assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(want).max())
    dense = build_engine(stories_dir, device="cuda", dtype="float32", max_context=512,
                         options=EngineOptions(sparse_prefill=False), warmup=False)
    exact = build_engine(stories_dir, device="cuda", dtype="float32", max_context=512, options=EngineOptions(),
                         warmup=False)
    assert np.abs(exact.logits(ids) - dense.logits(ids)).max() <= 1e-3


# ---- the tensor-core route: tile unions + sparse_attention_tc ----

def tiled_gpu(cp, be, dev, combined, clens, M, N, W, R, K, Q, qlens, bs, scale, out_rows):
    from kernels.sparse_attention_tc import n_tiles, union_cap

    B = len(qlens)
    tiles, cap = n_tiles(max(qlens)), union_cap(N, K)
    ublk = cp.full((B * tiles, cap), -7, cp.int32)  # dirty buffers: the kernels must not rely on zeros
    umask = cp.full((B * tiles, cap), 5, cp.uint64)
    ucount = cp.full(B * tiles, -7, cp.int32)
    be.sparse_tile_union(dev["qsl"], dev["seq_lens"], cp.asarray(combined), cp.asarray(clens), M, N, W, R, K, Q, ublk,
                         umask, ucount)
    dout = cp.zeros((out_rows,) + tuple(dev["q"].shape[1:]), cp.uint16)
    be.sparse_attention_tiled(dev["q"], dev["k"], dev["v"], dev["tables"], dev["qsl"], dev["seq_lens"], ublk, umask,
                              ucount, W, R, K, bs, scale, dout)
    return (ublk.get(), umask.get(), ucount.get()), be.to_host(dout), tiles, cap


@pytest.mark.parametrize("Q", [None, 1])  # the engine's query tile (min(64, W - R + 2)), and one per query
@pytest.mark.parametrize("K,W,R,lens,qlens", [
    (64, 128, 4, (700, 300, 1500), (700, 120, 900)),     # approximate rows next to covered tiles
    (512, 128, 4, (700, 300, 1500), (700, 120, 900)),    # every block covered: dense causal attention
    (3, 8, 2, (700, 300, 1500), (700, 120, 900)),
    (5, 12, 3, (260, 199, 90), (200, 199, 7)),           # R does not divide 64
    (40, 16, 1, (9000, 300), (200, 300)),                # N > UNION_CAP: the union kernel takes two passes
])
def test_sparse_attention_tiled(cuda, K, W, R, lens, qlens, Q):

    from kernels import sparse_attention_tc as tc

    cp, be = cuda
    rng = np.random.default_rng(K * 7 + W + R)
    dev, (q, kc, vc, tables, qsl, seq_lens) = case(rng, cp, lens, qlens)
    bs, scale = 16, 64 ** -0.5
    combined, clens, M, N, _ = pipeline(q, kc, tables, seq_lens, qsl, K, W, R, bs, Q)
    Q = query_tile(64, W, R) if Q is None else Q  # the union kernel reads one row per query tile's long rows
    (ublk, umask, ucount), got, tiles, cap = tiled_gpu(cp, be, dev, combined, clens, M, N, W, R, K, Q, qlens, bs,
                                                       scale, q.shape[0])
    wb, wm, wc = tc.tile_union(qsl, seq_lens, combined, clens, M, N, W, R, K, Q, *union_buffers(len(qlens), tiles, cap))
    for b, n in enumerate(qlens):  # the union lists are bit-identical to the twin's on every existing tile
        for ti in range(b * tiles, b * tiles + tc.n_tiles(n)):
            assert ucount[ti] == wc[ti]
            np.testing.assert_array_equal(ublk[ti, :wc[ti]], wb[ti, :wc[ti]])
            np.testing.assert_array_equal(umask[ti, :wc[ti]], wm[ti, :wc[ti]])
    want = np.zeros_like(q)
    sp.sparse_attention(q, kc, vc, tables, qsl, seq_lens, combined, clens, M, N, W, R, bs, scale, want)
    rows = slice(qsl[0], qsl[-1])
    assert np.isfinite(got[rows]).all()
    err = np.abs(got[rows] - want[rows]).max()
    assert err <= 2e-2 * max(1.0, np.abs(want[rows]).max()), err
    assert (got[:qsl[0]] == 0).all() and (got[qsl[-1]:] == 0).all()  # rows outside the slice untouched
    if N <= K:  # every block covered: dense attention
        dense = np.zeros_like(q)
        prefill_attention(q, kc, vc, tables, qsl, seq_lens, bs, scale, dense)
        assert np.abs(got[rows] - dense[rows]).max() <= 2e-2 * max(1.0, np.abs(dense[rows]).max())


@pytest.mark.parametrize("Q", [64, 1])
def test_tiled_matches_per_query_kernel_at_4k(cuda, Q):
    """Benchmark shape (one fresh 4,096-token prompt, K 512 W 128 R 4): the whole GPU pipeline through
    toolkit/sparse.py with the tiled route against the same pipeline with the per-query CUDA-core kernel."""
    import toolkit.model.sparse as sparse
    from toolkit.engine.options import EngineOptions
    from toolkit.engine.timings import NullTimer

    cp, be = cuda
    rng = np.random.default_rng(4096)
    T = 4096
    dev, (q, kc, vc, tables, qsl, seq_lens) = case(rng, cp, (T,), (T,))

    class Step:
        prefill_lens, max_query_len = ((T, T),), T
        query_start_loc, seq_lens, block_tables = dev["qsl"], dev["seq_lens"], dev["tables"]

    outs = []
    for tc_route in (True, False):
        out = cp.zeros(dev["q"].shape, cp.uint16)
        opts = EngineOptions(sparse_query_tile=Q, sparse_max_keep_pct=100)  # the sparse kernels at 4K
        sparse.SparsePrefill(be).run(Step, dev["k"], dev["v"], 16, dev["q"], out, 0, opts, NullTimer(), 64 ** -0.5,
                                     tc_route)
        outs.append(be.to_host(out))
    rows = slice(qsl[0], qsl[-1])
    assert np.abs(outs[0][rows] - outs[1][rows]).max() <= 2e-2 * max(1.0, np.abs(outs[1][rows]).max())
