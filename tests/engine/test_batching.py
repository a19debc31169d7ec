"""Continuous batching changes no request's tokens: batch invariance, preemption, prefix reuse (CPU).

Every request of a mixed batch (different prompt lengths, max tokens and arrival steps, under a KV
budget small enough to force preemption and recompute) must produce exactly the greedy tokens it
produces alone.
"""
import numpy as np
import pytest
from tests.conftest import FIXTURES
from tests.tolerance import model_bound

from toolkit.engine.build import build_engine
from toolkit.engine import SamplingParams


def alone(engine, ids, n):
    return [o.token for o in engine.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]


def run_mixed(engine, requests, arrivals):
    """requests: [(ids, max_tokens)]; request i is added before step arrivals[i]. Returns tokens per request."""
    got, rids, stepno = {}, {}, 0
    pending = sorted(range(len(requests)), key=lambda i: arrivals[i])
    while pending or engine.has_unfinished():
        while pending and arrivals[pending[0]] <= stepno:
            i = pending.pop(0)
            ids, n = requests[i]
            rids[engine.add_request(ids, SamplingParams(max_tokens=n, ignore_eos=True))] = i
        for o in engine.step():
            got.setdefault(rids[o.request_id], []).append(o.token)
        stepno += 1
    return [got[i] for i in range(len(requests))]


def workload(vocab, seed=0, n=6):
    """Short prompts (one block each) that grow past a block: admitted together, they outgrow a small cache."""
    rng = np.random.default_rng(seed)
    requests = [(rng.integers(1, vocab, rng.integers(3, 15)).tolist(), int(rng.integers(8, 30)))
                for _ in range(n)]
    # One request shares a prefix with another (a long prompt): prefix hits happen mid-batch.
    requests[0] = (rng.integers(1, vocab, 36).tolist(), 12)
    requests[3] = (requests[0][0][:-2] + [5, 6], requests[3][1])
    return requests, [0, 0, 1, 2, 2, 5][:n]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_batch_invariance_with_preemption(name):
    engine = build_engine(FIXTURES / name, device="cpu", max_context=64, kv_cache_tokens=96,
                          max_num_batched_tokens=48)
    requests, arrivals = workload(engine.cfg.vocab_size)
    want = [alone(engine, ids, n) for ids, n in requests]
    before = engine.scheduler.num_preemptions
    assert run_mixed(engine, requests, arrivals) == want
    assert engine.scheduler.num_preemptions > before  # the budget really forced recomputes
    assert engine.block_manager.num_free == engine.block_manager.num_blocks  # everything released


def test_batch_invariance_stories(stories_dir):
    engine = build_engine(stories_dir, device="cpu", kv_cache_tokens=80, max_num_batched_tokens=64)
    tok = engine.tokenizer
    prompts = ["Once upon a time", "The little dog", "Lily and Ben went to the park. They",
               "One day, a bird", "Once upon a time, there was a big"]
    requests = [(tok.encode(p), n) for p, n in zip(prompts, (30, 12, 25, 40, 18))]
    want = [alone(engine, ids, n) for ids, n in requests]
    assert run_mixed(engine, requests, [0, 0, 3, 4, 9]) == want
    assert engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("policy", ["mixed", "alternate"])
def test_policies_agree(policy):
    engine = build_engine(FIXTURES / "llama", device="cpu", max_context=64, scheduler_policy=policy)
    requests, arrivals = workload(engine.cfg.vocab_size, seed=1)
    want = [alone(engine, ids, n) for ids, n in requests]
    assert run_mixed(engine, requests, arrivals) == want


def test_prefix_reuse_prefills_only_new_tokens():
    engine = build_engine(FIXTURES / "qwen2", device="cpu", max_context=64)
    rng = np.random.default_rng(3)
    prefix = rng.integers(1, engine.cfg.vocab_size, 40).tolist()
    first = list(engine.generate(prefix + [7, 8], SamplingParams(max_tokens=2, ignore_eos=True)))
    assert first[0].stats.cached_tokens == 0
    follow = prefix + [9, 10, 11]
    outs = list(engine.generate(follow, SamplingParams(max_tokens=1, ignore_eos=True)))
    assert outs[0].stats.cached_tokens == 32 and outs[0].step.cached_tokens == 32  # two 16-token blocks
    assert outs[0].step.n_tokens == len(follow) - 32  # only the rest was prefilled
    warm = engine.runner.logits[0].copy()  # the prefill step's logits of the last row
    cold = engine.logits(follow)[-1]
    # two float32 runs of the model (cached prefix vs recomputed), rounded differently: tests/tolerance.py
    assert np.abs(warm - cold).max() <= model_bound(engine.cfg, len(follow), np.abs(cold).max())
    engine.set_options(engine.options.with_(prefix_caching=False))
    outs = list(engine.generate(follow, SamplingParams(max_tokens=1)))
    assert outs[0].stats.cached_tokens == 0 and outs[0].step.n_tokens == len(follow)
