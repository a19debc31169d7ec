"""The decoder's weights, renamed from Hugging Face tensors and fused for speed.

Two fusions happen once at load time, so every step runs fewer, larger GEMMs:
  * q_proj, k_proj, v_proj -> one `qkv` matrix [(Hq + 2*Hkv) * D, hidden]
  * gate_proj, up_proj     -> one `gate_up` matrix [2 * intermediate, hidden]
Weights keep HF's [out_features, in_features] layout: y = x @ W.T.
`to_backend` turns each host array into the backend's array (fp32 on the CPU,
the compute dtype on the GPU), so a model streams from disk to device once.
"""
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .checkpoint import Checkpoint
from .config import ModelConfig


@dataclass
class LayerWeights:
    input_norm: Any
    qkv: Any
    qkv_bias: Any  # None unless qwen2
    q_norm: Any  # None unless qwen3
    k_norm: Any
    o_proj: Any
    post_norm: Any
    gate_up: Any
    down: Any


@dataclass
class Weights:
    embed: Any
    layers: list[LayerWeights]
    final_norm: Any
    lm_head: Any  # the same array as `embed` when embeddings are tied

    def nbytes(self) -> int:
        """Bytes one decode step reads: every matrix once (embedding: one row, ignored)."""
        seen, total = set(), 0
        arrays = [self.final_norm, self.lm_head]
        for L in self.layers:
            arrays += [v for v in vars(L).values() if v is not None]
        for a in arrays:
            if id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total


def load_weights(ckpt: Checkpoint, cfg: ModelConfig, to_backend: Callable[[np.ndarray], Any]) -> Weights:
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * D, cfg.num_kv_heads * D

    def get(name, shape):
        return ckpt.get(name, shape)

    embed = to_backend(get("model.embed_tokens.weight", (cfg.vocab_size, H)))
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        qkv = np.concatenate([
            get(p + "self_attn.q_proj.weight", (q_out, H)),
            get(p + "self_attn.k_proj.weight", (kv_out, H)),
            get(p + "self_attn.v_proj.weight", (kv_out, H))])
        bias = None
        if cfg.qkv_bias:
            bias = to_backend(np.concatenate([
                get(p + "self_attn.q_proj.bias", (q_out,)),
                get(p + "self_attn.k_proj.bias", (kv_out,)),
                get(p + "self_attn.v_proj.bias", (kv_out,))]))
        q_norm = k_norm = None
        if cfg.qk_norm:
            q_norm = to_backend(get(p + "self_attn.q_norm.weight", (D,)))
            k_norm = to_backend(get(p + "self_attn.k_norm.weight", (D,)))
        gate_up = np.concatenate([get(p + "mlp.gate_proj.weight", (I, H)),
                                  get(p + "mlp.up_proj.weight", (I, H))])
        layers.append(LayerWeights(
            input_norm=to_backend(get(p + "input_layernorm.weight", (H,))),
            qkv=to_backend(qkv),
            qkv_bias=bias,
            q_norm=q_norm,
            k_norm=k_norm,
            o_proj=to_backend(get(p + "self_attn.o_proj.weight", (H, q_out))),
            post_norm=to_backend(get(p + "post_attention_layernorm.weight", (H,))),
            gate_up=to_backend(gate_up),
            down=to_backend(get(p + "mlp.down_proj.weight", (H, I))),
        ))
    final_norm = to_backend(get("model.norm.weight", (H,)))
    if cfg.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = to_backend(get("lm_head.weight", (cfg.vocab_size, H)))
    return Weights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


def random_checkpoint(cfg: ModelConfig, dtype: str, seed: int = 0):
    """A stand-in for Checkpoint with random weights of the right shapes (for `bench`).

    Scales follow a typical init (std 0.02, norms near 1) so activations stay in a
    realistic range and bf16 arithmetic behaves as it does on trained weights.
    """
    import ml_dtypes

    rng = np.random.default_rng(seed)
    np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]

    class _Random:
        def get(self, name, shape):
            if name.endswith(("norm.weight", "layernorm.weight")):
                a = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            else:
                a = 0.02 * rng.standard_normal(shape, dtype=np.float32)
            return a.astype(np_dtype)

    return _Random()
