"""The decoder: one forward pass over a batched step, on any backend.

    ids -> embedding -> N x [ RMSNorm -> QKV -> RoPE + KV write -> attention -> O
                              (+ residual) RMSNorm -> gate_up -> SiLU*up -> down ]
        -> (+ residual) RMSNorm -> gather each request's last row -> lm_head -> logits [B, V]

Everything the pass needs arrives as arguments: the staged `DeviceStep` (ids,
positions, KV slots, query_start_loc, seq_lens, block tables), the paged
`KVCache`, and the output buffer. The model keeps no per-step state, so two
requests never share hidden state and a step can be captured and replayed.

The residual stream `h` is updated in place: each `add_rmsnorm` first adds the
previous block's output into `h`, then normalises it, so the add and the norm
cost one pass over memory instead of two. When the plan runs the down
projection in slices of K, the MLP's output arrives as fp32 partial products
and the add sums them first.

Which kernel runs each op is the step plan's choice (plan.py), made once per
(rows, decode rows, context bucket, options) and cached here; `forward` only
walks the layers through it. Attention is chosen from the step, not from a
tensor shape: the first `num_decodes` requests feed one token each and use the
split-K decode kernel, its split plan sized for the step's `context_bucket`
(not max_context, so a short context does not launch a long one's mostly empty
splits); the rest (prompt chunks) use the sparse prefill path (sliding window +
the indexer's top-k key blocks, sparse.py) when the plan says so, else the
dense varlen prefill kernel, over the same cache. The lm_head writes logits in
the buffer's dtype: the compute dtype for the sampler (bf16 on the GPU), fp32
for `all_rows` scoring.
"""
from dataclasses import dataclass

import numpy as np

from toolkit.model.config import ModelConfig, rope_tables
from toolkit.model.plan import DOWN_SLICES, PREFILL_OPS, SKINNY_ROWS, StepPlan, make_plan, tuned_calls
from toolkit.model.sparse import SparsePrefill
from toolkit.model.weights import Weights


@dataclass
class Scratch:
    """Activations for up to `rows` tokens; `view(N)` gives the first N rows of each."""
    h: object  # residual stream [N, H]
    x: object  # normalised input of the current block [N, H]
    qkv: object  # [N, (Hq + 2Hkv) * D]
    q: object  # [N, Hq, D]
    attn: object  # [N, Hq, D]
    attn_out: object  # [N, H]
    gate_up: object  # [N, 2I]
    act: object  # [N, I]
    mlp_out: object  # [N, H]
    parts: object  # fp32, flat: the down projection's partial products [S, N, H] (shaped in forward)
    norm_parts: object  # fp32, flat: gemm_skinny_norm's sums of squares [H / 16, N] (shaped in forward)

    def view(self, n: int) -> "Scratch":
        return Scratch(**{k: v if k in ("parts", "norm_parts") else v[:n] for k, v in vars(self).items()})


