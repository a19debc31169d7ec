"""CPU backend: NumPy for GEMMs, our Numba/NumPy twins (kernels/*.py) for the rest.

Everything is float32: 16-bit checkpoints are upcast at load, which makes this
backend the reference the CUDA kernels are tested against. NumPy work is
synchronous, so "device time" is simply host time here.

BLAS runs on one thread (TOOLKIT_BLAS_THREADS overrides): OpenBLAS's idle threads
spin, so two processes on a 2-core machine each fell from ~290 to ~29 tok/s with
the default thread count. Our Numba kernels keep their own threads, which wait
passively (OMP_WAIT_POLICY=passive).
"""
import os
import time

import numpy as np

from kernels.activation import silu_mul, silu_mul_scaled
from kernels import sparse_attention_tc as _satc
from kernels import sparse_prefill as _sp
from kernels.combine import combine_topk_swa_indices
from kernels.decode_attention import decode_attention
from kernels.decode_mlp import decode_mlp
from kernels.embedding import embedding
from kernels.gemm_skinny import gemm_skinny_norm
from kernels.gemv import MAX_ROWS as GEMV_MAX_ROWS, gemv_fused, gemv_swiglu
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm, add_rmsnorm_partials
from kernels.rope import rope_qkv
from kernels import sampler as _smp

from toolkit.engine.timings import CpuTimer


class CpuClock:
    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        self._t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        return (self._t1 - self._t0) * 1e3


