"""The decoder: one forward pass over a chunk of tokens, on any backend.

    ids -> embedding -> N x [ RMSNorm -> QKV -> RoPE/KV-cache -> attention -> O
                              (+ residual) RMSNorm -> gate_up -> SiLU*up -> down ]
        -> (+ residual) RMSNorm -> lm_head -> logits

The residual stream `h` is updated in place: each `add_rmsnorm` first adds the
previous block's output into `h`, then normalises it for the next block, so
the add and the norm cost one pass over memory instead of two.

Prefill (many tokens) and decode (one token) run the same code; only the
attention kernel differs, and the backend picks it from the chunk length.
All scratch buffers are allocated once for the largest chunk and reused, so a
decode step allocates nothing (a prerequisite for CUDA-graph capture).
"""
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig, rope_tables
from .weights import Weights


@dataclass
class Scratch:
    """Activations for a chunk of up to `rows` tokens; views for T tokens via `view(T)`."""
    h: object  # residual stream [T, H]
    x: object  # normalised input of the current block [T, H]
    qkv: object  # [T, (Hq + 2Hkv) * D]
    q: object  # [T, Hq, D]
    attn: object  # [T, Hq, D]
    attn_out: object  # [T, H]
    gate_up: object  # [T, 2I]
    act: object  # [T, I]
    mlp_out: object  # [T, H]

    def view(self, T: int) -> "Scratch":
        return Scratch(**{k: v[:T] for k, v in vars(self).items()})


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend, max_context: int, max_chunk: int):
        self.cfg, self.w, self.be = cfg, weights, backend
        self.max_context, self.max_chunk = max_context, max_chunk
        be, c = backend, cfg
        self.scale = float(c.head_dim) ** -0.5
        cos, sin = rope_tables(c, max_context)
        self.cos, self.sin = be.from_host_f32(cos), be.from_host_f32(sin)
        # KV cache: per layer [Hkv, S, D], preallocated for the whole context.
        kv_shape = (c.num_kv_heads, max_context, c.head_dim)
        self.k_cache = [be.zeros(kv_shape) for _ in range(c.num_layers)]
        self.v_cache = [be.zeros(kv_shape) for _ in range(c.num_layers)]
        self.scratch = self._alloc_scratch(max_chunk)
        self._views = {1: self.scratch.view(1)}  # decode reuses one set of views
        self.logits = be.empty((1, c.vocab_size), np.float32)

    def _alloc_scratch(self, rows: int) -> Scratch:
        be, c = self.be, self.cfg
        H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
        return Scratch(
            h=be.empty((rows, H)), x=be.empty((rows, H)), qkv=be.empty((rows, c.qkv_size)),
            q=be.empty((rows, c.num_heads, D)), attn=be.empty((rows, c.num_heads, D)),
            attn_out=be.empty((rows, H)), gate_up=be.empty((rows, 2 * I)),
            act=be.empty((rows, I)), mlp_out=be.empty((rows, H)))

    def forward(self, ids: np.ndarray, start_pos: int, timer, all_logits: bool = False):
        """Run len(ids) tokens at positions start_pos.. and return fp32 logits on the device.

        Returns [1, V] logits for the last token, or [T, V] for every token when
        `all_logits` (tests and perplexity; allocated per call, not for the hot path).
        """
        T = len(ids)
        assert 1 <= T <= self.max_chunk and start_pos + T <= self.max_context
        be, c, w = self.be, self.cfg, self.w
        s = self._views.get(T) or self.scratch.view(T)
        ids_dev = be.begin_step(start_pos, ids)
        timer.start()
        be.embedding(ids_dev, w.embed, s.h)
        timer.lap("embedding")
        eps = c.rms_norm_eps
        for i, L in enumerate(w.layers):
            # Attention block. Layer 0 has no previous MLP output to add into h.
            be.add_rmsnorm(None if i == 0 else s.mlp_out, s.h, L.input_norm, eps, s.x)
            be.linear(s.x, L.qkv, s.qkv)
            be.rope_qkv(s.qkv, L.qkv_bias, L.q_norm, L.k_norm, eps, self.cos, self.sin,
                        c.num_heads, c.num_kv_heads, s.q, self.k_cache[i], self.v_cache[i])
            be.attention(s.q, self.k_cache[i], self.v_cache[i], self.scale, s.attn)
            be.linear(s.attn.reshape(T, -1), L.o_proj, s.attn_out)
            timer.lap("attention")
            # MLP block: h += attention output, then SwiGLU on its norm.
            be.add_rmsnorm(s.attn_out, s.h, L.post_norm, eps, s.x)
            be.linear(s.x, L.gate_up, s.gate_up)
            be.silu_mul(s.gate_up, s.act)
            be.linear(s.act, L.down, s.mlp_out)
            timer.lap("mlp")
        be.add_rmsnorm(s.mlp_out, s.h, w.final_norm, eps, s.x)
        if all_logits:
            logits = be.empty((T, c.vocab_size), np.float32)
            be.linear(s.x, w.lm_head, logits)
        else:  # only the last position picks the next token
            logits = self.logits
            be.linear(s.x[T - 1:T], w.lm_head, logits)
        timer.lap("lm_head")
        return logits
