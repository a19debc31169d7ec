"""Context buckets on the CPU: each step carries the max_seq_len its decode attention plan is sized for, a power
of two >= its longest decode row (toolkit/engine/runner.py), and the model passes exactly that to the backend.
The graphs-on/off side runs on the GPU (tests/test_gpu_engine.py)."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.engine.build import build_engine
from toolkit.engine import SamplingParams
from toolkit.engine.runner import MIN_CONTEXT_BUCKET, context_buckets
from toolkit.engine.sequence import Sequence


@pytest.fixture(scope="module")
def tiny():
    return build_engine(shape="tiny", device="cpu", max_context=2048, warmup=False)


def test_context_buckets():
    assert MIN_CONTEXT_BUCKET == 256  # decode_attention_tc's one-split limit (4 tiles of 64 keys)
    assert context_buckets(4096) == (256, 512, 1024, 2048, 4096)
    assert context_buckets(640) == (256, 512, 640)  # the top bucket is max_context itself: no plan past it
    assert context_buckets(4225) == (256, 512, 1024, 2048, 4096, 4225)
    assert context_buckets(512) == (256, 512) and context_buckets(256) == (256,) and context_buckets(2) == (2,)
    assert context_buckets(100, smallest=16) == (16, 32, 64, 100)


@pytest.mark.parametrize("max_context", [48, 512, 640, 2048, 4225])
def test_bucket_is_the_smallest_that_holds_the_longest_decode_row(tiny, max_context, monkeypatch):
    monkeypatch.setattr(tiny.runner, "context_buckets", context_buckets(max_context))
    for longest in range(0, max_context + 1):
        b = tiny.runner.context_bucket(longest)
        assert b >= longest and b <= max_context
        assert b == max_context or (b >= MIN_CONTEXT_BUCKET and b & (b - 1) == 0)  # powers of two below the top
        assert b == min(max_context, MIN_CONTEXT_BUCKET) or tiny.runner.context_bucket(b // 2) < b  # smallest


def _seq(n_tokens, num_computed, block_size):
    s = Sequence(list(range(1, n_tokens + 1)), SamplingParams())
    s.num_computed = num_computed
    s.block_table = list(range(-(-n_tokens // block_size)))
    return s


@pytest.mark.parametrize("decode_len, want", [(200, 256), (300, 512), (512, 512), (513, 1024), (1100, 2048),
                                               (2048, 2048)])
def test_prepare_sizes_the_step_for_its_decode_rows_only(tiny, decode_len, want):
    run = tiny.runner
    bs = run.block_size
    decode = _seq(decode_len, decode_len - 1, bs)  # feeds its last token: seq_len decode_len
    prompt = _seq(1900, 0, bs)  # a long prompt chunk in the same step: prefill attention, not in the bucket
    batch = run.prepare([decode, prompt], [1, 1900], 1)
    assert batch.kind == "mixed" and batch.context_bucket == want
    assert run.stager.stage(batch).context_bucket == want  # carried into the staged step the model reads
    assert run.prepare([prompt], [1900], 0).context_bucket == MIN_CONTEXT_BUCKET  # no decode rows: the smallest
    if want > MIN_CONTEXT_BUCKET:  # a plan shorter than a decode row is refused before anything launches
        with pytest.raises(ValueError, match="context bucket"):
            run.stager.stage(dataclasses.replace(batch, context_bucket=want // 2))


def test_the_model_sizes_decode_attention_by_the_steps_bucket(tiny, monkeypatch):
    be = tiny.runner.model.be
    seen = []

    def spy(q, k, v, tables, lens, bs, scale, out, max_seq_len):
        seen.append((max_seq_len, int(lens.max())))
        type(be).decode_attention(be, q, k, v, tables, lens, bs, scale, out, max_seq_len)

    monkeypatch.setattr(be, "decode_attention", spy)
    prompt = np.random.default_rng(0).integers(1, tiny.cfg.vocab_size, 509).tolist()
    outs = list(tiny.generate(prompt, SamplingParams(max_tokens=6, ignore_eos=True)))
    assert [o.step.kind for o in outs] == ["prefill"] + ["decode"] * 5
    layers = tiny.cfg.num_layers
    # decode steps at 510..514 tokens of context: the 512 bucket up to 512, then 1024 (not max_context, 2048)
    want = [(512, 510), (512, 511), (512, 512), (1024, 513), (1024, 514)]
    assert seen == [w for w in want for _ in range(layers)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 700), st.integers(1, 64)), min_size=1, max_size=12), st.booleans(),
       st.randoms(use_true_random=False))
def test_prepare_lays_out_every_row_as_its_sequence_says(tiny, rows, all_decode, rnd):
    """prepare's arrays against a row-by-row reference, for pure decode steps (their own fast path) and for steps
    with prompt chunks, with block tables of scattered ids and different widths."""
    run = tiny.runner
    bs = run.block_size
    seqs, num_new = [], []
    for n_tokens, chunk in rows:
        n = 1 if all_decode else min(chunk, n_tokens)
        s = Sequence([rnd.randrange(1000) for _ in range(n_tokens)], SamplingParams())
        s.num_computed = n_tokens - n
        s.block_table = rnd.sample(range(5000), -(-n_tokens // bs))
        seqs.append(s)
        num_new.append(n)
    order = sorted(range(len(seqs)), key=lambda i: num_new[i] != 1)  # decodes first, as the scheduler orders them
    seqs, num_new = [seqs[i] for i in order], [num_new[i] for i in order]
    nd = sum(1 for n in num_new if n == 1) if all_decode else 0
    batch = run.prepare(seqs, num_new, nd)
    ids, pos, slots, qsl = [], [], [], [0]
    for s, n in zip(seqs, num_new):
        for p in range(s.num_computed, s.num_computed + n):
            ids.append(s.token_ids[p])
            pos.append(p)
            slots.append(s.block_table[p // bs] * bs + p % bs)
        qsl.append(qsl[-1] + n)
    assert batch.input_ids.tolist() == ids and batch.positions.tolist() == pos
    assert batch.slot_mapping.tolist() == slots and batch.query_start_loc.tolist() == qsl
    assert batch.seq_lens.tolist() == [s.num_computed + n for s, n in zip(seqs, num_new)]
    width = max(len(s.block_table) for s in seqs)
    assert batch.block_tables.shape == (len(seqs), width) and batch.block_tables.dtype == np.int32
    for row, s in zip(batch.block_tables.tolist(), seqs):
        assert row == s.block_table + [0] * (width - len(s.block_table))
    assert all(a.dtype == np.int32 for a in (batch.input_ids, batch.positions, batch.slot_mapping,
                                              batch.query_start_loc, batch.seq_lens))
