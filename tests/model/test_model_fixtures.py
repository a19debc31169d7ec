"""The CPU backend against logits Hugging Face transformers computed (tests/fixtures).

Every family (llama, llama3 rope scaling, mistral fp16 shards, qwen2 bf16 with
bias, qwen3 q/k norm): max |dlogit| <= 1e-4 over all 32 prompt positions and 16
decode steps through the paged cache, and identical greedy tokens.
"""
import dataclasses

import numpy as np
import pytest
from tests.conftest import FIXTURES
from tests.reference_run import FIXTURE_NAMES, greedy_tokens, reference_logits

from toolkit.engine.build import build_engine
from toolkit.model.config import ModelConfig


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


def score_forced(name, monkeypatch, patch, **forced):
    """Score fixture `name`'s prompt and decode tokens one token a step (as decode steps feed them), first plainly,
    then with `forced` options (the engine turns these off on the CPU) after patch(backend, calls) wrapped the op
    under test to record its calls. Returns (ref, plain logits, forced prompt logits, forced decode logits, calls,
    layers)."""
    folder = FIXTURES / name
    ref = np.load(folder / "reference.npz")
    engine = build_engine(folder, device="cpu", max_context=64, warmup=False)
    ids, decode_ids = ref["input_ids"], ref["generated_ids"][:-1]
    plain = np.concatenate(engine.score(ids, decode_ids, chunk=1))
    calls = []
    patch(engine.runner.model.be, calls)
    options = engine.effective_options().with_(**forced)
    monkeypatch.setattr(engine, "effective_options", lambda: options)
    prompt, decode = engine.score(ids, decode_ids, chunk=1)
    return ref, plain, prompt, decode, calls, len(engine.runner.model.w.layers)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_fused_gemv_path(name, monkeypatch):
    """The one-token-step path that folds RMSNorm, the residual adds and SwiGLU into the GEMVs (Model.forward's
    `fused` branch, gemv_fused), run on the CPU twins: every token fed alone, as decode steps are, gives the same
    logits as the unfused path, bit for bit, and the transformers reference within 1e-4."""
    def patch(be, calls):
        monkeypatch.setattr(be, "gemv_fused", lambda *a, **k: (calls.append(a[3]), type(be).gemv_fused(*a, **k)))

    ref, plain, prompt, decode, calls, layers = score_forced(name, monkeypatch, patch, small_batch_gemv=True,
                                                             fused_gemv=True)
    assert calls.count("swiglu_add") == layers * (len(prompt) + len(decode))
    np.testing.assert_array_equal(np.concatenate([prompt, decode]), plain)
    assert np.abs(prompt - ref["prompt_logits"]).max() <= 1e-4
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4


def test_gemv_swiglu_path(monkeypatch):
    """One-token steps with small_batch_gemv (fused_gemv off) take Model.forward's gate_up + SwiGLU in one op
    (linear_swiglu -> the gemv_swiglu twin): the same logits as the GEMM + silu_mul path, bit for bit."""
    import kernels.gemv
    import toolkit.backends.cpu as cpu

    def patch(be, calls):
        monkeypatch.setattr(cpu, "gemv_swiglu", lambda *a: (calls.append(1), kernels.gemv.gemv_swiglu(*a)))

    _, plain, prompt, decode, calls, layers = score_forced("qwen2", monkeypatch, patch, small_batch_gemv=True,
                                                           fused_gemv=False, gemv_swiglu=True, mlp_kernel=False)
    assert len(calls) == layers * (len(prompt) + len(decode))
    np.testing.assert_array_equal(np.concatenate([prompt, decode]), plain)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_mlp_kernel_path(name, monkeypatch):
    """One-token steps with mlp_kernel take Model.forward's one-op MLP block (decode_mlp's twin: both residual
    adds inside, so the next RMSNorm adds nothing): the same logits as the plain path, bit for bit, and within 1e-4
    of transformers."""
    def patch(be, calls):
        monkeypatch.setattr(be, "decode_mlp", lambda *a: (calls.append(1), type(be).decode_mlp(*a)))

    ref, plain, prompt, decode, calls, layers = score_forced(name, monkeypatch, patch, small_batch_gemv=True,
                                                             fused_gemv=False, mlp_kernel=True)
    assert len(calls) == layers * (len(prompt) + len(decode))
    np.testing.assert_array_equal(np.concatenate([prompt, decode]), plain)
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_rope_in_attention_path(name, monkeypatch):
    """Decode steps with rope_in_attention (Model.forward passes rope_qkv's inputs to decode_attention instead of
    launching rope_qkv; qwen2 has the qkv bias, qwen3 the q/k norms), on the CPU twins: the same logits, bit for
    bit, and within 1e-4 of transformers."""
    def patch(be, calls):
        monkeypatch.setattr(be, "decode_attention", lambda *a, **k: (calls.append(a[-1] is not None),
                                                                     type(be).decode_attention(be, *a, **k)))
        monkeypatch.setattr(be, "rope_qkv", lambda *a: (calls.append("launch"), type(be).rope_qkv(*a)))

    ref, plain, prompt, decode, calls, layers = score_forced(name, monkeypatch, patch, rope_in_attention=True)
    assert calls.count(True) == layers * len(decode)  # every decode step's layers
    np.testing.assert_array_equal(np.concatenate([prompt, decode]), plain)
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4
