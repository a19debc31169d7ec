"""A small, self-contained PyTorch Llama used only to train the default model (inference is the toolkit's job).

It computes exactly what Hugging Face's LlamaForCausalLM computes for the same weights, so the exported folder
means the same thing to transformers and to the toolkit:
  x = embed[ids]
  per layer:  h = x + o_proj(attn(rope(q_proj(norm1(x))), rope(k_proj(...)), v_proj(...)))
              x = h + down_proj(silu(gate_proj(norm2(h))) * up_proj(norm2(h)))
  logits = norm(x) @ embed.T                                  (tied embeddings, no biases anywhere)
RMSNorm: w * (x / sqrt(mean(x^2) + eps)), computed in fp32 like HF. RoPE: HF's rotate-half convention (the first
and second halves of a head are the pairs), inv_freq = theta^(-2i/D). GQA: query head h reads kv head
h // (n_heads // n_kv_heads). Dropout only in training (residual branches and attention probabilities).
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 8192
    hidden_size: int = 384
    intermediate_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    dropout: float = 0.0

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)          # HF order: round to the input dtype, then scale


def rope_tables(cfg, device):
    """cos, sin: [S, D] fp32 (each half repeated, as HF builds them: emb = cat(freqs, freqs))."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float().to(device) / d))
    pos = torch.arange(cfg.max_position_embeddings, device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x: [B, heads, T, D]; cos/sin: [T, D]. out = x*cos + rotate_half(x)*sin, rotate_half = cat(-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d, self.p = cfg.num_attention_heads, cfg.num_key_value_heads, d, cfg.dropout
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv                  # GQA: each kv head serves `rep` consecutive query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Llama(nn.Module):
    """Module names follow HF ("model.layers.N.self_attn.q_proj.weight" etc. with the "model." prefix added
    at export), so export is a rename-free copy."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        cos, sin = rope_tables(cfg, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        """GPT-2 style: N(0, 0.02); the projections that write into the residual stream scaled by
        1/sqrt(2 * layers) so the residual's variance does not grow with depth."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.num_hidden_layers) if name.endswith(("o_proj.weight",
                                                                                       "down_proj.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids):
        """ids: [B, T] int64 -> logits [B, T, V] (positions 0..T-1: every window starts at position 0)."""
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def hf_state_dict(self):
        """Parameters under their Hugging Face names (no lm_head.weight: tied to model.embed_tokens.weight)."""
        return {"model." + k: v for k, v in self.state_dict().items()}


def count_parameters(cfg):
    """Exact parameter count from the config (tied embeddings counted once)."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * d * 2 + h * cfg.num_key_value_heads * d * 2
    layer = attn + 3 * h * i + 2 * h
    return cfg.vocab_size * h + cfg.num_hidden_layers * layer + h
