"""config.json parsing and the RoPE tables both backends share."""
import json
import math

import numpy as np
import pytest

from tests.tolerance import U32
from toolkit.model.config import ModelConfig, rope_inv_freq, rope_tables
from toolkit.errors import ToolkitError

BASE = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def test_families_switches():
    q2 = ModelConfig.from_dict({**BASE, "model_type": "qwen2"})
    assert q2.qkv_bias and not q2.qk_norm and q2.head_dim == 4
    q3 = ModelConfig.from_dict({**BASE, "model_type": "qwen3", "head_dim": 8})
    assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 8 and q3.qkv_size == (4 + 4) * 8
    ll = ModelConfig.from_dict(BASE)
    assert not ll.qkv_bias and not ll.tie_word_embeddings and ll.num_kv_heads == 2
    mi = ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 32})
    assert mi.sliding_window == 32


def test_context_limit_and_what_a_short_context_hint_says():
    """The engine caps Mistral's context at its window, so --max-context can be raised only up to that."""
    mi = ModelConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 32})
    assert mi.context_limit == 32 and ModelConfig.from_dict(BASE).context_limit == 64
    assert mi.context_hint(16, "shorten the prompt") == "raise --max-context up to 32 or shorten the prompt"
    assert mi.context_hint(32, "shorten the prompt") == "the model's maximum is 32: shorten the prompt"
    assert mi.context_hint(16) == "raise --max-context up to 32" and mi.context_hint(32) == "the model's maximum is 32"


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ToolkitError, match="unsupported model_type 'gpt2'"):
        ModelConfig.from_dict({**BASE, "model_type": "gpt2"})
    with pytest.raises(ToolkitError, match="missing key 'hidden_size'"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "hidden_size"})
    with pytest.raises(ToolkitError, match="rope_scaling type 'yarn'"):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ToolkitError, match="config.json: no such file"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ToolkitError, match="cannot read JSON"):
        ModelConfig.from_dir(tmp_path)


def test_rope_default_frequencies_and_tables():
    cfg = ModelConfig.from_dict({**BASE, "rope_theta": 10000.0})
    inv = rope_inv_freq(cfg)
    # float32 exponents 0, 0.5 (exact), powf (1 ulp = 2u), the float32 division (u): 3u relative
    np.testing.assert_allclose(inv, [10000.0 ** (-2 * i / 4) for i in range(2)], rtol=3 * U32, atol=0)
    cos, sin = rope_tables(cfg, 8)
    assert cos.shape == (8, 2) and cos.dtype == np.float32
    # the float32 angle pos * inv (u |angle|, times |sin| <= 1), then float32 cos / sin (2 ulp = 4u, NumPy's bound)
    np.testing.assert_allclose(cos[5, 1], math.cos(5 * inv[1]), rtol=0, atol=U32 * (5 * inv[1] + 4))
    np.testing.assert_allclose(sin[5, 0], math.sin(5.0), rtol=0, atol=4 * U32)  # angle 5 * 1.0: exact


def test_llama3_scaling_matches_the_published_rule():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    cfg = ModelConfig.from_dict({**BASE, "hidden_size": 64, "num_attention_heads": 2,
                                 "rope_theta": 500000.0, "rope_scaling": scaling})
    base = rope_inv_freq(ModelConfig.from_dict({**BASE, "hidden_size": 64, "num_attention_heads": 2,
                                                "rope_theta": 500000.0}))
    got = rope_inv_freq(cfg)
    for f, g in zip(base, got):  # the three bands of Llama 3.1's rule, written out per frequency
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4:
            expect = f
        elif wavelen > 64 / 1:
            expect = f / 8
        else:
            smooth = (64 / wavelen - 1) / (4 - 1)
            expect = (1 - smooth) * f / 8 + smooth * f
        # float32 throughout: wavelen (2u), r = 64 / wavelen (3u: |dr| <= 12u at r <= 4 in the blend band), so
        # smooth = (r - 1) / 3 within 6u; the blend's terms <= f / 8 and f round ~2.5u f; smooth's error moves it by
        # (7/8) f * 6u: <= 8u f. The other bands are f or f / 8: exact.
        assert abs(g - expect) <= 8 * U32 * f
    assert (got < base).any() and (got == base).any()  # some bands change, some don't


