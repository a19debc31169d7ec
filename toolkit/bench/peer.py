"""The PyTorch peer for `bench`: a gpt-fast-style decoder of the same shape, random weights.

gpt-fast (pytorch-labs/gpt-fast, model.py and generate.py) is the reference for how fast plain
PyTorch decodes: a static KV cache, so the decode step has fixed shapes, compiled with
torch.compile(mode="reduce-overhead"), which fuses the small ops with Inductor and replays the
step from a CUDA graph. This file rebuilds that model for any `ModelConfig` (llama, qwen2 with
q/k/v bias, qwen3 with per-head q/k RMSNorm, GQA, tied or untied lm_head), so `bench` can time it
in the same process as our engine and report every speed as a ratio from one run.

How it maps onto gpt-fast:
- `Transformer`/`TransformerBlock`/`Attention`/`FeedForward` -> `_Model`/`_Block`, with the same
  fused weights (`wqkv`: q, k and v in one GEMM; `w13`: gate and up in one GEMM; `wo`, `w2`) and
  RMSNorm in fp32.
- `KVCache`: a static `[max_batch, Hkv, max_seq_len, D]` buffer per layer, written in place.
  gpt-fast's `k_cache[:, :, input_pos] = k` shares one position across the batch; here each
  sequence has its own (ragged batches, as our engine serves), so the write indexes (row, head,
  position) -- an `index_put_` where `index_copy_` would need one index list for the batch.
- Decode attention reads the static cache under a boolean mask (key position <= query position)
  through SDPA with `enable_gqa=True`, where gpt-fast repeat_interleaves K/V to the query heads.
- `decode_one_token` -> `_decode_step`: one token per sequence plus the greedy argmax, compiled
  with mode="reduce-overhead", fullgraph=True, dynamic=False. Prefill runs eager, gpt-fast's
  default. gpt-fast sizes its cache to prompt + new tokens per generate() call; we allocate once
  and attend the positions a test needs rounded up to 64, one compiled graph per (batch, window).
Deliberate differences, neutral or in the peer's favour: RoPE is rotate_half over
`toolkit.model.config.rope_tables` (llama3 scaling included) rather than gpt-fast's interleaved complex
form, at the same cost; prefill attends its own K/V with `is_causal=True` (flash) instead of the
whole cache through a mask, and computes the lm_head for the last token only.

    python -m toolkit bench --shape qwen2.5-0.5b --batch 1,32 --prefill 4096 --peer torch
"""
import statistics
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the peer is optional; `bench` checks torch_available() first
    torch = None

from toolkit.model.config import ModelConfig, rope_tables

WINDOW_ROUND = 64  # decode attends ceil((prompt + steps) / 64) * 64 cache positions
_Module = torch.nn.Module if torch is not None else object


def torch_available(device: str | None = None) -> bool:
    """Whether torch imports (and, for device="cuda", sees a GPU)."""
    return torch is not None and (device != "cuda" or torch.cuda.is_available())


