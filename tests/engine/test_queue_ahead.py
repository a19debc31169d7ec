"""A decode step queued before the step before it has its tokens back (LLMEngine._launch_next) changes nothing a
request sees: the same tokens, texts, finish reasons and prefix-cache keys as one step at a time (CPU).

The CPU backend computes as it launches, so the engine queues ahead only where the backend is asynchronous; these
tests turn it on (`queue_ahead`) to run the same bookkeeping on the CPU, and give the runner the GPU's batch
buckets where a test needs the padding rows a queued step keeps for requests that ended.
"""
import numpy as np
import pytest
from tests.conftest import FIXTURES

from toolkit.engine import SamplingParams
from toolkit.engine.build import build_engine
from toolkit.engine.step import StepBatch


def make(name="llama", ahead=True, buckets=None, **kw):
    engine = build_engine(FIXTURES / name, device="cpu", max_context=kw.pop("max_context", 96), **kw)
    engine.queue_ahead = ahead
    if buckets:
        engine.runner.buckets = list(buckets)
    return engine


def drain(engine, requests, arrivals=None, abort_at=None):
    """requests: [(ids, SamplingParams)], request i added before step arrivals[i]; abort_at: (step, i). Returns
    per request [(token, text, finish_reason)], and every output's StepTiming."""
    arrivals = arrivals or [0] * len(requests)
    got, rids, steps, stepno = {}, {}, [], 0
    pending = sorted(range(len(requests)), key=lambda i: arrivals[i])
    while pending or engine.has_unfinished():
        while pending and arrivals[pending[0]] <= stepno:
            i = pending.pop(0)
            rids[engine.add_request(*requests[i])] = i
        if abort_at and abort_at[0] == stepno:
            engine.abort(next(r for r, i in rids.items() if i == abort_at[1]))
        for o in engine.step():
            got.setdefault(rids[o.request_id], []).append((o.token, o.text, o.finish_reason))
            steps.append(o.step)
        stepno += 1
    return [got[i] for i in range(len(requests))], [s for s in steps if s is not None]


def workload(vocab, seed=0):
    """Greedy and seeded requests of different lengths; two share a 34-token prefix (prefix-cache keys)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(1, vocab, 34).tolist()
    prompts = [prefix + [3], rng.integers(1, vocab, 5).tolist(), prefix + [4, 5], rng.integers(1, vocab, 20).tolist()]
    params = [SamplingParams(max_tokens=30, ignore_eos=True),
              SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=7),
              SamplingParams(max_tokens=21, ignore_eos=True, temperature=1.0, top_k=20, seed=11),
              SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.7, top_p=0.9, seed=3)]
    return list(zip(prompts, params))


@pytest.mark.parametrize("name,buckets", [("llama", None), ("qwen3", (1, 2, 4, 8))])
def test_queued_steps_change_no_tokens(name, buckets):
    plain, queued = make(name, ahead=False), make(name, buckets=buckets)
    reqs = workload(plain.cfg.vocab_size)
    want, _ = drain(plain, reqs, [0, 0, 0, 2])
    got, steps = drain(queued, reqs, [0, 0, 0, 2])
    assert got == want
    assert any(s.queued for s in steps) and not all(s.queued for s in steps)
    # The prefix cache keyed the same blocks with the same tokens, and everything went back to the free list.
    assert {h: queued.block_manager.blocks[b].tokens for h, b in queued.block_manager.cached.items()} == \
           {h: plain.block_manager.blocks[b].tokens for h, b in plain.block_manager.cached.items()}
    assert queued.block_manager.num_free == queued.block_manager.num_blocks
    assert not queued.has_unfinished()


def test_queued_while_requests_wait_for_a_seat():
    """More requests than seats: decode steps are queued while the waiting ones cannot be admitted, and each is
    admitted in the step it would be one step at a time (its seat frees when a request ends by length)."""
    plain, queued = make(ahead=False, max_num_seqs=4), make(max_num_seqs=4, buckets=(1, 2, 4))
    rng = np.random.default_rng(5)
    reqs = [(rng.integers(1, plain.cfg.vocab_size, int(rng.integers(3, 12))).tolist(),
             SamplingParams(max_tokens=int(n), ignore_eos=True)) for n in (9, 14, 6, 11, 8, 7, 10)]
    want, want_steps = drain(plain, reqs)
    got, steps = drain(queued, reqs)
    assert got == want
    # The same steps (so the same admissions), and some queued before the last request's first token.
    assert [(s.index, s.kind, s.n_seqs) for s in steps] == [(s.index, s.kind, s.n_seqs) for s in want_steps]
    last_prefill = max(s.index for s in steps if s.kind == "prefill")
    assert any(s.queued and s.index < last_prefill for s in steps)


def test_requests_that_end_become_padding_rows():
    """With batch buckets (as on the GPU) a queued step keeps the rows of requests that ended by length."""
    engine = make(buckets=(1, 2, 4, 8))
    reqs = [(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in
            zip(([5, 6, 7], [8, 9], [10, 11, 12, 13]), (6, 14, 25))]
    want = [[t for t, _, _ in drain(make(ahead=False), [r])[0][0]] for r in reqs]
    got, steps = drain(engine, reqs)
    assert [[t for t, _, _ in g] for g in got] == want
    # 3 requests pad to 4 rows; after the first ends, 2 live rows still pad to 2... so 3 -> 2 rows is one bucket
    # down (4 -> 2) and a compact step is scheduled; from 2 live rows to 1 likewise.
    queued = [s for s in steps if s.queued]
    assert queued and {s.n_seqs for s in queued} == {3, 2, 1}


def test_stop_token_while_a_step_is_queued():
    """A stop token only its step's tokens tell: the queued step's row for it is dropped, nothing else changes."""
    plain = make(ahead=False)
    ids = [5, 6, 7, 8]
    alone = [o.token for o in plain.generate(ids, SamplingParams(max_tokens=12, ignore_eos=True))]
    stop = alone[5]
    k = alone.index(stop)
    reqs = [(ids, SamplingParams(max_tokens=12, stop_token_ids=[stop])),
            ([9, 10, 11], SamplingParams(max_tokens=20, ignore_eos=True))]
    want, _ = drain(make(ahead=False), reqs)
    engine = make()
    got, steps = drain(engine, reqs)
    assert got == want
    assert [f for _, _, f in got[0]] == [None] * k + ["stop"] and len(got[1]) == 20
    assert any(s.queued for s in steps)
    assert engine.block_manager.num_free == engine.block_manager.num_blocks


def test_abort_while_a_step_is_queued():
    reqs = [([5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True)),
            ([8, 9], SamplingParams(max_tokens=25, ignore_eos=True))]
    want, _ = drain(make(ahead=False), reqs, abort_at=(8, 0))
    engine = make()
    got, _ = drain(engine, reqs, abort_at=(8, 0))
    assert got == want
    assert got[0][-1] == (None, "", "abort") and len(got[1]) == 25
    assert engine.block_manager.num_free == engine.block_manager.num_blocks


def test_history_dependent_sampling_is_never_queued():
    """Penalties read a request's own last token on the host: such a batch runs one step at a time."""
    reqs = [([5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True, repetition_penalty=1.3)),
            ([8, 9], SamplingParams(max_tokens=10, ignore_eos=True))]
    want, _ = drain(make(ahead=False), reqs)
    got, steps = drain(make(), reqs)
    assert got == want and not any(s.queued for s in steps)


