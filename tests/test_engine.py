"""Engine behaviour on the CPU: stopping, context limits, and the timings every front end reads."""
import numpy as np
import pytest
from conftest import FIXTURES

from toolkit.engine import Engine
from toolkit.errors import ToolkitError
from toolkit.timings import SECTIONS


@pytest.fixture(scope="module")
def engine():
    return Engine.load(FIXTURES / "llama", device="cpu", max_context=48)


def _ids():
    return np.load(FIXTURES / "llama" / "reference.npz")["input_ids"][:20]


def test_timings_cover_each_step(engine):
    responses = list(engine.generate(_ids(), max_tokens=5, ignore_eos=True))
    assert [r.step.kind for r in responses] == ["prefill"] + ["decode"] * 4
    assert [r.step.n_tokens for r in responses] == [20, 1, 1, 1, 1]
    for r in responses:
        assert set(r.step.sections_ms) == set(SECTIONS)
        assert all(v >= 0 for v in r.step.sections_ms.values())
        covered = sum(r.step.sections_ms.values()) + r.step.detokenize_ms
        assert r.step.total_ms >= covered - 1e-6 and r.step.other_ms >= 0
        assert r.step.sections_ms["attention"] > 0 and r.step.sections_ms["mlp"] > 0
    stats = responses[-1].stats
    assert stats.prompt_tokens == 20 and stats.generated_tokens == 5 and len(stats.decode_ms) == 4
    assert stats.prefill_tps > 0 and stats.decode_tps > 0
    assert responses[-1].finish_reason == "length" and all(r.finish_reason is None for r in responses[:-1])


def test_eos_stops(engine, monkeypatch):
    first = next(engine.generate(_ids(), max_tokens=1, ignore_eos=True)).token
    third = [r.token for r in engine.generate(_ids(), max_tokens=3, ignore_eos=True)][2]
    monkeypatch.setattr(engine.tokenizer, "eos_ids", frozenset({third}))
    out = list(engine.generate(_ids(), max_tokens=10))
    assert out[0].token == first and out[-1].token == third and out[-1].finish_reason == "stop"
    assert len(out) == 3 and out[-1].stats.generated_tokens == 2  # EOS itself is not counted as text


def test_context_limits(engine):
    with pytest.raises(ToolkitError, match="context holds 48"):
        next(engine.generate(np.zeros(48, np.int32), max_tokens=1))
    with pytest.raises(ToolkitError, match="empty"):
        next(engine.generate([], max_tokens=1))
    out = list(engine.generate(np.zeros(45, np.int32), max_tokens=10, ignore_eos=True))
    # The prefill picks token 1; tokens 2-4 come from feeding positions 45, 46, 47: then the cache is full.
    assert len(out) == 4 and out[-1].finish_reason == "length"


def test_max_context_bounds():
    with pytest.raises(ToolkitError, match="--max-context must be between 2 and"):
        Engine.load(FIXTURES / "llama", device="cpu", max_context=10_000)
