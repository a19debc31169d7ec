"""Read the tensors of a Hugging Face checkpoint with `safetensors`, no PyTorch.

A model folder holds either one `model.safetensors` or shards listed in
`model.safetensors.index.json`. Tensors come back as NumPy arrays in their
stored dtype (bf16 via ml_dtypes); the backend converts them once, straight
into its own buffers. Every failure names the file and the tensor, so a user
with a broken download knows which file to fetch again.

Non-finite weights (NaN or inf) are counted as each tensor is read and reported
as one `warning:` line after loading (`nonfinite_warning`), not refused: a NaN in
an embedding row no prompt uses (padding rows) is harmless, and a NaN that matters
shows up in the logits, where the engine ends that request with an error. The
count reads the exponent bits in chunks (about 5 ms for the 27 MB default model,
against 25 ms for NumPy's isfinite on bfloat16), so it is always on.
"""
import json
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors returns)
import numpy as np
from safetensors import safe_open

from toolkit.errors import ToolkitError

# All-ones exponent = inf or NaN, per stored dtype: (same-size unsigned view, exponent mask).
_EXPONENT = {"float32": (np.uint32, 0x7F800000), "float16": (np.uint16, 0x7C00), "bfloat16": (np.uint16, 0x7F80)}
_CHUNK = 1 << 24  # elements per pass: bounds the temporaries for a multi-GB embedding


def count_nonfinite(arr: np.ndarray) -> int:
    """How many NaN/inf values a float32/float16/bfloat16 array holds."""
    utype, mask = _EXPONENT[arr.dtype.name]
    bits, mask = np.ascontiguousarray(arr).reshape(-1).view(utype), utype(mask)
    return sum(int(np.count_nonzero((bits[i:i + _CHUNK] & mask) == mask)) for i in range(0, bits.size, _CHUNK))


def _read_index(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as e:
        raise ToolkitError(f"{index}: cannot read the shard index ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
        raise ToolkitError(f"{index}: weight_map must map tensor names to file names")
    return weight_map


class Checkpoint:
    """Name -> (file, lazy tensor) over one or many safetensors files."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        self.nonfinite: dict[str, tuple[int, int]] = {}  # tensor -> (non-finite values, all values)
        single = self.model_dir / "model.safetensors"
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = _read_index(index)
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            weight_map, files = None, ["model.safetensors"]
        else:
            raise ToolkitError(f"{self.model_dir}: no model.safetensors or model.safetensors.index.json")
        self._handles, self._file_of = {}, {}  # file -> safetensors handle; tensor -> file
        for name in files:
            path = self.model_dir / name
            if not path.is_file():
                raise ToolkitError(f"{path}: no such file (listed in model.safetensors.index.json)")
            try:
                path.open("rb").close()  # safetensors reports a file it may not read as "No such file or directory"
            except OSError as e:
                raise ToolkitError(f"{path}: cannot be read ({e.strerror or e})") from None
            try:
                handle = safe_open(str(path), framework="numpy")
                keys = list(handle.keys())
            except Exception as e:
                raise ToolkitError(f"{path}: not a readable safetensors file ({str(e)[:200]})") from None
            self._handles[name] = handle
            self._file_of.update(dict.fromkeys(keys, name))
        if weight_map is not None:
            for key, name in weight_map.items():
                if self._file_of.get(key) != name:
                    raise ToolkitError(f"{self.model_dir / name}: tensor {key!r} listed in the index is missing")

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def file_of(self, name: str) -> Path:
        return self.model_dir / self._file_of.get(name, "model.safetensors")

    def missing(self, name: str) -> ToolkitError:
        where = "any shard" if len(self._handles) > 1 else str(self.file_of(name))
        return ToolkitError(f"{where}: missing tensor {name!r}")

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor `name`, checked against the `shape` the config implies."""
        if name not in self._file_of:
            raise self.missing(name)
        try:
            arr = self._handles[self._file_of[name]].get_tensor(name)
        except Exception as e:
            raise ToolkitError(f"{self.file_of(name)}: cannot read tensor {name!r} ({str(e)[:200]})") from None
        if tuple(arr.shape) != tuple(shape):
            raise ToolkitError(
                f"{self.file_of(name)}: tensor {name!r} has shape {tuple(arr.shape)}, "
                f"config.json implies {tuple(shape)}")
        if arr.dtype.name not in _EXPONENT:
            raise ToolkitError(
                f"{self.file_of(name)}: tensor {name!r} has dtype {arr.dtype.name}; "
                "supported: float32, float16, bfloat16")
        bad = count_nonfinite(arr)
        if bad:
            self.nonfinite[name] = (bad, arr.size)
        return arr

    def nonfinite_warning(self, shown: int = 3) -> str | None:
        """One line naming the tensors with NaN/inf values read so far, or None."""
        if not self.nonfinite:
            return None
        items = list(self.nonfinite.items())
        listed = ", ".join(f"{name!r} ({bad} of {size})" for name, (bad, size) in items[:shown])
        more = f" and {len(items) - shown} more" if len(items) > shown else ""
        return (f"warning: {self.model_dir}: NaN or inf weights in {len(items)} tensor(s): {listed}{more}; "
                "outputs may be NaN")