def test_a_failed_queued_launch_loses_no_output(monkeypatch):
    engine = make()
    reqs = [([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))]
    want, _ = drain(make(ahead=False), reqs)
    rid = engine.add_request(*reqs[0])
    assert [o.token for o in engine.step()] == [want[0][0][0]]  # the prefill: nothing queued after it
    launch = engine.runner.launch

    def failing(*a, feed=False, **kw):
        if feed:
            raise RuntimeError("device fault")
        return launch(*a, **kw)

    monkeypatch.setattr(engine.runner, "launch", failing)
    outs = engine.step()  # the first decode step's tokens come back although the launch queued after it failed
    assert [o.token for o in outs] == [want[0][1][0]] and outs[0].request_id == rid
    with pytest.raises(RuntimeError, match="device fault"):
        engine.step()
    monkeypatch.setattr(engine.runner, "launch", launch)
    rest = []
    while engine.has_unfinished():
        rest += [(o.token, o.text, o.finish_reason) for o in engine.step()]
    assert rest == want[0][2:]


def test_wall_time_counts_from_the_step_before_when_queued():
    engine = make()
    steps = [o.step for o in engine.generate([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))]
    assert [s.queued for s in steps] == [False, False] + [True] * 4
    assert all(s.wall_ms > 0 for s in steps)


def test_prepare_next_pads_ended_rows():
    engine = make()
    seqs = []
    for ids in ([1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]):
        rid = engine.add_request(ids, SamplingParams(max_tokens=4, ignore_eos=True))
        seqs.append(engine._seqs[rid])
    engine.step()  # the prefill
    bm, bs = engine.block_manager, engine.block_size
    for s in seqs:
        bm.append_slots(s, 2)
    pos = np.array([s.num_computed for s in seqs], np.int32)
    tables = np.zeros((2, 2), np.int32)
    cur = StepBatch(np.zeros(2, np.int32), pos, pos, np.arange(3, dtype=np.int32), pos + 1, tables, 2, 256)
    nxt = engine.runner.prepare_next(cur, seqs, [False, True])
    s = seqs[1]
    p = s.num_computed + 1  # 16: the first slot of its second block
    assert nxt.positions.tolist() == [0, p] and nxt.seq_lens.tolist() == [0, p + 1]
    assert nxt.slot_mapping.tolist() == [-1, s.block_table[p // bs] * bs + p % bs]
    assert nxt.block_tables[1, :len(s.block_table)].tolist() == s.block_table and not nxt.block_tables[0].any()
    assert nxt.kind == "decode"
