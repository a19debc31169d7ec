"""config.json parsing and the RoPE tables both backends share."""
import json
import math

import numpy as np
import pytest

from toolkit.config import ModelConfig, rope_inv_freq, rope_tables
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
    np.testing.assert_allclose(inv, [10000.0 ** (-2 * i / 4) for i in range(2)], rtol=1e-6)
    cos, sin = rope_tables(cfg, 8)
    assert cos.shape == (8, 2) and cos.dtype == np.float32
    np.testing.assert_allclose(cos[5, 1], math.cos(5 * inv[1]), rtol=1e-6)
    np.testing.assert_allclose(sin[5, 0], math.sin(5.0), rtol=1e-6)


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
        assert g == pytest.approx(expect, rel=1e-5)
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