def _rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def _rope(x, cos, sin):  # x [B, T, H, D]; cos/sin [B, T, 1, D/2] fp32
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class _Block(_Module):
    def __init__(self, cfg: ModelConfig, param, cache_shape, dtype, device):
        super().__init__()
        self.cfg = cfg
        self.attention_norm, self.ffn_norm = param(cfg.hidden_size, one=True), param(cfg.hidden_size, one=True)
        self.wqkv = param(cfg.qkv_size, cfg.hidden_size)
        self.bqkv = param(cfg.qkv_size) if cfg.qkv_bias else None
        self.q_norm = param(cfg.head_dim, one=True) if cfg.qk_norm else None
        self.k_norm = param(cfg.head_dim, one=True) if cfg.qk_norm else None
        self.wo = param(cfg.hidden_size, cfg.num_heads * cfg.head_dim)
        self.w13 = param(2 * cfg.intermediate_size, cfg.hidden_size)
        self.w2 = param(cfg.hidden_size, cfg.intermediate_size)
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape, dtype=dtype, device=device), persistent=False)

    def forward(self, x, cos, sin, input_pos, window, prefill, row):
        c, (B, T, _) = self.cfg, x.shape
        hq, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = F.linear(_rms_norm(x, self.attention_norm, c.rms_norm_eps), self.wqkv, self.bqkv)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(B, T, hq, d), k.view(B, T, hkv, d), v.view(B, T, hkv, d)
        if self.q_norm is not None:
            q, k = _rms_norm(q, self.q_norm, c.rms_norm_eps), _rms_norm(k, self.k_norm, c.rms_norm_eps)
        q, k, v = (t.transpose(1, 2) for t in (_rope(q, cos, sin), _rope(k, cos, sin), v))  # [B, H, T, D]
        # Write into the buffer itself: through a slice or a view, Inductor copies the cache in and out.
        at = ((row + torch.arange(B, device=x.device))[:, None, None],
              torch.arange(hkv, device=x.device)[:, None], input_pos[:, None, :])  # [B, Hkv, T]
        self.k_cache.index_put_(at, k)
        self.v_cache.index_put_(at, v)
        if prefill:  # from position 0: attend this chunk's own keys, causal (flash)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # attend the static cache window; key j is visible to the query at position p iff j <= p
            mask = (torch.arange(window, device=x.device) <= input_pos[:, :, None])[:, None]  # [B, 1, T, W]
            kc, vc = self.k_cache[row:row + B, :, :window], self.v_cache[row:row + B, :, :window]
            y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, hq * d), self.wo)
        gate, up = F.linear(_rms_norm(x, self.ffn_norm, c.rms_norm_eps), self.w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w2)


