"""Checkpoint loading: single files, shards, and one-line errors naming file and tensor."""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from toolkit.checkpoint import Checkpoint
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
