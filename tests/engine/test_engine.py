"""Engine behaviour on the CPU: stopping, limits, timings, options, abort, threads."""
import threading

import numpy as np
import pytest
from tests.conftest import FIXTURES

from toolkit.engine.build import build_engine
from toolkit.engine import SamplingParams
from toolkit.engine.worker import EngineWorker
from toolkit.errors import ToolkitError
from toolkit.engine.options import EngineOptions
from toolkit.engine.timings import SECTIONS


@pytest.fixture(scope="module")
def engine():
    return build_engine(FIXTURES / "llama", device="cpu", max_context=48)


def _ids(n=20):
    return np.load(FIXTURES / "llama" / "reference.npz")["input_ids"][:n].tolist()


def greedy(engine, ids, n):
    return [o.token for o in engine.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def test_timings_cover_each_step(engine):
    outs = list(engine.generate(_ids(), SamplingParams(max_tokens=5, ignore_eos=True)))
    assert [o.step.kind for o in outs] == ["prefill"] + ["decode"] * 4
    assert [o.step.n_tokens for o in outs] == [20, 1, 1, 1, 1]
    for o in outs:
        st = o.step
        assert set(st.sections_ms) <= set(SECTIONS) and not st.graph  # the sections this step lapped
        assert list(st.sections_ms) == [k for k in SECTIONS if k in st.sections_ms]  # in pipeline order
        assert st.sections_ms["attention"] > 0 and st.sections_ms["mlp"] > 0
        assert st.wall_ms >= st.gpu_ms > 0 and st.other_ms >= 0
        assert st.options == EngineOptions(cuda_graphs=False, fused_kernels=False, pdl=False)  # as run
    stats = outs[-1].stats
    assert stats.prompt_tokens == 20 and stats.generated_tokens == 5 and stats.decode_steps == 4
    assert stats.prefill_tps > 0 and stats.decode_tps > 0 and stats.ttft_ms > 0
    assert stats.prefill_gpu_ms == outs[0].step.gpu_ms and stats.prefill_ms == outs[0].step.wall_ms
    assert outs[-1].finish_reason == "length" and all(o.finish_reason is None for o in outs[:-1])


def test_a_chunked_prefill_sums_its_steps():
    """A 20-token prompt at 8 tokens a step: three prefill steps, no token until the third; the request's
    prefill_gpu_ms is their device times summed (what `bench` reports for a chunked ppL)."""
    eng = build_engine(FIXTURES / "llama", device="cpu", max_context=48, max_num_batched_tokens=8, max_num_seqs=2)
    eng.add_request(_ids(), SamplingParams(max_tokens=1, ignore_eos=True))
    calls = []
    real = eng.runner.collect
    eng.runner.collect = lambda handle: calls.append(real(handle)) or calls[-1]
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert len(calls) == 3 and [o.token is not None for o in outs] == [True]
    assert outs[0].stats.prefill_gpu_ms == pytest.approx(sum(r.gpu_ms for r in calls), rel=1e-12)


def test_stats_are_snapshots(engine):
    outs = list(engine.generate(_ids(), SamplingParams(max_tokens=4, ignore_eos=True)))
    assert [o.stats.generated_tokens for o in outs] == [1, 2, 3, 4]  # earlier ones did not change
    with pytest.raises(AttributeError):
        outs[0].stats.generated_tokens = 9


def test_eos_and_stop_tokens(engine, monkeypatch):
    toks = greedy(engine, _ids(), 3)
    monkeypatch.setattr(engine, "_eos", frozenset({toks[2]}))
    out = list(engine.generate(_ids(), SamplingParams(max_tokens=10)))
    assert [o.token for o in out] == toks and out[-1].finish_reason == "stop"
    assert out[-1].stats.generated_tokens == 2  # EOS itself is not counted as text
    out = list(engine.generate(_ids(), SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(toks[1],))))
    assert len(out) == 2 and out[-1].finish_reason == "stop"


def test_context_limits(engine):
    with pytest.raises(ToolkitError, match="context holds 48"):
        engine.add_request([0] * 48)
    with pytest.raises(ToolkitError, match="empty"):
        engine.add_request([])
    with pytest.raises(ToolkitError, match="outside the vocabulary"):
        engine.add_request([1, 10 ** 6])
    out = list(engine.generate([0] * 45, SamplingParams(max_tokens=10, ignore_eos=True)))
    assert len(out) == 3 and out[-1].finish_reason == "length"  # positions 45..47 fill the context


def test_max_context_bounds():
    with pytest.raises(ToolkitError, match="--max-context must be between 2 and"):
        build_engine(FIXTURES / "llama", device="cpu", max_context=10_000)