class _Model(_Module):
    def __init__(self, cfg: ModelConfig, dtype, device, max_batch, max_seq_len, seed=0):
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(seed)

        def param(*shape, one=False):  # HF-style init: normal(0, 0.02) weights, unit norm scales
            t = (torch.ones(shape, device=device, dtype=dtype) if one else
                 torch.randn(shape, generator=gen, device=device, dtype=dtype) * 0.02)
            return torch.nn.Parameter(t, requires_grad=False)

        self.cfg = cfg
        self.tok_embeddings = param(cfg.vocab_size, cfg.hidden_size)
        cache_shape = (max_batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
        self.layers = torch.nn.ModuleList(_Block(cfg, param, cache_shape, dtype, device)
                                          for _ in range(cfg.num_layers))
        self.norm = param(cfg.hidden_size, one=True)
        self.output = self.tok_embeddings if cfg.tie_word_embeddings else param(cfg.vocab_size, cfg.hidden_size)
        cos, sin = rope_tables(cfg, max_seq_len)
        self.register_buffer("cos", torch.from_numpy(cos).to(device), persistent=False)
        self.register_buffer("sin", torch.from_numpy(sin).to(device), persistent=False)

    def forward(self, tokens, input_pos, window=0, prefill=False, row=0, last_only=True):
        """tokens, input_pos [B, T] -> logits [B, V] (last_only) or [B, T, V]; writes cache rows row..row+B-1."""
        x = F.embedding(tokens, self.tok_embeddings)
        cos, sin = self.cos[input_pos][:, :, None], self.sin[input_pos][:, :, None]
        for layer in self.layers:
            x = layer(x, cos, sin, input_pos, window, prefill, row)
        x = x[:, -1] if last_only else x
        return F.linear(_rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.output)


class TorchPeer:
    """Times the gpt-fast-style model: compiled decode at a batch and depth, eager prefill."""

    def __init__(self, cfg: ModelConfig, dtype="bfloat16", device="cuda", max_batch=32,
                 max_seq_len=4096 + 256, compile=True, seed=0):
        self.device, self.max_batch, self.max_seq_len = torch.device(device), max_batch, max_seq_len
        self.model = _Model(cfg, getattr(torch, dtype), self.device, max_batch, max_seq_len, seed)
        self._decode, mode = self._decode_step, "eager"
        if compile:
            # One graph per (batch, window): dynamic=False keeps every shape static like gpt-fast's.
            torch._dynamo.config.recompile_limit = 64
            if self.device.type == "cuda":
                torch._inductor.config.coordinate_descent_tuning = True  # as gpt-fast's generate.py
                for layer in self.model.layers:  # the graphs write the cache in place, as HF's StaticCache
                    torch._dynamo.mark_static_address(layer.k_cache)
                    torch._dynamo.mark_static_address(layer.v_cache)
                self._decode = torch.compile(self._decode_step, mode="reduce-overhead", fullgraph=True,
                                             dynamic=False)
                mode = "compile(reduce-overhead)"
            else:  # CUDA graphs need a GPU; compile the CPU step with Inductor's defaults
                self._decode, mode = torch.compile(self._decode_step, fullgraph=True, dynamic=False), "compile"
        self.label = f"torch {torch.__version__.split('+')[0]} {mode} + SDPA"

    def _decode_step(self, tokens, input_pos, window):
        """One token per sequence at its own position -> the greedy next token of each [B]."""
        return self.model(tokens[:, None], input_pos[:, None], window).argmax(-1)

    def _timer(self):
        if self.device.type == "cuda":
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return _WallEvent(), _WallEvent()

    def decode_ms_per_step(self, batch, depth, steps, repeats, warmup=3) -> list[float]:
        """Median ms per step of `steps` decode steps, for each of `repeats` runs.

        Like `bench`'s tgN@bB dD: each sequence holds a prompt of max(depth, 1) tokens, so step i
        writes and reads position prompt + i. The cache contents do not change the time, so they
        are left as they are rather than prefilled."""
        prompt = max(depth, 1)
        need = prompt + steps
        if batch > self.max_batch or need > self.max_seq_len:
            raise ValueError(f"peer holds batch <= {self.max_batch} and {self.max_seq_len} positions; "
                             f"asked batch {batch} and {need} positions")
        window = min(self.max_seq_len, -(-need // WINDOW_ROUND) * WINDOW_ROUND)
        gen = torch.Generator(device=self.device).manual_seed(batch)
        tok = torch.randint(0, self.model.cfg.vocab_size, (batch,), generator=gen, device=self.device)
        pos = torch.full((batch,), prompt, dtype=torch.long, device=self.device)
        timers = [self._timer() for _ in range(steps)]
        out = []
        with torch.no_grad():
            for _ in range(warmup):  # compile, then record the CUDA graph
                tok = self._decode(tok, pos, window).clone()
            for _ in range(repeats):
                pos.fill_(prompt)
                for start, end in timers:
                    start.record()
                    nxt = self._decode(tok, pos, window)
                    end.record()
                    tok = nxt.clone()  # the graph's output buffer is overwritten by the next replay
                    pos += 1
                timers[-1][1].synchronize()
                out.append(statistics.median(s.elapsed_time(e) for s, e in timers))
        return out

    def prefill_ms(self, length, repeats) -> list[float]:
        """Eager causal prefill of `length` random tokens at batch 1 (last token's logits), ms per repeat."""
        if length > self.max_seq_len:
            raise ValueError(f"peer holds {self.max_seq_len} positions; asked a prefill of {length}")
        gen = torch.Generator(device=self.device).manual_seed(length)
        tokens = torch.randint(0, self.model.cfg.vocab_size, (1, length), generator=gen, device=self.device)
        pos = torch.arange(length, device=self.device)[None]
        start, end = self._timer()
        out = []
        with torch.no_grad():
            for i in range(repeats + 1):  # the first run warms up cuBLAS and the allocator
                start.record()
                self.model(tokens, pos, prefill=True)
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end))
        return out[1:]


class _WallEvent:
    """CPU stand-in for torch.cuda.Event, so the peer runs (slowly) without a GPU."""

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3