@dataclass
class KVCache:
    """Paged K/V for every layer: k[i], v[i] are [num_blocks * block_size, Hkv, D]."""
    k: list
    v: list
    block_size: int

    @classmethod
    def allocate(cls, backend, cfg: ModelConfig, num_blocks: int, block_size: int) -> "KVCache":
        shape = (num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        return cls([backend.empty(shape) for _ in range(cfg.num_layers)],
                   [backend.empty(shape) for _ in range(cfg.num_layers)], block_size)

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend, max_context: int, rows: int, max_seqs: int):
        self.cfg, self.w, self.be = cfg, weights, backend
        self.scale = float(cfg.head_dim) ** -0.5
        cos, sin = rope_tables(cfg, max_context)
        self.cos, self.sin = backend.from_host_f32(cos), backend.from_host_f32(sin)
        be, H, D, I = backend, cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        slice_rows = max(s * min(rows, top) for top, s in DOWN_SLICES)  # the down projection's partials at most
        self.scratch = Scratch(
            h=be.empty((rows, H)), x=be.empty((rows, H)), qkv=be.empty((rows, cfg.qkv_size)),
            q=be.empty((rows, cfg.num_heads, D)), attn=be.empty((rows, cfg.num_heads, D)),
            attn_out=be.empty((rows, H)), gate_up=be.empty((rows, 2 * I)),
            act=be.empty((rows, I)), mlp_out=be.empty((rows, H)),
            parts=be.empty((slice_rows * H,), np.float32),
            norm_parts=be.empty((max(1, H // 16 * min(rows, SKINNY_ROWS[1])),), np.float32))
        self.x_last = be.empty((max_seqs, H))
        self._plans = {}  # (rows, decodes, context bucket, options) -> StepPlan
        self._sparse = SparsePrefill(backend)  # the sparse prefill's workspaces (sparse.py), grown at first use

    def plan(self, step, options) -> StepPlan:
        """The step plan for this step's shape under `options` (as effective on this backend), made once."""
        key = (step.num_tokens, step.num_decodes, step.context_bucket, options)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = make_plan(self.be, self.cfg, step.num_tokens, step.num_decodes,
                                             step.context_bucket, options)
        return p

    def tune(self, options, logits) -> int:
        """Measure the algorithm of every "tuned" projection a step can run (plan.py's tuned_calls) now, at start-up,
        on layer 0's weights (every layer's have the same shapes) and the step's own buffers, so their alignment is
        the one later calls have. Returns the number of calls."""
        calls = tuned_calls(self.be, self.cfg, self.scratch.h.shape[0], self.x_last.shape[0], options)
        L = self.w.layers[0]
        for name, n in calls:
            s = self.scratch.view(n)
            x, w, y = {"qkv": (s.x, L.qkv, s.qkv), "o": (s.attn.reshape(n, -1), L.o_proj, s.attn_out),
                       "gate_up": (s.x, L.gate_up, s.gate_up), "down": (s.act, L.down, s.mlp_out),
                       "lm_head": (self.x_last[:n], self.w.lm_head, logits[:n])}[name]
            self.be.linear_tuned(x, w, y)
        return len(calls)

    def forward(self, step, kv: KVCache, logits, plan: StepPlan, timer, all_rows: bool = False):
        """Run the staged `step` with the kernels `plan` names; write the logits of each request's last row into
        logits[:B]. `all_rows` writes the logits of every fed token instead (logits[:N]; tests, perplexity)."""
        c, w = self.cfg, self.w
        N, B, nd = step.num_tokens, step.num_seqs, step.num_decodes
        # PDL: the decode kernels launch with programmatic dependent launch (kernels/pdl.cuh); the runner asks for
        # it only in steps it replays from a CUDA graph.
        be = self.be.with_pdl() if plan.pdl else self.be
        s = self.scratch.view(N)
        eps, H, S = c.rms_norm_eps, c.hidden_size, plan.down_slices
        project = {k: getattr(be, op) for k, op in _PROJECT.items()}
        # The fp32 partial sums as their kernels write them: linear_partials each slice's rows contiguously,
        # gemm_skinny_norm a 16-column tile's sums of h^2 for each row.
        parts = s.parts[:S * N * H].reshape(S, N, H) if plan.down == "slices" else None
        norm_parts = s.norm_parts[:H // 16 * N].reshape(H // 16, N) if plan.o == "skinny_norm" else None

        def add_norm(mlp_out, weight):  # h += the MLP's output (none before layer 0), then x = RMSNorm(h)
            if parts is not None and mlp_out is not None:
                be.add_rmsnorm_partials(parts, s.h, weight, eps, s.x)
            else:
                be.add_rmsnorm(mlp_out, s.h, weight, eps, s.x)
        timer.start()
        be.embedding(step.input_ids, w.embed, s.h)
        timer.lap("embedding")
        for i, L in enumerate(w.layers):
            # Attention block: qkv, then RoPE with q to s.q and the new K/V into the cache.
            add_norm(None if i == 0 else s.mlp_out, L.input_norm)
            rope = (L.qkv_bias, self.cos, self.sin, step.positions, step.slot_mapping, c.num_heads, c.num_kv_heads,
                    s.q, kv.k[i], kv.v[i])
            if plan.qkv in _ROPE_EPILOGUE:  # one kernel; qkv is not written
                getattr(be, _ROPE_EPILOGUE[plan.qkv])(s.x, L.qkv, *rope)
            else:
                project[plan.qkv](s.x, L.qkv, s.qkv)
                be.rope_qkv(s.qkv, L.qkv_bias, L.q_norm, L.k_norm, eps, *rope[1:])
            self._attention(be, plan, step, kv, i, s, nd, B, timer)
            attn = s.attn.reshape(N, -1)
            if plan.o == "skinny_norm":  # h += W_o attn; x = h * w; each tile's sums of h^2 for the norm's scale
                be.gemm_skinny_norm(attn, L.o_proj, s.h, L.post_norm, s.x, norm_parts)
            else:
                project[plan.o](attn, L.o_proj, s.attn_out)
            timer.lap("attention")
            # MLP block: h += attention output, then act = SwiGLU(gate_up(RMSNorm(h))), then down.
            if plan.swiglu == "scaled":  # gate_up = W (h * w); act = SwiGLU(inv * gate_up)
                project[plan.gate_up](s.x, L.gate_up, s.gate_up)
                be.silu_mul_scaled(s.gate_up, norm_parts, eps, s.act)
            else:
                be.add_rmsnorm(s.attn_out, s.h, L.post_norm, eps, s.x)
                if plan.swiglu == "epilogue":  # one kernel; gate_up is not written
                    getattr(be, _SWIGLU_EPILOGUE[plan.gate_up])(s.x, L.gate_up, s.act)
                else:
                    project[plan.gate_up](s.x, L.gate_up, s.gate_up)
                    be.silu_mul(s.gate_up, s.act)
            if parts is not None:
                be.linear_partials(s.act, L.down, parts)
            else:
                project[plan.down](s.act, L.down, s.mlp_out)
            timer.lap("mlp")
        add_norm(s.mlp_out, w.final_norm)
        if all_rows:
            be.linear(s.x, w.lm_head, logits[:N])
        elif nd == N:  # every request fed one token: row b is request b's last row already
            project[plan.lm_head](s.x, w.lm_head, logits[:B])
        else:  # gather each request's last row, so the lm_head runs on B rows, not N
            x_last = self.x_last[:B]
            be.embedding(step.logits_rows, s.x, x_last)
            project[plan.lm_head](x_last, w.lm_head, logits[:B])
        timer.lap("lm_head")
        return logits

    def _attention(self, be, plan: StepPlan, step, kv: KVCache, layer: int, s: Scratch, nd: int, B: int, timer):
        bs = kv.block_size
        k, v = kv.k[layer], kv.v[layer]
        if nd:
            decode = getattr(be, DECODE_OPS[plan.decode_attention])
            decode(s.q[:nd], k, v, step.block_tables[:nd], step.seq_lens[:nd], bs, self.scale, s.attn[:nd],
                   step.context_bucket)
        if nd < B and plan.sparse is not None:  # prompt rows: window + top-k blocks (sparse.py)
            self._sparse.run(step, k, v, bs, s.q, s.attn, nd, plan.sparse, timer, self.scale,
                             plan.prefill_attention)
        elif nd < B:
            prefill = getattr(be, PREFILL_OPS[plan.prefill_attention])
            prefill(s.q, k, v, step.block_tables[nd:], step.query_start_loc[nd:], step.seq_lens[nd:], bs, self.scale,
                    s.attn, step.max_query_len)


# The backend op of each projection kind of the plan, and of a gate_up with SwiGLU in its epilogue.
_PROJECT = {"blas": "linear", "tuned": "linear_tuned", "gemv": "gemv", "skinny": "gemm_skinny"}
_SWIGLU_EPILOGUE = {"gemv": "gemv_swiglu", "skinny": "gemm_skinny_swiglu", "wg": "gemm_wg_swiglu"}
_ROPE_EPILOGUE = {"gemv_rope": "gemv_rope", "skinny_rope": "gemm_skinny_rope"}
DECODE_OPS = {"cuda_cores": "decode_attention", "tc": "decode_attention_tc", "stream": "decode_attention_stream"}
