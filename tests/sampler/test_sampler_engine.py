"""The sampler inside the engine (CPU): the fast path's gate and its equivalence with the slow path,
the model's logits left untouched, batch invariance of seeded sampling, stop strings, min_tokens,
bad words, logit bias, logprobs, and the distribution sampled against filtered_probs."""
import math

import numpy as np
import pytest
from tests.conftest import FIXTURES
from tests.tolerance import log_softmax_bound, model_bound
from tests.sampler.probs import filtered_probs

from toolkit.engine.build import build_engine
from toolkit.backends.cpu import CpuBackend
from toolkit.engine import SamplingParams
from toolkit.sampler.sampler import Sampler
from toolkit.sampler.state import RequestSampling
from toolkit.engine.timings import NullTimer


@pytest.fixture(scope="module")
def engine():
    return build_engine(FIXTURES / "llama", device="cpu", max_context=96, max_num_batched_tokens=256)


PROMPTS = [[1, 5, 9, 13], [2, 7], [3, 3, 3, 8, 21, 4], [11]]


def run(engine, reqs, fast=True):
    """reqs: [(prompt ids, SamplingParams)] admitted together; returns (tokens per request, steps seen)."""
    engine.set_options(engine.options.with_(sampler_fast_path=fast))
    rids = {engine.add_request(ids, p): i for i, (ids, p) in enumerate(reqs)}
    toks, steps = [[] for _ in reqs], []
    while engine.has_unfinished():
        for o in engine.step():
            if o.token is not None:
                toks[rids[o.request_id]].append(o.token)
            if o.step is not None and (not steps or steps[-1] is not o.step):
                steps.append(o.step)
    engine.set_options(engine.options.with_(sampler_fast_path=True))
    return toks, steps


def test_noop_batches_fast_equals_slow(engine):
    V = engine.cfg.vocab_size
    reqs = [(ids, SamplingParams(max_tokens=12, temperature=t, seed=40 + i, ignore_eos=True))
            for i, (ids, t) in enumerate(zip(PROMPTS, [0.0, 1.0, 1.0, 0.0]))]
    fast, fsteps = run(engine, reqs, fast=True)
    slow, ssteps = run(engine, reqs, fast=False)
    assert fast == slow
    assert {s.sampler_path for s in fsteps} == {"fast"} and {s.sampler_bytes for s in fsteps} == {0}
    assert {s.sampler_path for s in ssteps} == {"slow"}
    assert all(s.sampler_why == "switched off" for s in ssteps)
    assert {s.sampler_bytes for s in ssteps if s.kind == "decode"} == {4 * 4 * V}  # 4 rows x V x fp32


def test_processing_rows_go_fast_and_fast_equals_slow(engine):
    """The default model's kind of settings (and every other processing) now take the fast path, token for token
    the slow path's; the plain rows of the same batch are untouched by them."""
    base = [(ids, SamplingParams(max_tokens=10, temperature=t, seed=7 + i, ignore_eos=True))
            for i, (ids, t) in enumerate(zip(PROMPTS[:3], [0.0, 1.0, 0.0]))]
    alone, _ = run(engine, base)
    hot = [(PROMPTS[3], SamplingParams(max_tokens=10, temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1,
                                       seed=1, ignore_eos=True)),
           (PROMPTS[0], SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3, seed=2,
                                       ignore_eos=True)),
           (PROMPTS[2], SamplingParams(max_tokens=10, temperature=1.2, min_p=0.05, frequency_penalty=0.5,
                                       presence_penalty=0.3, logit_bias={3: 2.0, 7: -5.0}, bad_words=((5,), (4, 6)),
                                       min_tokens=4, seed=3))]
    fast, fsteps = run(engine, base + hot, fast=True)
    slow, ssteps = run(engine, base + hot, fast=False)
    assert fast[:3] == alone and fast == slow
    assert {s.sampler_path for s in fsteps} == {"fast"} and {s.sampler_bytes for s in fsteps} == {0}
    assert {s.sampler_why for s in ssteps} == {"switched off"}