class CpuBackend:
    name = "cpu"
    dtype = "float32"

    def __init__(self):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=int(os.environ.get("TOOLKIT_BLAS_THREADS", "1")), user_api="blas")

    # -- memory ---------------------------------------------------------------
    def from_host(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float32)

    from_host_f32 = from_host

    def empty(self, shape, dtype=None) -> np.ndarray:
        return np.empty(shape, dtype=dtype or np.float32)

    def to_host(self, a) -> np.ndarray:
        # A copy, as on the GPU: the runner reuses its logits buffer on the next step.
        return np.array(a, dtype=np.float32)

    def int_buffer(self, n: int) -> tuple:
        a = np.zeros(n, np.int32)
        return a, a  # host and "device" are the same memory: staging needs no copy

    def upload(self, host, dev, n: int, offset: int = 0):
        pass

    # -- ops --------------------------------------------------------------------
    def linear(self, x, w, out, small_batch_gemv=False, skinny_gemm=False, stream_gemm=False):
        # HF layout: w is [out, in]; BLAS reads w.T without a copy. (BLAS is the GEMV twin too: kernels/gemv.py.)
        np.matmul(x, w.T, out=out)

    def down_slices(self, rows: int, n: int, k: int) -> int:
        return 0  # (split_down is a GPU switch: here one BLAS call is the whole product)

    def linear_partials(self, x, w, parts):
        S = parts.shape[0]
        ks = x.shape[1] // S
        for s in range(S):
            np.matmul(x[:, s * ks:(s + 1) * ks], w[:, s * ks:(s + 1) * ks].T, out=parts[s])

    def add_rmsnorm_partials(self, parts, residual, weight, eps, out):
        add_rmsnorm_partials(parts, residual, weight, eps, out)

    def linear_swiglu(self, x, w, gate_up, act, small_batch_gemv=False, skinny_gemm=False, stream_gemm=False):
        # (skinny_gemm, stream_gemm: the CUDA kernels' twins, kernels/gemm_skinny.py and gemm_stream.py, are this
        # same matmul + silu_mul in fp32)
        if small_batch_gemv and x.shape[0] <= GEMV_MAX_ROWS:  # the twin of CUDA's one-kernel path
            gemv_swiglu(x, w, act)
            return
        self.linear(x, w, gate_up)
        silu_mul(gate_up, act)

    def linear_rope(self, x, w, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads,
                    n_kv_heads, q_out, k_cache, v_cache, small_batch_gemv=False, skinny_gemm=False):
        # (the CUDA kernel's twin, kernels/gemm_skinny.py's gemm_skinny_rope, is this same matmul + rope_qkv)
        self.linear(x, w, qkv)
        rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out,
                 k_cache, v_cache)

    def norm_in_gemm_ok(self, rows: int, cfg, small_batch_gemv: bool) -> bool:
        # (norm_in_gemm is a GPU switch; where a test forces it, the twins run the branch at any row count)
        return cfg.hidden_size % 16 == 0

    def linear_norm(self, x, w, residual, norm_w, x_out, parts):
        gemm_skinny_norm(x, w, residual, norm_w, x_out, parts)  # (its projection: this backend's matmul)

    def launching(self, pdl: bool) -> "CpuBackend":
        return self  # no launches to overlap

    def fused_gemv_ok(self, rows: int, cfg) -> bool:
        return rows == 1  # as the CUDA backend decides (its GEMV path is for batch 1); the twins take any shape

    def decode_mlp_ok(self, rows: int, cfg) -> bool:
        return rows == 1  # as the CUDA backend decides for the shapes it fits

    embedding = staticmethod(embedding)
    decode_mlp = staticmethod(decode_mlp)
    gemv_fused = staticmethod(gemv_fused)
    add_rmsnorm = staticmethod(add_rmsnorm)
    silu_mul = staticmethod(silu_mul)
    silu_mul_scaled = staticmethod(silu_mul_scaled)
    rope_qkv = staticmethod(rope_qkv)

    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out,
                         max_seq_len=None, rope=None, tensor_cores=False):
        if rope is not None:  # the twin of the fused kernel: rope_qkv's twin into q, then the attention's
            qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping = rope
            rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, q.shape[1],
                     k_cache.shape[1], q, k_cache, v_cache)
        decode_attention(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out)

    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size,
                          scale, out, max_query_len=None, tensor_cores=False):
        prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale, out)

    # -- sparse prefill ops (kernels/sparse_prefill.cu, kernels/sparse_prefill.py) ------------------------
    # (and kernels/combine.cu, kernels/combine.py); the driver is toolkit/sparse.py.
    def sparse_compress_keys(self, k_cache, block_tables, seq_lens, block_size, R, kbar):
        _sp.compress_keys(k_cache, block_tables, seq_lens, block_size, R, kbar.shape[1], kbar)

    def sparse_query_means(self, q, query_start_loc, seq_lens, Q, r0, qbar, max_tiles=None):
        _sp.query_means(q, query_start_loc, seq_lens, Q, r0, qbar)

    def sparse_scores(self, qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores, max_tiles=None):
        _sp.indexer_scores(qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores)

    def sparse_topk(self, scores, query_start_loc, seq_lens, R, K, Q, r0, topk, rows=None):
        _sp.topk_blocks(None if scores is None else scores[:rows], query_start_loc, seq_lens, R, K, Q, r0, topk)

    def sparse_gather_lens(self, query_start_loc, seq_lens, W, out):
        _sp.gather_lens(query_start_loc, seq_lens, W, out)

    def combine_topk_swa_indices(self, topk, query_start_loc, seq_lens, gather_lens, W, R, K, M, N, out, lens):
        combine_topk_swa_indices(topk, query_start_loc, seq_lens, gather_lens, W, R, K, M, N, out, lens)

    def sparse_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, M, N,
                         W, R, block_size, scale, out):
        _sp.sparse_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, M, N,
                             W, R, block_size, scale, out)

    def sparse_tiled_ok(self, head_dim):
        return False  # the CPU keeps the per-query reference; the tiled twins are for tests

    def sparse_tile_union(self, query_start_loc, seq_lens, combined, lens, M, N, W, R, K, Q, ublk, umask, ucount):
        B = seq_lens.shape[0]
        _satc.tile_union(query_start_loc, seq_lens, combined, lens, M, N, W, R, K, Q, ublk.shape[0] // max(B, 1),
                         ublk.shape[1], ublk, umask, ucount)

    def sparse_attention_tiled(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask,
                               ucount, W, R, K, block_size, scale, out):
        B = seq_lens.shape[0]
        _satc.tiled_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask, ucount,
                              ublk.shape[0] // max(B, 1), W, R, K, block_size, scale, out)

    # -- sampler ops (kernels/sampler.cu, kernels/sampler.py) ---------------------------------------------------
    gumbel_sample = staticmethod(_smp.gumbel_sample)
    to_fp32 = staticmethod(_smp.to_fp32)
    add_entries = staticmethod(_smp.add_entries)
    apply_penalties = staticmethod(_smp.apply_penalties)
    temperature_min_p = staticmethod(_smp.temperature_min_p)
    top_k_top_p = staticmethod(_smp.top_k_top_p)
    logprobs = staticmethod(_smp.logprobs)

    # -- timing -------------------------------------------------------------------
    def section_timer(self) -> CpuTimer:
        return CpuTimer()

    def step_clock(self) -> CpuClock:
        return CpuClock()

    def synchronize(self):
        pass

    def bind_thread(self):
        pass

    def ids_to_host(self, dev, n: int) -> np.ndarray:
        return dev[:n].copy()