def test_from_dir_reads_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "tie_word_embeddings": True}))
    assert ModelConfig.from_dir(tmp_path).tie_word_embeddings


def test_transformers5_rope_parameters_layout():
    cfg = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None
    scaled = ModelConfig.from_dict({**BASE, "rope_parameters": {
        "rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
    assert scaled.rope_theta == 5e5 and scaled.rope_scaling["factor"] == 8.0


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
BAD_VALUES = [  # (changes to BASE, the field the one-line error must name, what else it says)
    ({"num_hidden_layers": None}, "num_hidden_layers", "got null"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers", "positive integer, got 2.5"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers", "positive integer, got 2.0"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers", 'got "2"'),
    ({"num_hidden_layers": True}, "num_hidden_layers", "got true"),
    ({"num_hidden_layers": -1}, "num_hidden_layers", "got -1"),
    ({"num_attention_heads": 0}, "num_attention_heads", "got 0"),
    ({"num_attention_heads": [4]}, "num_attention_heads", "got [4]"),
    ({"num_key_value_heads": 3}, "num_attention_heads", "multiple of num_key_value_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads", "got 0"),
    ({"hidden_size": 0}, "hidden_size", "got 0"),
    ({"hidden_size": 2}, "hidden_size", "head_dim 0"),
    ({"hidden_size": 20}, "hidden_size", "head_dim 5"),
    ({"hidden_size": 2**40}, "hidden_size", "got 1099511627776"),
    ({"head_dim": 7}, "head_dim", "even"),
    ({"head_dim": False}, "head_dim", "got false"),
    ({"vocab_size": 0}, "vocab_size", "got 0"),
    ({"vocab_size": 1e400}, "vocab_size", "got Infinity"),
    ({"intermediate_size": {}}, "intermediate_size", "got {}"),
    ({"max_position_embeddings": -64}, "max_position_embeddings", "got -64"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps", "finite positive number, got NaN"),
    ({"rms_norm_eps": 0}, "rms_norm_eps", "got 0"),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps", 'got "1e-5"'),
    ({"rope_theta": float("inf")}, "rope_theta", "got Infinity"),
    ({"rope_theta": -1.0}, "rope_theta", "got -1.0"),
    ({"rope_theta": 1e300}, "rope_theta", "at most 3.403e+38, got 1e+300"),
    ({"rope_theta": True}, "rope_theta", "got true"),
    ({"rope_parameters": {"rope_theta": float("-inf")}}, "rope_parameters.rope_theta", "got -Infinity"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings", 'true or false, got "false"'),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings", "got 1"),
    ({"rope_scaling": "llama3"}, "rope_scaling", "an object or null"),
    ({"rope_scaling": [8.0]}, "rope_scaling", "an object or null"),
    ({"rope_parameters": 1e6}, "rope_parameters", "an object or null"),
    ({"rope_scaling": {**LLAMA3_SCALING, "factor": None}}, "rope_scaling.factor", "got null"),
    ({"rope_scaling": {**LLAMA3_SCALING, "factor": float("nan")}}, "rope_scaling.factor", "got NaN"),
    ({"rope_scaling": {k: v for k, v in LLAMA3_SCALING.items() if k != "low_freq_factor"}},
     "'rope_scaling.low_freq_factor'", "missing key"),
    ({"rope_scaling": {**LLAMA3_SCALING, "high_freq_factor": 1.0}}, "rope_scaling.high_freq_factor", "larger"),
    ({"torch_dtype": 16}, "torch_dtype", "a string, got 16"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window", "got 0"),
]


@pytest.mark.parametrize("change, field, detail", BAD_VALUES, ids=[str(c) for c, _, _ in BAD_VALUES])
def test_bad_values_name_the_file_and_field(tmp_path, change, field, detail):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **change}))
    with pytest.raises(ToolkitError) as e:
        ModelConfig.from_dir(tmp_path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'config.json'}: ")
    assert field in message and detail in message, message


@pytest.mark.parametrize("text", ["[1, 2, 3]", '"llama"', "42", "null", "true", "NaN", "[" * 100000 + "]" * 100000,
                                  "", "{\"model_type\": \"llama\""])
def test_a_config_that_is_not_an_object(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ToolkitError, match="config.json: (must hold a JSON object|cannot read JSON)"):
        ModelConfig.from_dir(tmp_path)


def test_a_utf8_bom_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text("\ufeff" + json.dumps(BASE), encoding="utf-8")
    assert ModelConfig.from_dir(tmp_path).vocab_size == 32


def test_a_config_that_is_not_utf8(tmp_path):
    (tmp_path / "config.json").write_bytes(json.dumps(BASE).encode().replace(b"llama", b"ll\xffma"))
    with pytest.raises(ToolkitError, match="config.json: cannot read JSON"):
        ModelConfig.from_dir(tmp_path)


UNSUPPORTED = [
    ({"mlp_bias": True}, "mlp_bias true is not supported"),
    ({"model_type": "qwen3", "mlp_bias": True}, "mlp_bias true"),
    ({"attention_bias": True}, "attention_bias true is not supported for llama"),
    ({"model_type": "qwen3", "attention_bias": True}, "attention_bias true is not supported for qwen3"),
    ({"model_type": "mistral", "attention_bias": True}, "mistral (it has no attention biases)"),
    ({"attention_bias": "yes"}, "attention_bias must be true or false"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh'"),
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"hidden_act": ["silu"]}, "hidden_act must be a string"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling type 'linear'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic'"),
    ({"rope_scaling": {"factor": 2.0}}, "rope_scaling type None"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_parameters type 'yarn'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e6}}, "rope_parameters type 'longrope'"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 32}, "use_sliding_window true"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, 'quantization_config ("gptq")'),
    ({"model_type": "gemma"}, "unsupported model_type 'gemma'"),
    ({"model_type": None}, "unsupported model_type None"),
]