def test_a_vocabulary_beyond_the_fast_path_sends_the_step_slow(engine, monkeypatch):
    from toolkit.sampler import batch

    monkeypatch.setattr(batch, "VOCAB_CAP", 3)  # a vocabulary wider than the kernel's shared-memory bitmap
    reqs = [(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.0, seed=1, ignore_eos=True)),
            (PROMPTS[2], SamplingParams(max_tokens=6, temperature=0.7, repetition_penalty=1.2, seed=2,
                                        ignore_eos=True))]
    mixed, steps = run(engine, reqs)
    assert {s.sampler_path for s in steps} == {"slow"}
    assert steps[0].sampler_why == f"vocabulary of {engine.cfg.vocab_size} tokens (the fast path holds 3)"
    monkeypatch.undo()
    assert run(engine, reqs)[0] == mixed


def test_a_long_history_stays_on_the_fast_path(engine):
    """No history length sends a step slow any more: a row beyond filter_sample's shared memory (HIST_CAP entries)
    reads its history from global memory on the GPU (tests/sampler/test_gpu_fast_path.py), so only that row pays.
    Here: a penalised 80-token history, fast and slow paths drawing the same tokens."""
    prompt = [int(t) for t in np.random.default_rng(5).permutation(engine.cfg.vocab_size)[:80]]
    reqs = [(prompt, SamplingParams(max_tokens=6, temperature=0.7, repetition_penalty=1.2, seed=2, ignore_eos=True)),
            (PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.0, seed=1, ignore_eos=True))]
    fast, steps = run(engine, reqs, fast=True)
    assert {s.sampler_path for s in steps} == {"fast"}
    assert fast == run(engine, reqs, fast=False)[0]


def test_batch_invariance_of_seeded_sampling(engine):
    rng = np.random.default_rng(3)
    V = engine.cfg.vocab_size
    target = ([4, 8, 15, 16, 23], SamplingParams(max_tokens=16, temperature=0.8, top_k=20, top_p=0.9,
                                                 repetition_penalty=1.2, seed=1234, ignore_eos=True))
    alone, _ = run(engine, [target])
    others = []
    for i in range(15):
        kw = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.6, min_p=0.1),
              dict(temperature=1.3, top_k=5, frequency_penalty=0.5), dict(temperature=0.9, presence_penalty=1.0,
                                                                          logit_bias={3: 2.0})][i % 5]
        ids = rng.integers(1, V, rng.integers(1, 12)).tolist()
        others.append((ids, SamplingParams(max_tokens=int(rng.integers(4, 20)), seed=i, ignore_eos=True, **kw)))
    mixed, _ = run(engine, others[:7] + [target] + others[7:])
    assert mixed[7] == alone[0]


def test_sampler_never_writes_the_model_logits():
    be = CpuBackend()
    V, B = 1000, 6
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    before = logits.copy()
    sampler = Sampler(be, V, B, 32)
    params = [SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                             frequency_penalty=0.4, presence_penalty=0.2, logit_bias={5: 3.0}, bad_words=((9,),),
                             seed=i) for i in range(B)]
    states = [RequestSampling(p, [1, 2, 3, 9], V, i, (), p.bad_words) for i, p in enumerate(params)]
    for s in states:
        s.on_token(2)
    for fast_on in (True, False):
        sb = sampler.prepare(states, np.arange(B, dtype=np.int32), np.ones(B, bool), B, fast_on)
        assert sb.fast == fast_on
        sampler.stage(sb)
        sampler.sample(logits, sb, NullTimer())
        assert np.array_equal(logits, before)
        assert 9 not in sampler.sampled[:B].tolist()  # banned