def test_max_tokens_zero_and_abort(engine):
    rid = engine.add_request(_ids(), SamplingParams(max_tokens=0))
    assert [(o.request_id, o.finish_reason) for o in engine.step()] == [(rid, "length")]
    free = engine.block_manager.num_free
    rid = engine.add_request(_ids(), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.block_manager.num_free < free
    engine.abort(rid)
    assert [(o.request_id, o.finish_reason) for o in engine.step()] == [(rid, "abort")]
    assert engine.block_manager.num_free == free and not engine.has_unfinished()


def test_kv_budget_error_is_per_request():
    eng = build_engine(FIXTURES / "llama", device="cpu", max_context=64, kv_cache_tokens=32, warmup=False)
    with pytest.raises(ToolkitError, match="KV-cache slots"):
        eng.add_request(list(range(40)))
    assert len(greedy(eng, _ids(10), 3)) == 3  # the engine is fine for requests that fit


def test_options_apply_at_step_boundary(engine):
    rid = engine.add_request(_ids(), SamplingParams(max_tokens=3, ignore_eos=True))
    first = engine.step()[0]
    engine.set_options(EngineOptions(prefix_caching=False))
    assert first.step.options.prefix_caching  # the step already taken keeps its record
    rest = []
    while engine.has_unfinished():
        rest += engine.step()
    assert all(not o.step.options.prefix_caching for o in rest) and rest[-1].request_id == rid
    engine.set_options(EngineOptions())


def test_second_thread_is_refused(engine):
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, engine.step)))
    t.start()
    t.join()
    assert errors and "EngineWorker" in str(errors[0].value)


def test_worker_serves_interleaved_requests():
    eng = build_engine(FIXTURES / "qwen3", device="cpu", max_context=64)
    a_ids, b_ids = _ids(12), _ids(20)[5:]
    want_a, want_b = greedy(eng, a_ids, 8), greedy(eng, b_ids, 6)
    worker = EngineWorker(eng)
    try:
        ha = worker.submit(a_ids, SamplingParams(max_tokens=8, ignore_eos=True))
        hb = worker.submit(b_ids, SamplingParams(max_tokens=6, ignore_eos=True))
        got = {}
        threads = [threading.Thread(target=lambda h=h: got.__setitem__(h.request_id, [o.token for o in h]))
                   for h in (ha, hb)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got[ha.request_id] == want_a and got[hb.request_id] == want_b
        hc = worker.submit(a_ids, SamplingParams(max_tokens=1000, ignore_eos=True))
        first = next(iter(hc))
        worker.cancel(hc.request_id)
        assert first.token == want_a[0] and [o.finish_reason for o in hc][-1] in ("abort", "length")
        bad = list(worker.submit([], None))
        assert bad[0].finish_reason == "error" and "empty" in bad[0].error
    finally:
        worker.close()


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    """Each request draws from its own generator: the same seed gives the same tokens alone or batched."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    want = [o.token for o in engine.generate(_ids(), params)]
    rids = [engine.add_request(_ids(12), SamplingParams(max_tokens=6, temperature=0.7, seed=9, ignore_eos=True)),
            engine.add_request(_ids(), params)]
    got = {r: [] for r in rids}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id].append(o.token)
    assert got[rids[1]] == want


def test_nan_logits_end_only_their_request():
    """A NaN in one token's embedding poisons only the requests that contain it (the fixture is untied)."""
    eng = build_engine(FIXTURES / "llama", device="cpu", max_context=48, warmup=False)
    ok_ids, bad_ids = [1, 2, 3, 4], [1, 2, 99, 4]
    want = greedy(eng, ok_ids, 4)
    eng.weights.embed[99] = np.nan
    rids = [eng.add_request(ok_ids, SamplingParams(max_tokens=4, ignore_eos=True)),
            eng.add_request(bad_ids, SamplingParams(max_tokens=4, ignore_eos=True)),
            eng.add_request(bad_ids, SamplingParams(max_tokens=4, temperature=0.8, seed=1, ignore_eos=True))]
    outs = {r: [] for r in rids}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id].append(o)
    assert [o.token for o in outs[rids[0]]] == want
    for r in rids[1:]:
        assert outs[r][-1].finish_reason == "error" and "NaN logits" in outs[r][-1].error


def test_kv_cache_budget_is_clamped_and_bounded_by_memory():
    eng = build_engine(FIXTURES / "llama", device="cpu", max_context=64, max_num_seqs=2,
                       kv_cache_tokens=2 ** 31 - 1, warmup=False)
    assert eng.kv_cache_tokens == 2 * 64 + 16  # more than 2 full contexts could never be used
    eng = build_engine(FIXTURES / "llama", device="cpu", max_context=70, max_num_seqs=2,
                       kv_cache_tokens=2 ** 31 - 1, warmup=False)
    assert eng.kv_cache_tokens == 2 * 80 + 16  # a context of 70 fills 5 whole blocks (the clamp once gave 9 for 2)
    with pytest.raises(ToolkitError, match="GiB is free"):
        build_engine(FIXTURES / "llama", device="cpu", max_context=64, max_num_seqs=2 ** 30,
                     max_num_batched_tokens=2 ** 30, kv_cache_tokens=2 ** 40, warmup=False)


def test_buffers_beyond_memory_are_one_error():
    with pytest.raises(ToolkitError, match="not enough memory"):
        build_engine(shape="tiny", device="cpu", max_num_seqs=2 ** 20, max_num_batched_tokens=2 ** 31 - 1,
                     kv_cache_tokens=1024, warmup=False)
