"""The op interface both backends implement; `model.py` and the runner call nothing else.

Backends are stateless: every op takes all of its inputs as arguments (the
step's positions, slots and block tables included) and writes into the output
it is given. A backend holds only what never changes between steps: the
stream, library handles, compiled kernels and their per-shape workspaces.
Arrays are the backend's own (NumPy on the CPU, CuPy on the GPU).
"""
from typing import Protocol

import numpy as np


class Backend(Protocol):
    name: str  # "cpu" | "cuda"
    dtype: str  # compute/storage dtype: "float32" | "float16" | "bfloat16"

    # -- memory ----------------------------------------------------------------------------------------
    def from_host(self, a: np.ndarray): ...  # host floats -> backend array in the compute dtype
    def from_host_f32(self, a: np.ndarray): ...  # host floats -> fp32 backend array (tables)
    def empty(self, shape, dtype=None): ...  # uninitialised, compute dtype unless given
    def to_host(self, a) -> np.ndarray: ...  # -> fp32 NumPy copy (synchronises)
    def int_buffer(self, n: int) -> tuple: ...  # (host int32[n], backend int32[n]) staging pair
    def upload(self, host: np.ndarray, dev, n: int, offset: int = 0) -> None: ...  # dev[o:o+n] = host[o:o+n], async

    # -- ops (kernels/<op>.cu and their CPU twins kernels/<op>.py) ------------------------------------
    # out[T, N] = x[T, K] @ w[N, K].T; small_batch_gemv / skinny_gemm / stream_gemm: our GEMV (1 row) / tensor-core
    # GEMM (2-32 rows, small weights) / weight-streaming GEMM (2-32 rows, the MLP's) where they take the shape, else
    # cuBLAS (the CPU's BLAS takes every shape: kernels/gemv.py, gemm_skinny.py, gemm_stream.py)
    def linear(self, x, w, out, small_batch_gemv: bool = False, skinny_gemm: bool = False,
               stream_gemm: bool = False) -> None: ...
    # act[T, I] = silu(x @ w[:I].T) * (x @ w[I:].T), w = gate_up [2I, K]: one kernel where one of our GEMMs
    # takes the projection (SwiGLU in its epilogue; gate_up untouched), else linear into gate_up + silu_mul.
    def linear_swiglu(self, x, w, gate_up, act, small_batch_gemv: bool = False, skinny_gemm: bool = False,
                      stream_gemm: bool = False) -> None: ...
    def embedding(self, ids, table, out) -> None: ...  # out[t] = table[ids[t]] (also a row gather)
    def add_rmsnorm(self, x, residual, weight, eps: float, out) -> None: ...
    # split_down: the down projection as S partial products over slices of K (fp32 [S, T, N]; S from down_slices,
    # 0 where it does not apply), added by the next add_rmsnorm_partials (x = the slices' sum, rounded to the
    # compute dtype, then add_rmsnorm).
    def down_slices(self, rows: int, n: int, k: int) -> int: ...
    def linear_partials(self, x, w, parts) -> None: ...
    def add_rmsnorm_partials(self, parts, residual, weight, eps: float, out) -> None: ...
    # norm_in_gemm: the o projection with the post-attention add_rmsnorm split over it and silu_mul. linear_norm:
    # residual += x @ w.T, x_out = residual * norm_w, parts [H / 16, T] = sums of residual^2 a 16-column tile
    # (kernels/gemm_skinny.cu's gemm_skinny_norm); silu_mul_scaled: silu_mul of gate_up times each row's
    # rsqrt(mean + eps) from those parts. For pure decode steps where norm_in_gemm_ok says so.
    def norm_in_gemm_ok(self, rows: int, cfg, small_batch_gemv: bool) -> bool: ...
    def linear_norm(self, x, w, residual, norm_w, x_out, parts) -> None: ...
    def silu_mul_scaled(self, gate_up, parts, eps: float, out) -> None: ...
    # A projection with its neighbours folded in (kernels/gemv.cu's gemv_fused): kind "norm" (y = RMSNorm(x) @ w.T),
    # "add" (y += x @ w.T) or "swiglu_add" (y += swiglu(x) @ w.T); used for steps where fused_gemv_ok says so.
    def fused_gemv_ok(self, rows: int, cfg) -> bool: ...
    def gemv_fused(self, x, w, y, kind: str, norm_weight=None, eps: float = 0.0) -> None: ...
    def silu_mul(self, gate_up, out) -> None: ...
    # The MLP block of a batch-1 decode step as one op (kernels/decode_mlp.cu, a persistent kernel): h += attn, then
    # h += W_down SwiGLU(W_gate_up RMSNorm(h)); act is scratch. For steps where decode_mlp_ok says so.
    def decode_mlp_ok(self, rows: int, cfg) -> bool: ...
    def decode_mlp(self, attn, h, norm_w, eps: float, w_gate_up, w_down, act) -> None: ...
    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads: int,
                 n_kv_heads: int, q_out, k_cache, v_cache) -> None: ...
    # linear(x, w, qkv), then rope_qkv: one kernel where the skinny GEMM takes the projection and there are no q/k
    # norms (kernels/gemm_skinny.cu's gemm_skinny_rope; qkv is then not written); the same bits either way.
    def linear_rope(self, x, w, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads: int,
                    n_kv_heads: int, q_out, k_cache, v_cache, small_batch_gemv: bool = False,
                    skinny_gemm: bool = False) -> None: ...
    # rope = rope_qkv's (qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping) for a pure decode step:
    # apply it inside the attention (the new K/V written to the caches first); q is then scratch. tensor_cores
    # (without rope): the GQA-packed tensor-core kernel where the GPU backend has one (the same function).
    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size: int, scale: float,
                         out, max_seq_len: int, rope=None, tensor_cores: bool = False) -> None: ...
    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                          block_size: int, scale: float, out, max_query_len: int,
                          tensor_cores: bool) -> None: ...

    # -- sparse prefill ops (kernels/sparse_prefill.cu, kernels/sparse_prefill.py) ------------------------
    # (and kernels/combine.{cu,py}); rows are the prefill requests' rows, local row t = row - qsl[0].
    def sparse_compress_keys(self, k_cache, block_tables, seq_lens, block_size: int, R: int,
                             kbar) -> None: ...  # kbar fp32[B, N, Hkv, D] = key block means (0 past seq_len//R)
    # The indexer runs per tile row: a request's queries grouped by pos // Q (kernels/sparse_prefill.py).
    def sparse_query_means(self, q, query_start_loc, seq_lens, Q: int, r0: int, qbar,
                           max_tiles: int) -> None: ...  # qbar fp32[rows, Hkv, D] of tile rows r0..
    def sparse_scores(self, qbar, kbar, query_start_loc, seq_lens, R: int, Q: int, r0: int, scores,
                      max_tiles: int) -> None: ...  # scores fp32[rows, N] of tile rows r0.. (-inf: not visible)
    def sparse_topk(self, scores, query_start_loc, seq_lens, R: int, K: int, Q: int, r0: int, topk,
                    rows: int) -> None: ...  # topk int32[T, K] of tile rows r0..r0+rows-1's queries: best K
    #                                          blocks ascending; scores None: every row short, no scores read
    def sparse_gather_lens(self, query_start_loc, seq_lens, W: int, out) -> None: ...  # q_len + min(prefix, W-1)
    def combine_topk_swa_indices(self, topk, query_start_loc, seq_lens, gather_lens, W: int, R: int, K: int,
                                 M: int, N: int, out, lens) -> None: ...  # reference A.5, bounds-checked
    def sparse_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens,
                         M: int, N: int, W: int, R: int, block_size: int, scale: float,
                         out) -> None: ...  # softmax over window + selected blocks, each token once
    # The same attention by 64-query tiles (kernels/sparse_attention_tc.{cu,py}): union of the tile's blocks with
    # per-query masks, then tensor-core attention over union + window. ublk/umask/ucount: [B*tiles, cap] lists.
    def sparse_tiled_ok(self, head_dim: int) -> bool: ...  # whether the driver should take the tiled route
    def sparse_tile_union(self, query_start_loc, seq_lens, combined, lens, M: int, N: int, W: int, R: int, K: int,
                          Q: int, ublk, umask, ucount) -> None: ...
    def sparse_attention_tiled(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask,
                               ucount, W: int, R: int, K: int, block_size: int, scale: float, out) -> None: ...

    # -- sampler ops (kernels/sampler.cu, kernels/sampler.py) ----------------------------------------------------
    # logits [R, V]: the compute dtype (CUDA: bf16 as uint16, fp16, fp32; CPU: fp32) or the fp32 copy; x: fp32
    # [R, V] processed in place; per-row arrays have length R; CSR entries: offsets int32[R+1] over tokens int32[E].
    def gumbel_sample(self, logits, temperature, seeds, positions,
                      out) -> None: ...  # out int32[R] = argmax(x/T + Philox Gumbel(seed, pos, v)); T=0 argmax; NaN -1
    def to_fp32(self, logits, out) -> None: ...  # out f32[R, V] = logits upcast
    def add_entries(self, x, offsets, tokens, values) -> None: ...  # x[r, tokens[e]] += values[e] (bias, -inf bans)
    def apply_penalties(self, x, offsets, tokens, counts, rep, freq,
                        pres) -> None: ...  # sign-aware repetition, then -= freq*count, then -= pres*(count>0)
    def temperature_min_p(self, x, temperature, min_p) -> None: ...  # x /= T (T not 0/1); x < max+log(min_p) -> -inf
    def top_k_top_p(self, x, top_k, top_p) -> None: ...  # keep >= k-th value; then the top set reaching mass top_p
    def logprobs(self, logits, sampled, n: int, top_ids, top_lp, sampled_lp,
                 sampled_rank) -> None: ...  # top-n ids/logprobs, sampled token's logprob and rank, raw logits

    # -- step plumbing -------------------------------------------------------------------------------------
    def launching(self, pdl: bool) -> "Backend": ...  # self, or the twin launching decode kernels with PDL (CUDA)
    def bind_thread(self) -> None: ...  # run this thread's launches on the backend's stream
    def ids_to_host(self, dev, n: int) -> np.ndarray: ...  # int32 dev[:n] -> host; the step's one sync
    def section_timer(self): ...  # per-section laps (eager steps)
    def step_clock(self): ...  # start()/stop()/elapsed_ms() around a whole step, read after its sync
    def synchronize(self) -> None: ...
