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
from tests.tolerance import model_bound

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


def score_with_plan(name, monkeypatch, spy, **forced):
    """Score fixture `name`'s prompt and decode tokens one token a step (as decode steps feed them), first with the
    CPU's own plan (BLAS and the plain kernels), then with `forced` plan fields, as a GPU plan names them, run on
    the CPU twins, with the backend op `spy` counting its calls. Returns (ref, plain logits, forced prompt logits,
    forced decode logits, calls, layers)."""
    folder = FIXTURES / name
    ref = np.load(folder / "reference.npz")
    engine = build_engine(folder, device="cpu", max_context=64, warmup=False)
    ids, decode_ids = ref["input_ids"], ref["generated_ids"][:-1]
    plain = np.concatenate(engine.score(ids, decode_ids, chunk=1))
    model, be, calls = engine.runner.model, engine.runner.model.be, []
    op = getattr(be, spy)
    monkeypatch.setattr(be, spy, lambda *a: (calls.append(1), op(*a)))
    own = model.plan
    monkeypatch.setattr(model, "plan", lambda step, options: dataclasses.replace(own(step, options), **forced))
    prompt, decode = engine.score(ids, decode_ids, chunk=1)
    return ref, plain, prompt, decode, calls, len(model.w.layers)


# GPU plans on the CPU twins. Each twin computes its kernel's function in fp32; those marked `same` take the very
# same float operations as the plain path (the projection twins are the BLAS product; gemv_swiglu's and
# gemm_wg_swiglu's are that product and silu_mul), so their logits are bit-identical. The others sum in another
# order (the norm split over the o projection and the scale after gate_up; K in slices; decode attention in the
# tensor-core kernel's tiles), and are held to model_bound (tests/tolerance.py): two float32 runs of the model's
# accumulations, rounded differently.
# Both plans are also held to the model-level bar against transformers' fp32 logits, 1e-4.
PLANS = {
    "gemv": (dict(qkv="gemv", o="gemv", gate_up="gemv", swiglu="epilogue", down="gemv"), "gemv_swiglu", True),
    "skinny": (dict(qkv="skinny", o="skinny", gate_up="skinny", swiglu="epilogue", down="skinny"),
               "gemm_skinny_swiglu", True),
    "wg": (dict(gate_up="wg", swiglu="epilogue"), "gemm_wg_swiglu", True),
    "skinny_rope": (dict(qkv="skinny_rope"), "gemm_skinny_rope", True),
    "gemv_rope": (dict(qkv="gemv_rope"), "gemv_rope", True),
    "skinny_norm": (dict(o="skinny_norm", swiglu="scaled"), "gemm_skinny_norm", False),
    "slices": (dict(down="slices", down_slices=2), "add_rmsnorm_partials", False),
    "tc_attention": (dict(decode_attention="tc", prefill_attention="tc"), "decode_attention_tc", False),
    "stream_attention": (dict(decode_attention="stream"), "decode_attention_stream", False),
}


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("path", list(PLANS))
def test_gpu_plan_on_the_twins(name, path, monkeypatch):
    forced, spy, same = PLANS[path]
    if path.endswith("_rope") and name == "qwen3":
        pytest.skip("q/k norms need the whole head: the plan never puts RoPE in the qkv GEMM's epilogue there")
    ref, plain, prompt, decode, calls, layers = score_with_plan(name, monkeypatch, spy, **forced)
    steps = len(decode) if spy.startswith("decode_attention") else len(prompt) + len(decode)
    assert len(calls) == layers * steps  # (the partials' adds: layers 1.. and the final norm, not layer 0's)
    got = np.concatenate([prompt, decode])
    if same:
        np.testing.assert_array_equal(got, plain)
    else:  # two float32 runs over 48 keys at most (32 prompt + 16 decode positions)
        assert np.abs(got - plain).max() <= model_bound(ModelConfig.from_dir(FIXTURES / name), len(got),
                                                        np.abs(plain).max())
    assert np.abs(prompt - ref["prompt_logits"]).max() <= 1e-4
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4
