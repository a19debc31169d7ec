"""Sparse prefill end to end on the CPU: the fixtures (tests/fixtures) and stories260K.

* The default parameters cover every block of these short prompts, so the sparse path must give dense logits;
  toolkit.sparse.DENSE_WHEN_EXACT = False forces the sparse kernels themselves to run on them.
* A forced-sparse prefill (K=2, W=4, R=2; query tiles of 4 and of 1) is compared with the same model run on a
  backend whose sparse ops are the plain NumPy references of tests/test_sparse_kernels.py (argsort top-k,
  Python-set key sets, float64 softmax), the indexer a float64 loop over the cache and the raw queries: an
  independent implementation of the same semantics.
* Records say which path ran: StepTiming.prefill_path and RequestStats.prefill_path.
"""
import numpy as np
import pytest
from tests.conftest import FIXTURES
from tests.reference_run import FIXTURE_NAMES
from tests.kernels.test_sparse_kernels import ref_combine, ref_sparse_attention, ref_topk
from tests.tolerance import model_bound

import toolkit.model.sparse as sparse
from toolkit.engine.build import build_engine
from toolkit.backends.cpu import CpuBackend
from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions


def bound(engine, ids, logits):
    """Two float32 runs of the model that round differently (another attention kernel, another chunking):
    model_bound over len(ids) keys (tests/tolerance.py)."""
    return model_bound(engine.cfg, len(ids), np.abs(logits).max())

TIGHT = dict(sparse_topk=2, sparse_window=4, sparse_block=2, sparse_max_keep_pct=100)  # sparse wherever approximate


@pytest.fixture
def force_sparse(monkeypatch):
    monkeypatch.setattr(sparse, "DENSE_WHEN_EXACT", False)


