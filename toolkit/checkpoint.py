"""Read the tensors of a Hugging Face checkpoint with `safetensors`, no PyTorch.

A model folder holds either one `model.safetensors` or shards listed in
`model.safetensors.index.json`. Tensors come back as NumPy arrays in their
stored dtype (bf16 via ml_dtypes); the backend converts them once, straight
into its own buffers. Every failure names the file and the tensor, so a user
with a broken download knows which file to fetch again.
"""
import json
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors returns)
import numpy as np
from safetensors import safe_open

from .errors import ToolkitError


class Checkpoint:
    """Name -> (file, lazy tensor) over one or many safetensors files."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        single = self.model_dir / "model.safetensors"
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError) as e:
                raise ToolkitError(f"{index}: cannot read the shard index ({e})") from None
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            weight_map, files = None, ["model.safetensors"]
        else:
            raise ToolkitError(
                f"{self.model_dir}: no model.safetensors or model.safetensors.index.json")
        self._handles = {}
        self._file_of = {}
        for name in files:
            path = self.model_dir / name
            if not path.is_file():
                raise ToolkitError(f"{path}: no such file (listed in model.safetensors.index.json)")
            try:
                handle = safe_open(str(path), framework="numpy")
            except Exception as e:
                raise ToolkitError(f"{path}: not a readable safetensors file ({e})") from None
            self._handles[name] = handle
            for key in handle.keys():
                self._file_of[key] = name
        if weight_map is not None:
            for key, name in weight_map.items():
                if self._file_of.get(key) != name:
                    raise ToolkitError(f"{self.model_dir / name}: tensor {key!r} listed in the index is missing")

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def file_of(self, name: str) -> Path:
        return self.model_dir / self._file_of.get(name, "model.safetensors")

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor `name`, checked against the `shape` the config implies."""
        if name not in self._file_of:
            where = "any shard" if len(self._handles) > 1 else str(self.file_of(name))
            raise ToolkitError(f"{where}: missing tensor {name!r}")
        try:
            arr = self._handles[self._file_of[name]].get_tensor(name)
        except Exception as e:
            raise ToolkitError(f"{self.file_of(name)}: cannot read tensor {name!r} ({e})") from None
        if tuple(arr.shape) != tuple(shape):
            raise ToolkitError(
                f"{self.file_of(name)}: tensor {name!r} has shape {tuple(arr.shape)}, "
                f"config.json implies {tuple(shape)}")
        if arr.dtype.name not in ("float32", "float16", "bfloat16"):
            raise ToolkitError(
                f"{self.file_of(name)}: tensor {name!r} has dtype {arr.dtype.name}; "
                "supported: float32, float16, bfloat16")
        return arr