def test_sampled_distribution_matches_filtered_probs():
    """Draws at many positions (independent noise) follow filtered_probs: a χ² test, end to end."""
    be = CpuBackend()
    V, draws = 50, 20000
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(V) * 2).astype(np.float32)
    p = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.5, seed=99)
    history = ([1, 2, 3], [4, 4])
    want = filtered_probs(row[None], [p], [history])[0]
    sampler = Sampler(be, V, 1000, 16)
    state = RequestSampling(p, history[0], V, 99)
    for t in history[1]:
        state.on_token(t)
    logits = np.repeat(row[None], 1000, axis=0)
    counts = np.zeros(V)
    for start in range(0, draws, 1000):
        sb = sampler.prepare([state] * 1000, np.arange(start, start + 1000, dtype=np.int32), np.ones(1000, bool),
                             1000, True)
        sampler.stage(sb)
        sampler.sample(logits, sb, NullTimer())
        counts += np.bincount(sampler.sampled[:1000], minlength=V)
    assert counts[want == 0].sum() == 0  # masked tokens are never drawn
    live = want > 0
    expected = want[live] * draws
    chi2 = ((counts[live] - expected) ** 2 / expected).sum()
    k = live.sum() - 1  # Wilson-Hilferty: the p = 1e-4 critical value of chi2 with k degrees of freedom
    crit = k * (1 - 2 / (9 * k) + 3.719 * math.sqrt(2 / (9 * k))) ** 3
    assert chi2 < crit, (chi2, crit)


def test_stop_strings_are_trimmed(engine):
    p = SamplingParams(max_tokens=40, seed=5, ignore_eos=True)
    full = "".join(o.text for o in engine.generate(PROMPTS[0], p))
    assert len(full) > 6
    stop = full[3:5]
    first = full.find(stop)
    outs = list(engine.generate(PROMPTS[0], SamplingParams(max_tokens=40, seed=5, ignore_eos=True, stop=(stop,))))
    assert "".join(o.text for o in outs) == full[:first]
    assert outs[-1].finish_reason == "stop"


def test_min_tokens_holds_back_eos_and_bad_words_never_appear(engine):
    eos = sorted(engine.tokenizer.eos_ids)[0]
    free = [o.token for o in engine.generate(PROMPTS[2], SamplingParams(max_tokens=30, seed=3,
                                                                        logit_bias={eos: 100.0}))]
    assert free == [eos] or free[-1:] == [eos]
    held = list(engine.generate(PROMPTS[2], SamplingParams(max_tokens=30, seed=3, min_tokens=6,
                                                           logit_bias={eos: 100.0})))
    toks = [o.token for o in held]
    assert len(toks) == 7 and eos not in toks[:6] and toks[6] == eos  # 6 tokens, then the EOS it was held from
    assert held[-1].finish_reason == "stop"
    greedy = [o.token for o in engine.generate(PROMPTS[1], SamplingParams(max_tokens=12, ignore_eos=True))]
    banned = greedy[2]
    again = [o.token for o in engine.generate(PROMPTS[1], SamplingParams(max_tokens=12, ignore_eos=True,
                                                                          bad_words=((banned,),)))]
    assert banned not in again


def test_logprobs_are_raw_log_softmax(engine):
    V = engine.cfg.vocab_size
    ids = PROMPTS[2]
    outs = list(engine.generate(ids, SamplingParams(max_tokens=3, temperature=0.7, top_k=3, seed=2, logprobs=4,
                                                    ignore_eos=True)))
    logits, decode = engine.score(ids, [o.token for o in outs[:-1]])
    rows = np.concatenate([logits[-1:], decode])
    for o, row in zip(outs, rows):
        lp = row.astype(np.float64) - row.max() - np.log(np.exp(row.astype(np.float64) - row.max()).sum())
        # generate's logits and score's are two float32 runs (other batch shapes): model_bound apart, over
        # len(ids) + 3 keys; log-softmax moves by at most twice that; then the sampler's own float32 log-softmax
        tol = 2 * model_bound(engine.cfg, len(ids) + 3, np.abs(row).max()) + log_softmax_bound(row)
        assert o.logprobs["token"] == o.token
        assert o.logprobs["logprob"] == pytest.approx(lp[o.token], abs=tol)
        assert o.logprobs["rank"] == int((row >= row[o.token]).sum())
        top = o.logprobs["top"]
        assert [t for t, _ in top] == list(np.argsort(-row, kind="stable")[:4])
        assert [v for _, v in top] == pytest.approx(lp[[t for t, _ in top]], abs=tol)
    assert len(outs) == 3 and V > 4