@pytest.mark.parametrize("change, expect", UNSUPPORTED, ids=[str(c) for c, _ in UNSUPPORTED])
def test_unsupported_features_are_refused(change, expect):
    with pytest.raises(ToolkitError) as e:
        ModelConfig.from_dict({**BASE, **change}, source="m/config.json")
    assert str(e.value).startswith("m/config.json: ") and expect in str(e.value) and "\n" not in str(e.value)


def test_what_transformers_accepts_still_loads():
    ok = [{"hidden_act": "swish"}, {"mlp_bias": False, "attention_bias": False}, {"attention_bias": None},
          {"model_type": "qwen2", "attention_bias": True}, {"model_type": "qwen2", "attention_bias": False},
          {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 32,
           "layer_types": ["full_attention", "full_attention"]},
          {"num_key_value_heads": None, "head_dim": None, "rope_scaling": None, "rope_theta": None},
          {"rope_scaling": {"rope_type": "default"}}, {"rope_theta": 500000}, {"quantization_config": None},
          {"model_type": "mistral", "sliding_window": None}]
    for change in ok:
        cfg = ModelConfig.from_dict({**BASE, **change})
        assert cfg.qkv_bias == (cfg.model_type == "qwen2")  # transformers' Qwen2 always has q/k/v biases


@pytest.mark.parametrize("folder", ["tests/fixtures/llama", "tests/fixtures/llama3", "tests/fixtures/mistral",
                                    "tests/fixtures/qwen2", "tests/fixtures/qwen3", "weights/tiny-pd",
                                    "../shared/models/stories260K"])
def test_every_shipped_config_loads(folder):
    from tests.conftest import ROOT
    path = ROOT / folder
    if not path.is_dir():
        pytest.skip(f"{folder} is absent")
    assert ModelConfig.from_dir(path).num_layers >= 2
