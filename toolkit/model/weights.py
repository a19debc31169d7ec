"""The decoder's weights, renamed from Hugging Face tensors and fused for speed.

Two fusions happen once at load time, so every step runs fewer, larger GEMMs:
  * q_proj, k_proj, v_proj -> one `qkv` matrix [(Hq + 2*Hkv) * D, hidden]
  * gate_proj, up_proj     -> one `gate_up` matrix [2 * intermediate, hidden]
Weights keep HF's [out_features, in_features] layout: y = x @ W.T.
`to_backend` turns each host array into the backend's array (fp32 on the CPU,
the compute dtype on the GPU), so a model streams from disk to device once.
Before anything is read, the checkpoint's tensor names are checked against what
the config needs: a missing one is an error, and so is a leftover one (see
check_tensor_names), since ignoring it would silently run a different model.
"""
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from toolkit.model.checkpoint import Checkpoint
from toolkit.model.config import ModelConfig
from toolkit.errors import ToolkitError


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
        arrays = [self.final_norm, self.lm_head] + [v for L in self.layers for v in vars(L).values() if v is not None]
        return sum({id(a): a.nbytes for a in arrays}.values())  # an array held twice (tied lm_head) counts once


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor this config reads, with the shape it implies (HF names, [out, in] layout)."""
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * D, cfg.num_kv_heads * D
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, H), "model.norm.weight": (H,)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (q_out, H), p + "self_attn.k_proj.weight": (kv_out, H),
            p + "self_attn.v_proj.weight": (kv_out, H), p + "self_attn.o_proj.weight": (H, q_out),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)})
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                           p + "self_attn.v_proj.bias": (kv_out,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, H)
    return shapes


def check_tensor_names(ckpt: Checkpoint, cfg: ModelConfig, shapes: dict, shown: int = 3):
    """Before reading anything: every tensor the config needs is there, and nothing is left over.

    A leftover tensor is a feature this decoder would silently drop (an MLP or o_proj bias, an extra
    norm) or a config.json that does not describe these weights, so it is refused, naming a few.
    """
    for name in shapes:
        if name not in ckpt:
            raise ckpt.missing(name)
    # Not leftovers, as transformers also skips them: old rotary-frequency buffers, and a tied lm_head.
    extra = [n for n in ckpt.names() if n not in shapes and not n.endswith("rotary_emb.inv_freq")
             and not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
    if extra:
        listed = ", ".join(repr(n) for n in extra[:shown])
        more = f" and {len(extra) - shown} more" if len(extra) > shown else ""
        raise ToolkitError(f"{ckpt.file_of(extra[0])}: {len(extra)} tensor(s) a {cfg.model_type} model with this "
                           f"config.json does not use: {listed}{more} (unsupported feature or mismatched config?)")


def load_weights(ckpt: Checkpoint, cfg: ModelConfig, to_backend: Callable[[np.ndarray], Any]) -> Weights:
    shapes = expected_tensors(cfg)
    if isinstance(ckpt, Checkpoint):
        check_tensor_names(ckpt, cfg, shapes)

    def load(*names):  # the named tensors on the backend; several are stacked in order into one matrix
        arrays = [ckpt.get(n, shapes[n]) for n in names]
        return to_backend(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))

    embed = load("model.embed_tokens.weight")
    layers = []
    for i in range(cfg.num_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        # The keywords keep the order tensors have always been read in: nonfinite_warning lists them in it, and
        # random_checkpoint draws them in it (a seed's weights stay the same).
        layers.append(LayerWeights(
            qkv=load(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            qkv_bias=load(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias") if cfg.qkv_bias else None,
            q_norm=load(a + "q_norm.weight") if cfg.qk_norm else None,
            k_norm=load(a + "k_norm.weight") if cfg.qk_norm else None,
            gate_up=load(m + "gate_proj.weight", m + "up_proj.weight"),
            input_norm=load(p + "input_layernorm.weight"),
            o_proj=load(a + "o_proj.weight"),
            post_norm=load(p + "post_attention_layernorm.weight"),
            down=load(m + "down_proj.weight")))
    return Weights(embed=embed, layers=layers, final_norm=load("model.norm.weight"),
                   lm_head=embed if cfg.tie_word_embeddings else load("lm_head.weight"))


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
