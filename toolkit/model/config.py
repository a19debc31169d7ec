"""Model configuration: the few numbers from config.json the decoder needs.

Every supported family (llama, mistral, qwen2, qwen3) is the same decoder
with small switches: q/k/v bias (qwen2), per-head q/k RMSNorm (qwen3), an
explicit head_dim (qwen3, some llama), llama3-style RoPE frequency scaling,
and tied or untied embeddings. Reading them into one flat dataclass keeps
decoder.py free of per-family branches.

config.json is read strictly: every value is type-checked (sizes are positive
integers, never floats or bools; eps and theta finite positive numbers), and a
feature the decoder does not implement is refused rather than ignored. Every
error is one line naming the file and the field. What is refused, and why:
  * attention_bias: true, except on qwen2 (whose q/k/v biases it describes):
    llama and qwen3 would add an o_proj bias too, and mistral has no biases.
  * mlp_bias: true (gate/up/down biases, llama only in transformers).
  * hidden_act other than silu (or its alias swish), the only activation these
    families ship with.
  * rope scaling other than llama3 (linear, dynamic, yarn, longrope, ...).
  * sliding-window layers on qwen2/qwen3 (use_sliding_window, layer_types).
  * quantized checkpoints (quantization_config).
Keys transformers ignores for a family (qwen2's attention_bias) are ignored here too.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.errors import ToolkitError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
ACTIVATIONS = ("silu", "swish")  # transformers' ACT2FN maps both to SiLU
LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
MAX_SIZE = 2**31 - 1  # no real model comes near; keeps index arithmetic in int32/int64 range
FLOAT32_MAX = float(np.finfo(np.float32).max)
_ABSENT = object()


def _show(value) -> str:
    """A JSON value as config.json spells it, cut short for an error line."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Typed reads from one JSON object; every error names the file and the field."""

    def __init__(self, d: dict, source: str, prefix: str = ""):
        self.d, self.source, self.prefix = d, source, prefix

    def fail(self, key: str, message: str):
        raise ToolkitError(f"{self.source}: {self.prefix}{key} {message}")

    def _typed(self, key: str, default, ok, expected: str):
        """The value if ok(value); a missing or null key gives `default`, or fails when there is none."""
        value = self.d.get(key)
        if value is None:
            if default is _ABSENT:
                if key not in self.d:
                    raise ToolkitError(f"{self.source}: missing key {self.prefix + key!r}")
                self.fail(key, f"must be {expected}, got null")
            return default
        if not ok(value):
            self.fail(key, f"must be {expected}, got {_show(value)}")
        return value

    def integer(self, key: str, default=_ABSENT):
        value = self._typed(key, default, lambda v: type(v) is int and v > 0, "a positive integer")
        if value is not None and value > MAX_SIZE:
            self.fail(key, f"must be at most {MAX_SIZE}, got {value}")
        return value

    def number(self, key: str, default=_ABSENT):
        ok = lambda v: (type(v) is int and v > 0) or (type(v) is float and math.isfinite(v) and v > 0)
        value = self._typed(key, default, ok, "a finite positive number")
        if value is not None and value > FLOAT32_MAX:  # RoPE tables and norms are computed in float32
            self.fail(key, f"must be at most {FLOAT32_MAX:.4g}, got {value}")
        return value if value is None else float(value)

    def flag(self, key: str, default: bool) -> bool:
        return self._typed(key, default, lambda v: type(v) is bool, "true or false")

    def text(self, key: str, default=_ABSENT):
        return self._typed(key, default, lambda v: type(v) is str, "a string")

    def obj(self, key: str) -> dict | None:
        return self._typed(key, None, lambda v: type(v) is dict, "an object or null")


def _refuse_unsupported(f: _Fields, mt: str):
    """One line for the first feature config.json asks for that the decoder does not implement."""
    quant = f.obj("quantization_config")
    if quant is not None:
        f.fail("quantization_config", f"({_show(quant.get('quant_method'))}) is not supported: "
                                      "quantized checkpoints cannot be loaded")
    if f.flag("mlp_bias", False):
        f.fail("mlp_bias", "true is not supported (no biases on gate/up/down_proj)")
    if f.flag("attention_bias", False) and mt != "qwen2":
        f.fail("attention_bias", "true is not supported for " + (
            "mistral (it has no attention biases)" if mt == "mistral" else f"{mt} (it adds an o_proj bias)"))
    act = f.text("hidden_act", "silu")
    if act not in ACTIVATIONS:
        f.fail("hidden_act", f"{act!r} is not supported (supported: silu)")
    if mt in ("qwen2", "qwen3"):
        if f.flag("use_sliding_window", False):
            f.fail("use_sliding_window", "true is not supported (sliding-window attention)")
        types = f.d.get("layer_types") or []
        if not isinstance(types, list) or any(t != "full_attention" for t in types):
            f.fail("layer_types", f"{_show(types)} is not supported (only full_attention layers)")