def test_stop_string_split_over_steps_is_held_back_and_trimmed():
    from types import SimpleNamespace

    from toolkit.engine.stops import stop_strings

    seq = SimpleNamespace(params=SimpleNamespace(stop=("\n\n", "END")), text="", held="")
    emitted = []
    for piece, want_hit in [("Hello", False), (" wor", False), ("ld\n", False), ("\nmore", True)]:
        out, hit = stop_strings(seq, piece, final=False)
        emitted.append(out)
        assert hit == want_hit
    assert "".join(emitted) == "Hello world"  # the "\n" was held back, then trimmed with its stop string
    seq = SimpleNamespace(params=SimpleNamespace(stop=("END",)), text="", held="")
    assert stop_strings(seq, "the E", final=False) == ("the ", False)  # "E" may start "END"
    assert stop_strings(seq, "N", final=True) == ("EN", False)  # the request ended: flush what was held


def test_logprobs_zero_gives_the_sampled_token_only(engine):
    outs = list(engine.generate(PROMPTS[0], SamplingParams(max_tokens=2, seed=4, logprobs=0, ignore_eos=True)))
    assert all(o.logprobs["top"] == [] and o.logprobs["logprob"] <= 0 and o.logprobs["rank"] >= 1 for o in outs)
    plain = list(engine.generate(PROMPTS[0], SamplingParams(max_tokens=2, seed=4, ignore_eos=True)))
    assert [o.token for o in plain] == [o.token for o in outs] and all(o.logprobs is None for o in plain)


def test_request_timings_say_the_sampler_path_and_fp32_bytes(engine):
    """Each request's stats (a JSONL record's `timings`): the path its tokens were sampled on, and the FP32 bytes
    materialised for its row: none on the fast path, V * 4 per token on the slow one, `mixed` across a switch."""
    V = engine.cfg.vocab_size
    p = SamplingParams(max_tokens=5, temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=3,
                       ignore_eos=True)
    for fast, path, nbytes in ((True, "fast", 0), (False, "slow", 5 * 4 * V)):
        engine.set_options(engine.options.with_(sampler_fast_path=fast))
        last = list(engine.generate(PROMPTS[0], p))[-1].stats.as_dict()
        assert (last["sampler_path"], last["sampler_fp32_bytes"]) == (path, nbytes)
    engine.set_options(engine.options.with_(sampler_fast_path=True))
    rid = engine.add_request(PROMPTS[0], p)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == rid]
        if len(outs) == 2:
            engine.set_options(engine.options.with_(sampler_fast_path=False))
    engine.set_options(engine.options.with_(sampler_fast_path=True))
    assert outs[-1].stats.sampler_path == "mixed"


@pytest.mark.parametrize("rep", [1.0, 1.3])
def test_penalty_entries_kept_sorted_as_tokens_arrive(rep):
    """The penalties' history (every distinct token of prompt ∪ output with its output count, sorted; the prompt
    only under a repetition penalty) is updated per token, never rebuilt: it must equal the rebuilt one."""
    rng = np.random.default_rng(int(rep * 10))
    prompt = rng.integers(0, 50, 40)
    st = RequestSampling(SamplingParams(repetition_penalty=rep, frequency_penalty=0.5), prompt, 64, seed=1)
    out = []
    for tok in rng.integers(0, 64, 120):
        st.on_token(int(tok))
        out.append(int(tok))
        toks, counts = np.unique(out, return_counts=True)
        want = dict(zip(toks.tolist(), counts.tolist()))
        if rep != 1.0:
            want = {**{t: 0 for t in np.unique(prompt).tolist()}, **want}
        tok, cnt = st.penalty_entries()
        assert tok.tolist() == sorted(want) and cnt.tolist() == [want[t] for t in sorted(want)]
    assert tok.dtype == cnt.dtype == np.int32 and len(st._tok) > 40  # it outgrew its first room
