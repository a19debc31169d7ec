"""Model configuration: the few numbers from config.json the decoder needs.

Every supported family (llama, mistral, qwen2, qwen3) is the same decoder
with small switches: q/k/v bias (qwen2), per-head q/k RMSNorm (qwen3), an
explicit head_dim (qwen3, some llama), llama3-style RoPE frequency scaling,
and tied or untied embeddings. Reading them into one flat dataclass keeps
model.py free of per-family branches.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ToolkitError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


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

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ToolkitError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ToolkitError(f"head_dim {self.head_dim} must be even for RoPE")

    @property
    def qkv_size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        mt = d.get("model_type")
        if mt not in SUPPORTED:
            raise ToolkitError(
                f"{source}: unsupported model_type {mt!r} (supported: {', '.join(SUPPORTED)})")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            # transformers 5 writes RoPE settings under "rope_parameters"; 4.x used top-level keys.
            rope = d.get("rope_parameters") or {}
            scaling = d.get("rope_scaling") or (rope if "factor" in rope else None)
            if scaling is not None:
                kind = scaling.get("rope_type", scaling.get("type"))
                if kind == "default":
                    scaling = None
                elif kind != "llama3":
                    raise ToolkitError(
                        f"{source}: unsupported rope_scaling type {kind!r} (supported: llama3)")
            return cls(
                model_type=mt,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                qkv_bias=bool(d.get("attention_bias", mt == "qwen2")),
                qk_norm=(mt == "qwen3"),
                rope_scaling=scaling,
                torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
                sliding_window=(int(d["sliding_window"]) if mt == "mistral" and d.get("sliding_window")
                                else None),
            )
        except KeyError as e:
            raise ToolkitError(f"{source}: missing key {e.args[0]!r}") from None

    @classmethod
    def from_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ToolkitError(f"{path}: no such file (is --model a Hugging Face model folder?)")
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ToolkitError(f"{path}: cannot read JSON ({e})") from None
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
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
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