def _rope(f: _Fields) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) from transformers 4's top-level keys or 5's rope_parameters."""
    rope = f.obj("rope_parameters") or {}
    scaling, key = f.obj("rope_scaling"), "rope_scaling"
    if scaling is None and ("factor" in rope or rope.get("rope_type", rope.get("type")) not in (None, "default")):
        scaling, key = rope, "rope_parameters"
    theta = f.number("rope_theta", None)
    if theta is None:
        theta = _Fields(rope, f.source, "rope_parameters.").number("rope_theta", 10000.0)
    if scaling is None:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ToolkitError(f"{f.source}: unsupported {key} type {kind!r} (supported: llama3)")
    g = _Fields(scaling, f.source, key + ".")
    values = {name: g.number(name) for name in LLAMA3_FIELDS}
    if values["high_freq_factor"] <= values["low_freq_factor"]:
        g.fail("high_freq_factor", f"({values['high_freq_factor']}) must be larger than low_freq_factor "
                                   f"({values['low_freq_factor']})")
    return theta, {"rope_type": "llama3", **values}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # qwen2
    qk_norm: bool  # qwen3
    rope_scaling: dict | None = None  # llama3 frequency scaling, or None
    torch_dtype: str = "float32"  # the dtype the checkpoint says it stores
    # Mistral v0.1 attends to a 4096-token sliding window; the engine caps the context
    # there instead of implementing a second attention pattern for one family.
    sliding_window: int | None = None

    @property
    def qkv_size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def context_limit(self) -> int:
        """The longest context the engine runs this model with: its positions, or Mistral's sliding window."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)

    def context_hint(self, context: int, remedy: str | None = None) -> str:
        """What a user can do when `context` tokens are too few: raise --max-context only while the model
        allows more, else `remedy` (shorten the prompt, lower --max-tokens) is all there is."""
        limit = self.context_limit
        if context < limit:
            return f"raise --max-context up to {limit}" + (f" or {remedy}" if remedy else "")
        return f"the model's maximum is {limit}" + (f": {remedy}" if remedy else "")

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        if not isinstance(d, dict):
            raise ToolkitError(f"{source}: must hold a JSON object, got {_show(d)}")
        mt = d.get("model_type")
        if mt not in SUPPORTED:
            raise ToolkitError(
                f"{source}: unsupported model_type {mt!r} (supported: {', '.join(SUPPORTED)})")
        f = _Fields(d, source)
        _refuse_unsupported(f, mt)
        hidden, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
        kv_heads = f.integer("num_key_value_heads", heads)
        if heads % kv_heads:
            f.fail("num_attention_heads", f"({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
        if d.get("head_dim") is None:
            head_dim = hidden // heads
            if head_dim < 2 or head_dim % 2:
                f.fail("hidden_size", f"/ num_attention_heads gives head_dim {head_dim}; RoPE needs an even one")
        else:
            head_dim = f.integer("head_dim")
            if head_dim % 2:
                f.fail("head_dim", f"must be even for RoPE, got {head_dim}")
        theta, scaling = _rope(f)
        return cls(
            model_type=mt,
            vocab_size=f.integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=f.integer("intermediate_size"),
            num_layers=f.integer("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=f.number("rms_norm_eps", 1e-6),
            rope_theta=theta,
            max_position_embeddings=f.integer("max_position_embeddings", 4096),
            tie_word_embeddings=f.flag("tie_word_embeddings", False),
            qkv_bias=(mt == "qwen2"),  # transformers' Qwen2 always has q/k/v biases and ignores attention_bias
            qk_norm=(mt == "qwen3"),
            rope_scaling=scaling,
            torch_dtype=f.text("torch_dtype", None) or f.text("dtype", "float32"),
            sliding_window=f.integer("sliding_window", None) if mt == "mistral" else None,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ToolkitError(f"{path}: no such file (is --model a Hugging Face model folder?)")
        try:
            d = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (Windows editors) is harmless
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
            raise ToolkitError(f"{path}: cannot read JSON ({str(e)[:200]})") from None
        return cls.from_dict(d, source=str(path))


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies, exactly as transformers computes them (float32)."""
    d = cfg.head_dim
    # HF: 1 / theta ** (arange(0, d, 2, int64).float() / d), computed in float32.
    exponents = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponents)).astype(np.float32)
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, and blend the band
    # between them, so long contexts stay in the range the model saw in training.
    factor, low, high, old_ctx = (s[k] for k in LLAMA3_FIELDS)  # floats (_Fields.number)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: ModelConfig, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_positions, head_dim/2] in float32, one row per position.

    Computed on the host once so both backends rotate with bit-identical angles
    (HF forms pos * inv_freq in float32 and takes cos/sin in float32).
    """
    inv = rope_inv_freq(cfg)
    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
