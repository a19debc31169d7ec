"""Checkpoint loading: single files, shards, one-line errors naming file and tensor, and the load-time checks."""
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from toolkit.model.checkpoint import Checkpoint
from toolkit.errors import ToolkitError


def test_single_file_keeps_stored_dtype(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_file({"a": a.astype(ml_dtypes.bfloat16), "b": a.astype(np.float16)}, str(tmp_path / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    assert ck.get("a", (2, 3)).dtype.name == "bfloat16"
    np.testing.assert_array_equal(ck.get("b", (2, 3)).astype(np.float32), a)
    assert "a" in ck and "zzz" not in ck


def test_shards_via_index(tmp_path):
    save_file({"x": np.ones(2, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"y": np.zeros(3, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ck = Checkpoint(tmp_path)
    assert ck.get("y", (3,)).sum() == 0 and ck.file_of("x").name == "model-00001-of-00002.safetensors"


def test_errors(tmp_path):
    with pytest.raises(ToolkitError, match="no model.safetensors"):
        Checkpoint(tmp_path)
    save_file({"w": np.ones((2, 2), np.float32), "i": np.ones(2, np.int64)}, str(tmp_path / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    with pytest.raises(ToolkitError, match=r"model.safetensors: missing tensor 'v'"):
        ck.get("v", (2,))
    with pytest.raises(ToolkitError, match=r"tensor 'w' has shape \(2, 2\), config.json implies \(3, 2\)"):
        ck.get("w", (3, 2))
    with pytest.raises(ToolkitError, match="dtype int64"):
        ck.get("i", (2,))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with pytest.raises(ToolkitError, match="gone.safetensors: no such file"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("index", ['{"weight_map": ["x"]}', '{"weight_map": {"x": 3}}', '{"weight_map": {"x": ""}}',
                                   '["weight_map"]', '{"weight_map": null}', "{}", '{"weight_map": {"x": "a.safe'])
def test_bad_shard_index(tmp_path, index):
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ToolkitError, match="model.safetensors.index.json: (cannot read the shard index|weight_map)"):
        Checkpoint(tmp_path)


def test_shard_index_not_utf8(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_bytes(b'{"weight_map": {"\xff": "a"}}')
    with pytest.raises(ToolkitError, match="cannot read the shard index"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_nonfinite_values_are_counted_and_reported_in_one_line(tmp_path, dtype):
    bad = np.array([1.0, np.nan, np.inf, -np.inf, -0.0, 3.0], np.float32).astype(dtype)
    info = ml_dtypes.finfo(dtype)
    edge = np.array([info.max, -info.max, info.smallest_subnormal, 0], dtype)
    save_file({"bad": bad, "edge": edge, "ok": np.ones(4, dtype)}, str(tmp_path / "model.safetensors"))
    ck = Checkpoint(tmp_path)
    ck.get("ok", (4,))
    ck.get("edge", (4,))
    assert ck.nonfinite_warning() is None
    ck.get("bad", (6,))
    assert ck.nonfinite == {"bad": (3, 6)}
    line = ck.nonfinite_warning()
    assert line.startswith("warning: ") and "'bad' (3 of 6)" in line and "\n" not in line


def test_nonfinite_count_in_chunks(monkeypatch):
    import toolkit.model.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "_CHUNK", 7)
    a = np.zeros((10, 10), ml_dtypes.bfloat16)
    a[3, 4] = a[9, 9] = np.nan
    a[0, 0] = -np.inf
    assert checkpoint.count_nonfinite(a) == 3 and checkpoint.count_nonfinite(a[:, :5]) == 2


# --- at load, through build_engine (the one place an engine is assembled) ------------------------------------

def _copy(tmp_path, name="llama"):
    from tests.conftest import FIXTURES

    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def _edit_tensors(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _build(folder):
    from toolkit.engine.build import build_engine

    return build_engine(folder, device="cpu", max_context=32, warmup=False)


def test_leftover_tensors_are_refused_naming_them(tmp_path):
    folder = _copy(tmp_path)
    _edit_tensors(folder, lambda t: t.update({"model.layers.0.mlp.down_proj.bias": np.zeros(16, np.float32)}))
    with pytest.raises(ToolkitError, match=r"model.safetensors: 1 tensor\(s\) a llama model .* does not use: "
                                           r"'model.layers.0.mlp.down_proj.bias' \(unsupported feature"):
        _build(folder)
    _edit_tensors(folder, lambda t: t.update({f"model.layers.{i}.self_attn.o_proj.bias": np.zeros(16, np.float32)
                                              for i in range(2)} | {"model.extra_norm.weight": np.ones(16, np.float32)}))
    with pytest.raises(ToolkitError, match=r"4 tensor\(s\) .*: 'model.extra_norm.weight', .* and 1 more"):
        _build(folder)


def test_qkv_bias_tensors_on_llama_are_leftovers(tmp_path):
    folder = _copy(tmp_path)
    _edit_tensors(folder, lambda t: t.update({"model.layers.1.self_attn.q_proj.bias": np.zeros(16, np.float32)}))
    with pytest.raises(ToolkitError, match="'model.layers.1.self_attn.q_proj.bias'"):
        _build(folder)


def test_harmless_extras_load(tmp_path):
    """transformers skips rotary inv_freq buffers, and lm_head.weight when it is tied to the embedding."""
    folder = _copy(tmp_path, "llama3")  # tied embeddings
    def add(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    _edit_tensors(folder, add)
    assert _build(folder).cfg.tie_word_embeddings


def test_missing_tensor_is_named_before_loading(tmp_path):
    folder = _copy(tmp_path)
    _edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ToolkitError, match=r"model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        _build(folder)


def test_tokenizer_larger_than_the_embedding_is_refused_at_load(tmp_path):
    folder = _copy(tmp_path)  # tokenizer ids 0..287, embedding 288 rows
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 280}))
    def shrink(t):
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:280].copy()
        t["lm_head.weight"] = t["lm_head.weight"][:280].copy()
    _edit_tensors(folder, shrink)
    with pytest.raises(ToolkitError, match=r"tokenizer.json: the tokenizer has token ids up to 287 but the model's "
                                           r"embedding has 280 rows"):
        _build(folder)


def test_fewer_tokens_than_embedding_rows_is_normal(tmp_path):
    from tests.conftest import FIXTURES
    from toolkit.text.tokenizer import Tokenizer

    assert Tokenizer.from_dir(FIXTURES / "qwen2").id_limit < 288  # qwen2's embedding has 288 rows
    assert _build(FIXTURES / "qwen2").tokenizer is not None


def test_bos_id_outside_the_embedding_is_refused(tmp_path):
    folder = _copy(tmp_path, "qwen2")  # no bos_token in tokenizer_config: config.json's bos_token_id decides
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 300}))
    with pytest.raises(ToolkitError, match="bos_token_id 300 is outside the model's embedding \\(288 rows\\)"):
        _build(folder)


def test_nan_weights_load_with_one_warning_line(tmp_path, capsys):
    folder = _copy(tmp_path)
    def poison(t):
        t["model.norm.weight"][3] = np.nan
        t["model.layers.1.mlp.down_proj.weight"][0, :2] = np.inf
    _edit_tensors(folder, poison)
    assert _build(folder) is not None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "2 tensor(s)" in err[0]
    assert "'model.norm.weight' (1 of 16)" in err[0] and "'model.layers.1.mlp.down_proj.weight' (2 of 512)" in err[0]
