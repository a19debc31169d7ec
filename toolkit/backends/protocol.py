"""The op interface both backends implement; the decoder, the runner and the sampler call nothing else.

Backends are stateless: every op takes all of its inputs as arguments (the
step's positions, slots and block tables included) and writes into the output
it is given. A backend holds only what never changes between steps: the
stream, library handles, compiled kernels and their per-shape workspaces.
Arrays are the backend's own (NumPy on the CPU, CuPy on the GPU).
"""
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Backend(Protocol):
    name: str  # "cpu" | "cuda"
    dtype: str  # compute/storage dtype: "float32" | "float16" | "bfloat16"
    num_sms: int  # streaming multiprocessors (0 on the CPU): the plan sizes decode attention's kernel choice by it
    sm90: bool  # a Hopper GPU: the plan's prefill attention runs on wgmma (prefill_attention_wg)
    graphs_supported: bool  # whether a step can be captured as a CUDA graph (a capturable cuBLAS)
    pdl_supported: bool  # programmatic dependent launch (Hopper and cuda-bindings)
    asynchronous: bool  # whether ops return before their work is done (the engine then queues a step ahead)

    # -- memory ----------------------------------------------------------------------------------------
    def from_host(self, a: np.ndarray): ...  # host floats -> backend array in the compute dtype
    def from_host_f32(self, a: np.ndarray): ...  # host floats -> fp32 backend array (tables)
    def empty(self, shape, dtype=None): ...  # uninitialised, compute dtype unless given
    def to_host(self, a) -> np.ndarray: ...  # -> fp32 NumPy copy (synchronises)
    def int_buffer(self, n: int) -> tuple: ...  # (host int32[n], backend int32[n]) staging pair
    def upload(self, host: np.ndarray, dev, n: int, offset: int = 0) -> None: ...  # dev[o:o+n] = host[o:o+n], async
    def download(self, dev, host: np.ndarray, n: int): ...  # host[:n] = dev[:n], async; .wait() -> host[:n]
    def copy_ids(self, src, dst, n: int) -> None: ...  # dst[:n] = src[:n] on the device, async (int32)
    def fence(self): ...  # .wait() blocks until the work queued so far has run

    # -- ops (kernels/<op>.cu and their CPU twins kernels/<op>.py); the step plan (toolkit/model/plan.py) names
    # which of them run. Projections: out[T, N] = x[T, K] @ w[N, K].T, fp32 accumulation.
    def linear(self, x, w, out) -> None: ...  # cuBLAS on the GPU, NumPy's BLAS on the CPU
    def linear_tuned(self, x, w, out) -> None: ...  # the same by the algorithm measured fastest for its shape (GPU)
    def gemv(self, x, w, out) -> None: ...  # our GEMV, 1-4 rows (kernels/gemv.cu)
    def gemm_skinny(self, x, w, out) -> None: ...  # our tensor-core GEMM, 2-32 rows (kernels/gemm_skinny.cu)
    # act[T, I] = silu(x @ w[:I].T) * (x @ w[I:].T), w = gate_up [2I, K]: SwiGLU in the projection's epilogue,
    # the same roundings as the projection and then silu_mul
    def gemv_swiglu(self, x, w, act) -> None: ...
    def gemm_skinny_swiglu(self, x, w, act) -> None: ...
    def gemm_wg_swiglu(self, x, w, act) -> None: ...  # a decode step's rows, on Hopper's wgmma (kernels/gemm_wg.cu)
    # qkv = x @ w.T, then rope_qkv's work (no q/k norms) in the epilogue: qkv itself is not written
    def gemm_skinny_rope(self, x, w, bias, cos, sin, positions, slot_mapping, n_heads: int, n_kv_heads: int,
                         q_out, k_cache, v_cache) -> None: ...
    def gemv_rope(self, x, w, bias, cos, sin, positions, slot_mapping, n_heads: int, n_kv_heads: int,
                  q_out, k_cache, v_cache) -> None: ...
    # The o projection with the post-attention add_rmsnorm split over it: residual += x @ w.T, x_out = residual *
    # norm_w, parts[H / 16, T] = each 16-column tile's sums of residual^2; silu_mul_scaled applies the norm's
    # per-row scale rsqrt(mean + eps) after the gate_up GEMM.
    def gemm_skinny_norm(self, x, w, residual, norm_w, x_out, parts) -> None: ...
    def silu_mul_scaled(self, gate_up, parts, eps: float, out) -> None: ...
    # The down projection as S fp32 partial products over slices of K (parts [S, T, N]), which the next
    # add_rmsnorm_partials adds (x = the slices' sum, rounded to the compute dtype, then add_rmsnorm).
    def linear_partials(self, x, w, parts) -> None: ...
    def add_rmsnorm_partials(self, parts, residual, weight, eps: float, out) -> None: ...
    def embedding(self, ids, table, out) -> None: ...  # out[t] = table[ids[t]] (also a row gather)
    def add_rmsnorm(self, x, residual, weight, eps: float, out) -> None: ...  # residual += x; out = RMSNorm
    def silu_mul(self, gate_up, out) -> None: ...
    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads: int,
                 n_kv_heads: int, q_out, k_cache, v_cache) -> None: ...
    # Attention over the paged cache. Decode: one query per sequence, split-K plan sized for max_seq_len (the
    # step's context bucket); _tc: a GQA group's heads as the rows of one mma tile (16-bit, D 64 or 128); _stream:
    # the same on long contexts, a ring of K/V tiles in flight and few splits.
    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size: int, scale: float, out,
                         max_seq_len: int) -> None: ...
    def decode_attention_tc(self, q, k_cache, v_cache, block_tables, seq_lens, block_size: int, scale: float, out,
                            max_seq_len: int) -> None: ...
    def decode_attention_stream(self, q, k_cache, v_cache, block_tables, seq_lens, block_size: int, scale: float,
                                out, max_seq_len: int) -> None: ...
    # Varlen causal prefill; _tc: FlashAttention-2 on mma.sync (16-bit, D 64 or 128); _wg: the same on wgmma (sm_90).
    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size: int,
                          scale: float, out, max_query_len: int) -> None: ...
    def prefill_attention_tc(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size: int,
                             scale: float, out, max_query_len: int) -> None: ...
    def prefill_attention_wg(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size: int,
                             scale: float, out, max_query_len: int) -> None: ...

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
    def sparse_tile_union(self, query_start_loc, seq_lens, combined, lens, M: int, N: int, W: int, R: int, K: int,
                          Q: int, ublk, umask, ucount) -> None: ...
    def sparse_attention_tiled(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask,
                               ucount, W: int, R: int, K: int, block_size: int, scale: float, out) -> None: ...

    # -- sampler ops (kernels/sampler.cu, kernels/sampler.py) ----------------------------------------------------
    # logits [R, V]: the compute dtype (CUDA: bf16 as uint16, fp16, fp32; CPU: fp32) or the fp32 copy; x: fp32
    # [R, V] processed in place; per-row arrays have length R; CSR entries: offsets int32[R+1] over tokens int32[E].
    def gumbel_sample(self, logits, temperature, seeds, positions,
                      out) -> None: ...  # out int32[R] = argmax(x/T + Philox Gumbel(seed, pos, v)); T=0 argmax; NaN -1
    def filter_sample(self, logits, temperature, top_k, top_p, min_p, rep, freq, pres, sample_temp, seeds, positions,
                      bias_off, bias_tok, bias_val, pen_off, pen_tok, pen_cnt, ban_off, ban_tok, ban_val, ws_tok,
                      ws_val, out) -> None: ...  # rows with sample_temp < 0: processing + Gumbel-max from the logits
    # in place; ws_tok int32 / ws_val f32, each as long as the three CSR entry arrays together: a workspace
    def to_fp32(self, logits, out) -> None: ...  # out f32[R, V] = logits upcast
    def add_entries(self, x, offsets, tokens, values) -> None: ...  # x[r, tokens[e]] += values[e] (bias, -inf bans)
    def apply_penalties(self, x, offsets, tokens, counts, rep, freq,
                        pres) -> None: ...  # sign-aware repetition, then -= freq*count, then -= pres*(count>0)
    def temperature_min_p(self, x, temperature, min_p) -> None: ...  # x /= T (T not 0/1); x < max+log(min_p) -> -inf
    def top_k_top_p(self, x, top_k, top_p) -> None: ...  # keep >= k-th value; then the top set reaching mass top_p
    def logprobs(self, logits, sampled, n: int, top_ids, top_lp, sampled_lp,
                 sampled_rank) -> None: ...  # top-n ids/logprobs, sampled token's logprob and rank, raw logits

    # -- step plumbing -------------------------------------------------------------------------------------
    def with_pdl(self) -> "Backend": ...  # the twin launching its kernels with PDL (CUDA, Hopper), else self
    def capture(self, fn): ...  # run fn() once, recording its launches; returns a graph for replay
    def replay(self, graph) -> None: ...  # launch a captured graph on the backend's stream
    def bind_thread(self) -> None: ...  # run this thread's launches on the backend's stream
    def ids_to_host(self, dev, n: int) -> np.ndarray: ...  # int32 dev[:n] -> host; the step's one sync
    def section_timer(self): ...  # start() / lap(section) / laps_ms() -> [(section, ms)], eager steps
    def step_clock(self): ...  # start()/stop()/elapsed_ms() around a whole step, read after its sync
    def synchronize(self) -> None: ...
