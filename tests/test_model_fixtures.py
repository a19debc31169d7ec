"""The CPU backend against logits Hugging Face transformers computed (tests/fixtures).

Every family (llama, llama3 rope scaling, mistral fp16 shards, qwen2 bf16 with
bias, qwen3 q/k norm): max |dlogit| <= 1e-4 over all 32 prompt positions and 16
decode steps through the paged cache, and identical greedy tokens.
"""
import dataclasses

import numpy as np
import pytest
from conftest import FIXTURES
from reference_run import FIXTURE_NAMES, greedy_tokens, reference_logits

from toolkit.assembly import build_engine
from toolkit.config import ModelConfig


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_cpu_matches_transformers(name):
    folder = FIXTURES / name
    ref = np.load(folder / "reference.npz")
    engine = build_engine(folder, device="cpu", max_context=64)
    prompt, decode = reference_logits(engine, ref)
    assert np.abs(prompt - ref["prompt_logits"]).max() <= 1e-4
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4
    assert greedy_tokens(engine, ref["input_ids"], 17) == ref["generated_ids"].tolist()


def test_llama3_scaling_is_exercised():
    """Without the llama3 frequency rule the fixture's logits must visibly differ."""
    folder = FIXTURES / "llama3"
    ref = np.load(folder / "reference.npz")
    cfg = dataclasses.replace(ModelConfig.from_dir(folder), rope_scaling=None)
    engine = build_engine(folder, device="cpu", max_context=64, config=cfg, warmup=False)
    assert np.abs(engine.logits(ref["input_ids"]) - ref["prompt_logits"]).max() > 1e-3


@pytest.mark.parametrize("chunk", [5, 16, 1])
def test_chunked_prefill_equals_one_shot(chunk):
    folder = FIXTURES / "qwen3"
    ref = np.load(folder / "reference.npz")
    engine = build_engine(folder, device="cpu", max_context=64, warmup=False)
    np.testing.assert_allclose(engine.logits(ref["input_ids"], chunk=chunk), ref["prompt_logits"], atol=1e-4)