class RefBackend(CpuBackend):
    """CpuBackend with the sparse ops replaced by slow, obvious references."""

    def sparse_compress_keys(self, k_cache, block_tables, seq_lens, block_size, R, kbar):
        self._cache = (k_cache, block_tables, block_size)

    @staticmethod
    def _tiles(qsl, seq_lens, Q):
        """(request, first local row, positions) of every tile row: a request's queries grouped by pos // Q."""
        out, t = [], 0
        for b in range(len(seq_lens)):
            qlen = int(qsl[b + 1] - qsl[b])
            pos = list(range(int(seq_lens[b]) - qlen, int(seq_lens[b])))
            for p in pos:
                if p == pos[0] or p % Q == 0:
                    out.append((b, t + p - pos[0], []))
                out[-1][2].append(p)
            t += qlen
        return out

    def sparse_query_means(self, q, qsl, seq_lens, Q, r0, qbar, max_tiles=None):
        self._q = q  # the scores below average the raw queries themselves

    def sparse_scores(self, qbar, kbar, qsl, seq_lens, R, Q, r0, scores, max_tiles=None):
        kc, tables, bs = self._cache
        q, Hkv = self._q, kc.shape[1]
        for i, (b, t, pos) in enumerate(self._tiles(qsl, seq_lens, Q)[r0:r0 + len(scores)]):
            rows = q[qsl[0] + t:qsl[0] + t + len(pos)].astype(np.float64)
            qm = rows.reshape(len(pos), Hkv, -1, q.shape[2]).mean(axis=(0, 2))
            for j in range(scores.shape[1]):
                if j < (pos[0] + 1) // R:
                    km = np.mean([kc[tables[b, k // bs] * bs + k % bs] for k in range(j * R, j * R + R)], 0)
                    scores[i, j] = sum(max(0.0, qm[g] @ km[g]) for g in range(Hkv))
                else:
                    scores[i, j] = -np.inf

    def sparse_topk(self, scores, qsl, seq_lens, R, K, Q, r0, topk, rows):
        tiles = self._tiles(qsl, seq_lens, Q)
        full = np.zeros((len(tiles), 1 if scores is None else scores.shape[1]), np.float32)
        if scores is not None:  # this chunk's tile rows; ref_topk reads no other row's scores for them
            full[r0:r0 + rows] = scores[:rows]
        want = ref_topk(full, qsl, seq_lens, R, K, Q)
        for _, t, pos in tiles[r0:r0 + rows]:
            topk[t:t + len(pos)] = want[t:t + len(pos)]
        self._topk = topk

    def combine_topk_swa_indices(self, topk, qsl, seq_lens, gather_lens, W, R, K, M, N, out, lens):
        want, want_lens = ref_combine(topk, qsl, seq_lens, gather_lens, W, R, K, M, N)
        out[:], lens[:] = want, want_lens

    def sparse_attention(self, q, k_cache, v_cache, block_tables, qsl, seq_lens, combined, lens, M, N, W, R,
                         block_size, scale, out):
        ref = ref_sparse_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl, self._topk, W, R, block_size,
                                   scale)
        out[qsl[0]:qsl[-1]] = ref[qsl[0]:qsl[-1]]


def engines(folder, options, max_context=64, **kw):
    fast = build_engine(folder, device="cpu", max_context=max_context, options=options, warmup=False, **kw)
    ref = build_engine(folder, device="cpu", max_context=max_context, options=options, warmup=False, **kw)
    ref.runner.model.be = RefBackend()  # the model's ops only; the runner keeps its own backend
    ref.runner.model._sparse = sparse.SparsePrefill(ref.runner.model.be)
    return fast, ref


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_default_sparse_equals_dense(name, force_sparse):
    folder = FIXTURES / name
    ids = np.load(folder / "reference.npz")["input_ids"]
    engine = build_engine(folder, device="cpu", max_context=64, options=EngineOptions(sparse_prefill=False),
                          warmup=False)
    dense = engine.logits(ids)
    engine.set_options(EngineOptions())
    assert np.abs(engine.logits(ids) - dense).max() <= bound(engine, ids, dense)
    assert np.abs(engine.logits(ids, chunk=7) - dense).max() <= bound(engine, ids, dense)  # over a cached prefix


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_forced_sparse_matches_reference(name):
    folder = FIXTURES / name
    ids = np.load(folder / "reference.npz")["input_ids"]
    fast, ref = engines(folder, EngineOptions(**TIGHT))
    got, want = fast.logits(ids), ref.logits(ids)
    assert np.abs(got - want).max() <= bound(fast, ids, want)  # float64 reference attention, the rest float32
    fast.set_options(EngineOptions(sparse_prefill=False))
    assert np.abs(fast.logits(ids) - got).max() > bound(fast, ids, got)  # the tight setting really is approximate
    fast.set_options(EngineOptions(**TIGHT))
    # Chunked prefill: the same semantics where chunks end on a multiple of the query tile (W - R + 2 = 4 here) ...
    assert np.abs(fast.logits(ids, chunk=8) - got).max() <= bound(fast, ids, got)
    # ... and anywhere with a selection per query.
    fast.set_options(EngineOptions(**TIGHT, sparse_query_tile=1))
    per_query = fast.logits(ids)
    assert np.abs(fast.logits(ids, chunk=5) - per_query).max() <= bound(fast, ids, per_query)
    ref.set_options(EngineOptions(**TIGHT, sparse_query_tile=1))
    assert np.abs(ref.logits(ids) - per_query).max() <= bound(ref, ids, per_query)


def test_stories_sparse(stories_dir, force_sparse):
    ids = list(np.random.default_rng(0).integers(1, 512, 200))
    fast, ref = engines(stories_dir, EngineOptions(sparse_prefill=False), max_context=512)
    dense = fast.logits(ids)
    fast.set_options(EngineOptions())
    assert np.abs(fast.logits(ids) - dense).max() <= bound(fast, ids, dense)
    tight = EngineOptions(sparse_topk=8, sparse_window=16, sparse_block=4, sparse_max_keep_pct=100)
    fast.set_options(tight)
    ref.set_options(tight)
    got = fast.logits(ids[:120])
    assert np.abs(got - ref.logits(ids[:120])).max() <= bound(fast, ids[:120], got)
    assert np.abs(got - dense[:120]).max() > bound(fast, ids[:120], got)


def test_records_say_which_path_ran():
    folder = FIXTURES / "qwen3"
    ids = np.load(folder / "reference.npz")["input_ids"].tolist()
    engine = build_engine(folder, device="cpu", max_context=64, warmup=False)
    skip = dict(TIGHT, sparse_max_keep_pct=10)  # the tight selection keeps more than 10% of these keys
    for options, want in ((EngineOptions(), "sparse-exact"), (EngineOptions(**TIGHT), "sparse-approx"),
                          (EngineOptions(sparse_prefill=False), "dense"), (EngineOptions(**skip), "sparse-skipped")):
        engine.set_options(options)
        outs = list(engine.generate(ids, SamplingParams(max_tokens=2, ignore_eos=True)))
        assert outs[-1].stats.prefill_path == want
        assert outs[-1].stats.as_dict()["prefill_path"] == want
        assert outs[0].step.prefill_path == want and outs[-1].step.prefill_path == ""  # then a decode step


def test_skipped_sparse_is_dense():
    """Where the selection would keep more than sparse_max_keep_pct of the causal keys the dense kernel runs: the
    logits are dense ones, and the same prompt at 100% is approximate (so the switch really chose)."""
    folder = FIXTURES / "llama"
    ids = np.load(folder / "reference.npz")["input_ids"]
    engine = build_engine(folder, device="cpu", max_context=64, options=EngineOptions(sparse_prefill=False),
                          warmup=False)
    dense = engine.logits(ids)
    kept, causal = sparse.kept_keys(((len(ids), len(ids)),), EngineOptions(**TIGHT))
    below = 100 * kept // causal - 1  # just under this prompt's share: skipped
    engine.set_options(EngineOptions(**dict(TIGHT, sparse_max_keep_pct=below)))
    assert np.array_equal(engine.logits(ids), dense)
    engine.set_options(EngineOptions(**dict(TIGHT, sparse_max_keep_pct=below + 2)))
    assert np.abs(engine.logits(ids) - dense).max() > bound(engine, ids, dense)
