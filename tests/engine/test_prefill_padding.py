"""A prefill step padded as its CUDA graph runs it (toolkit/engine/runner.py): its tokens padded to a token bucket
by rows of no request, its requests to a batch bucket by empty ones. On the CPU (no graphs) the runner's buckets
are patched in, so the padded step runs eagerly through the same model code the graph captures: it must give the
unpadded step's logits and write no other K/V. Graphs on and off on the GPU: tests/engine/test_gpu_engine.py."""
import numpy as np
import pytest

from toolkit.engine import SamplingParams
from toolkit.engine.build import build_engine
from toolkit.engine.options import EngineOptions
from toolkit.engine.runner import GRAPH_BUCKETS, PREFILL_GRAPH_TOKENS
from toolkit.engine.sequence import Sequence


@pytest.fixture(scope="module")
def tiny():
    return build_engine(shape="tiny", device="cpu", max_context=2048, max_num_batched_tokens=1500, warmup=False)


def test_prefill_buckets(tiny, monkeypatch):
    run = tiny.runner
    monkeypatch.setattr(run, "buckets", [b for b in GRAPH_BUCKETS if b <= tiny.max_num_seqs])
    assert run.prefill_bucket(1, 1) == (1, 16) and run.prefill_bucket(1, 16) == (1, 16)
    assert run.prefill_bucket(3, 300) == (4, 512) and run.prefill_bucket(5, 513) == (8, 768)
    assert run.prefill_bucket(1, 1300) == (1, 1500)  # the 1,536 bucket, cut to the rows staged (the step budget)
    assert run.prefill_bucket(1, PREFILL_GRAPH_TOKENS[-1] + 1) is None  # long steps run eagerly as they are
    assert run.prefill_bucket(tiny.max_num_seqs + 1, 100) is None
    monkeypatch.setattr(run, "buckets", [])  # the CPU's own: nothing is padded
    assert run.prefill_bucket(1, 100) is None


def _prompt(rng, n, blocks, bs, vocab):
    s = Sequence(rng.integers(1, vocab, n).tolist(), SamplingParams())
    s.block_table = blocks[:-(-n // bs)]
    del blocks[:-(-n // bs)]
    return s


@pytest.mark.parametrize("lengths", [(5,), (37, 100, 2), (300, 1)])
def test_a_padded_prefill_step_gives_the_unpadded_logits_and_writes_no_other_kv(tiny, monkeypatch, lengths):
    run, be = tiny.runner, tiny.runner.be
    bs, vocab, B = run.block_size, tiny.cfg.vocab_size, len(lengths)
    rng = np.random.default_rng(sum(lengths))
    blocks = rng.permutation(run.kv.k[0].shape[0] // bs).tolist()
    seqs = [_prompt(rng, n, blocks, bs, vocab) for n in lengths]
    options = EngineOptions(sparse_prefill=False)
    got = {}
    for padded in (False, True):
        monkeypatch.setattr(run, "buckets", [b for b in GRAPH_BUCKETS if b <= tiny.max_num_seqs] if padded else [])
        for cache in run.kv.k + run.kv.v:
            cache[:] = 0
        batch = run.prepare(seqs, list(lengths), 0)
        pad = run._padding(batch, options)
        assert (pad is not None) == padded
        run.collect(run.launch(batch, options, [None] * B, []))
        got[padded] = (be.to_host(run.logits[:B]).copy(), [be.to_host(c).copy() for c in run.kv.k + run.kv.v])
    (want_logits, want_kv), (logits, kv) = got[False], got[True]
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)  # fp32; a GEMM of more rows may block K
    for a, b in zip(kv, want_kv):  # (otherwise) the same rows: the same K/V, and nothing past them
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert not a[b == 0].any(), "a padding row wrote K/V"


def test_with_sparse_prefill_only_steps_that_run_the_dense_kernel_are_padded(tiny, monkeypatch):
    """The sparse path sizes its kernels on the host from the real lengths, so a step that runs them stays eager and
    unpadded; one where every row sees every block, or the selection keeps too many keys, runs the dense kernel
    (toolkit/model/sparse.py) and is padded like any prefill."""
    from toolkit.engine.step import StepBatch

    run = tiny.runner
    monkeypatch.setattr(run, "buckets", [b for b in GRAPH_BUCKETS if b <= tiny.max_num_seqs])
    options = EngineOptions()
    assert options.sparse_prefill

    def chunk(n, seq_len):  # a prompt chunk of n tokens ending at seq_len
        z = np.zeros(n, np.int32)
        return StepBatch(z, np.arange(seq_len - n, seq_len, dtype=np.int32), z, np.array([0, n], np.int32),
                         np.array([seq_len], np.int32), np.zeros((1, 1), np.int32), 0, 256)
    assert run._padding(chunk(100, 1000), options) == (1, 128)  # every row sees every block (1,000 // 4 <= 512)
    assert run._padding(chunk(100, 2400), options) == (1, 128)  # keeps 2,176 of ~2,350 keys a row: dense
    assert run._padding(chunk(100, 8000), options) is None  # keeps ~27% of the keys: the sparse kernels run
    assert run._padding(chunk(100, 8000), options.with_(sparse_prefill=False)) == (1, 128)
