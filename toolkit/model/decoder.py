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
cost one pass over memory instead of two. With `split_down` the MLP's output
arrives as the down projection's slices of K, and the add sums them first.

Attention is chosen from the step, not from a tensor shape: the first
`num_decodes` requests feed one token each and use the split-K decode kernel,
its split plan sized for the step's `context_bucket` (not max_context, so a
short context does not launch a long one's mostly empty splits; with
`rope_in_attention` a pure decode step skips rope_qkv and that kernel does
RoPE and the K/V write itself);
the rest (prompt chunks) use the sparse prefill path (sliding window + the
indexer's top-k key blocks, toolkit/sparse.py) when `options.sparse_prefill`
is on, else the dense varlen prefill kernel, over the same cache. The lm_head
writes logits in the buffer's dtype: the compute dtype for the sampler (bf16
on the GPU), fp32 for `all_rows` scoring.
"""
from dataclasses import dataclass

import numpy as np

from toolkit.model.config import ModelConfig, rope_tables
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
    parts: object  # fp32, flat: split_down's partial products [S, N, H] (parts_view)
    norm_parts: object  # fp32, flat: norm_in_gemm's sums of squares [H / 16, N] (norm_parts_view)

    def view(self, n: int) -> "Scratch":
        return Scratch(**{k: v if k in ("parts", "norm_parts") else v[:n] for k, v in vars(self).items()})

    def parts_view(self, S: int, n: int, H: int):
        """The first S * n * H words as [S, n, H]: each slice's rows contiguous, as linear_partials writes them."""
        return self.parts[:S * n * H].reshape(S, n, H)

    def norm_parts_view(self, n: int, H: int):
        """The first H / 16 * n words as [H / 16, n]: a 16-column tile's sums for each row, as linear_norm
        writes them."""
        return self.norm_parts[:H // 16 * n].reshape(H // 16, n)


@dataclass
class KVCache:
    """Paged K/V for every layer: k[i], v[i] are [num_blocks * block_size, Hkv, D]."""
    k: list
    v: list
    block_size: int
    num_blocks: int

    @classmethod
    def allocate(cls, backend, cfg: ModelConfig, num_blocks: int, block_size: int) -> "KVCache":
        shape = (num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        return cls([backend.empty(shape) for _ in range(cfg.num_layers)],
                   [backend.empty(shape) for _ in range(cfg.num_layers)], block_size, num_blocks)

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


class Model:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend, max_context: int, max_tokens: int,
                 max_seqs: int):
        self.cfg, self.w, self.be = cfg, weights, backend
        self.max_context = max_context
        self.scale = float(cfg.head_dim) ** -0.5
        cos, sin = rope_tables(cfg, max_context)
        self.cos, self.sin = backend.from_host_f32(cos), backend.from_host_f32(sin)
        self.scratch = self._alloc_scratch(max_tokens)
        self.x_last = backend.empty((max_seqs, cfg.hidden_size))
        self._sparse = None  # the sparse prefill's workspaces (toolkit/sparse.py), made at its first use

    def _alloc_scratch(self, rows: int) -> Scratch:
        be, c = self.be, self.cfg
        H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
        return Scratch(
            h=be.empty((rows, H)), x=be.empty((rows, H)), qkv=be.empty((rows, c.qkv_size)),
            q=be.empty((rows, c.num_heads, D)), attn=be.empty((rows, c.num_heads, D)),
            attn_out=be.empty((rows, H)), gate_up=be.empty((rows, 2 * I)),
            act=be.empty((rows, I)), mlp_out=be.empty((rows, H)),
            parts=be.empty((max(be.down_slices(r, H, I) * r for r in range(1, rows + 1)) * H,), np.float32),
            norm_parts=be.empty((max(1, H // 16 * min(rows, 32)),), np.float32))

    def forward(self, step, kv: KVCache, logits, options, timer, all_rows: bool = False):
        """Run the staged `step`; write the logits of each request's last row into logits[:B].

        `options` (EngineOptions, as effective on this backend) picks kernels: tensor-core prefill
        attention, our small-batch GEMV and its fused form. `all_rows` writes the logits of every fed token instead
        (logits[:N]; tests, perplexity).
        """
        c, w = self.cfg, self.w
        N, B, nd = step.num_tokens, step.num_seqs, step.num_decodes
        # pdl: the decode kernels launch with programmatic dependent launch (kernels/pdl.cuh). The runner turns it
        # off for every step it does not replay from a CUDA graph, prefill steps included (host cost).
        # skinny_gemm only in a pure decode step: a prompt's projections stay on cuBLAS whatever their row count,
        # so a prompt's logits do not depend on how much of it a prefix-cache hit left to compute (with it on for
        # every step, a warm run of the same prompts began with another token: the test that PDL changes no token
        # failed on that, not on PDL; benchmarks/results/skinny_pdl_check.log).
        be = _Ops(self.be.launching(options.pdl), options.small_batch_gemv, options.gemv_swiglu,
                  options.skinny_gemm and nd == N, options.stream_gemm and nd == N)
        s = self.scratch.view(N)
        # A batch-1 decode step is launch-bound: with fused_gemv the residual adds, RMSNorms and SwiGLU ride
        # inside the GEMVs (gemv_fused), 6 kernels a layer instead of 9; same arithmetic, same roundings.
        fused = options.fused_gemv and options.small_batch_gemv and self.be.fused_gemv_ok(N, c)
        # A pure decode step can do rope_qkv's work inside decode attention (one launch a layer fewer); a step with
        # prompt rows needs q and the cache written for every row before its prefill attention.
        rope_inside = options.rope_in_attention and nd == N
        # rope_in_gemm: the qkv projection does rope_qkv's work in its epilogue where gemm_skinny takes it (2-32
        # rows of a pure decode step, no q/k norms): one kernel a layer fewer.
        rope_gemm = options.rope_in_gemm and not (fused or rope_inside)
        # mlp_kernel (batch 1): each MLP block is one persistent kernel (decode_mlp) that also does both residual
        # adds, so h is complete after it and the next RMSNorm adds nothing.
        mlp_one = (options.mlp_kernel and options.small_batch_gemv and not fused
                   and self.be.decode_mlp_ok(N, c))
        added = fused or mlp_one  # h already holds the MLP output when the next block starts
        # split_down (a pure decode step of 2-128 rows, like skinny_gemm: a prompt's logits must not depend on how
        # many of its rows a prefix hit left): the down projection as S fp32 partial products (one strided-batched
        # cuBLAS call instead of cuBLAS's split-K kernel and its reduce kernel), which the next add_rmsnorm adds:
        # one launch a layer fewer. mlp_out is then not written.
        split = options.split_down and nd == N and not added
        S = self.be.down_slices(N, c.hidden_size, c.intermediate_size) if split else 0
        parts = s.parts_view(S, N, c.hidden_size) if S else None
        # norm_in_gemm (a pure decode step whose o projection runs on gemm_skinny): the post-attention add_rmsnorm
        # is split over its neighbours. RMSNorm(h) * w = inv * (h * w), inv = rsqrt(mean(h^2) + eps) one number a
        # row, so it commutes with the gate_up GEMM: the o projection's epilogue adds into h, writes x = h * w and
        # each tile's sums of h^2 (linear_norm); after the GEMM, silu_mul_scaled applies inv. One launch a layer
        # fewer, the same h bits, other roundings for x and gate_up (README, "The post-attention RMSNorm").
        fold = (options.norm_in_gemm and options.skinny_gemm and nd == N and N <= 32 and not added
                and self.be.norm_in_gemm_ok(N, c, options.small_batch_gemv))
        norm_parts = s.norm_parts_view(N, c.hidden_size) if fold else None

        def add_norm(x, weight):  # h += x (the MLP's output: mlp_out, or the partials), then x = RMSNorm(h)
            if parts is not None and x is s.mlp_out:
                be.add_rmsnorm_partials(parts, s.h, weight, eps, s.x)
            else:
                be.add_rmsnorm(x, s.h, weight, eps, s.x)
        timer.start()
        be.embedding(step.input_ids, w.embed, s.h)
        timer.lap("embedding")
        eps = c.rms_norm_eps
        for i, L in enumerate(w.layers):
            # Attention block. Layer 0 has no previous MLP output to add into h.
            if fused:  # h already holds every add: qkv = W (RMSNorm(h) * w)
                be.gemv_fused(s.h, L.qkv, s.qkv, "norm", L.input_norm, eps)
            else:
                add_norm(None if i == 0 or added else s.mlp_out, L.input_norm)
            rope = (s.qkv, L.qkv_bias, L.q_norm, L.k_norm, eps, self.cos, self.sin, step.positions,
                    step.slot_mapping)
            if rope_gemm:  # qkv and rope_qkv: one kernel where it can be (else the two, in turn)
                be.linear_rope(s.x, L.qkv, *rope, c.num_heads, c.num_kv_heads, s.q, kv.k[i], kv.v[i])
            else:
                if not fused:
                    be.linear(s.x, L.qkv, s.qkv)
                if not rope_inside:
                    be.rope_qkv(*rope, c.num_heads, c.num_kv_heads, s.q, kv.k[i], kv.v[i])
            self._attention(be, step, kv, i, s, nd, B, options, timer, rope if rope_inside else None)
            if fused:  # h += W_o attn
                be.gemv_fused(s.attn.reshape(N, -1), L.o_proj, s.h, "add")
            elif fold:  # h += W_o attn; x = h * w; the sums of h^2 for the norm's scale
                be.linear_norm(s.attn.reshape(N, -1), L.o_proj, s.h, L.post_norm, s.x, norm_parts)
            else:
                be.linear(s.attn.reshape(N, -1), L.o_proj, s.attn_out)
            timer.lap("attention")
            # MLP block: h += attention output, then SwiGLU on its norm.
            if fused:  # gate_up = W (RMSNorm(h) * w); h += W_down (silu(gate) * up)
                be.gemv_fused(s.h, L.gate_up, s.gate_up, "norm", L.post_norm, eps)
                be.gemv_fused(s.gate_up, L.down, s.h, "swiglu_add")
            elif mlp_one:  # h += attn_out; h += W_down SwiGLU(W_gate_up RMSNorm(h)): one kernel
                be.decode_mlp(s.attn_out, s.h, L.post_norm, eps, L.gate_up, L.down, s.act)
            else:
                if fold:  # gate_up = W (h * w); act = SwiGLU(inv * gate_up)
                    be.linear(s.x, L.gate_up, s.gate_up)
                    be.silu_mul_scaled(s.gate_up, norm_parts, eps, s.act)
                else:
                    be.add_rmsnorm(s.attn_out, s.h, L.post_norm, eps, s.x)
                    be.linear_swiglu(s.x, L.gate_up, s.gate_up, s.act)  # one kernel where our GEMV takes it
                if parts is not None:
                    be.linear_partials(s.act, L.down, parts)
                else:
                    be.linear(s.act, L.down, s.mlp_out)
            timer.lap("mlp")
        add_norm(None if added else s.mlp_out, w.final_norm)
        if all_rows:
            be.linear(s.x, w.lm_head, logits[:N])
        elif nd == N:  # every request fed one token: row b is request b's last row already
            be.linear(s.x, w.lm_head, logits[:B])
        else:  # gather each request's last row, so the lm_head runs on B rows, not N
            x_last = self.x_last[:B]
            be.embedding(step.logits_rows, s.x, x_last)
            be.linear(x_last, w.lm_head, logits[:B])
        timer.lap("lm_head")
        return logits

    def _attention(self, be, step, kv: KVCache, layer: int, s: Scratch, nd: int, B: int, options, timer,
                   rope=None):
        bs = kv.block_size
        k, v = kv.k[layer], kv.v[layer]
        if nd:
            be.decode_attention(s.q[:nd], k, v, step.block_tables[:nd], step.seq_lens[:nd], bs, self.scale,
                                s.attn[:nd], step.context_bucket, rope, options.tensor_cores)
        if nd < B and options.sparse_prefill:  # prompt rows: window + top-k blocks (toolkit/sparse.py)
            if self._sparse is None:
                from toolkit.model.sparse import SparsePrefill
                self._sparse = SparsePrefill(self.be)
            self._sparse.run(step, k, v, bs, s.q, s.attn, nd, options, timer, self.scale, options.tensor_cores)
        elif nd < B:
            be.prefill_attention(s.q, k, v, step.block_tables[nd:], step.query_start_loc[nd:],
                                 step.seq_lens[nd:], bs, self.scale, s.attn, step.max_query_len,
                                 options.tensor_cores)


class _Ops:
    """The backend with `linear`, `linear_swiglu` and `linear_rope` bound to this step's GEMM choices; every
    other op passes through."""

    def __init__(self, backend, small_batch_gemv: bool, gemv_swiglu: bool, skinny_gemm: bool = False,
                 stream_gemm: bool = False):
        self._be, self._gemv, self._swiglu = backend, small_batch_gemv, small_batch_gemv and gemv_swiglu
        self._skinny, self._stream = skinny_gemm, stream_gemm

    def linear(self, x, w, out):
        self._be.linear(x, w, out, self._gemv, self._skinny, self._stream)

    def linear_swiglu(self, x, w, gate_up, act):
        self._be.linear_swiglu(x, w, gate_up, act, self._swiglu, self._skinny, self._stream)

    def linear_rope(self, x, w, *rope):
        self._be.linear_rope(x, w, *rope, small_batch_gemv=self._gemv, skinny_gemm=self._skinny)

    def __getattr__(self, name):
        return getattr(self._be, name)
