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

from kernels import sampler as _smp
from kernels import sparse_attention_tc as _satc
from kernels import sparse_prefill as _sp
from kernels.activation import silu_mul, silu_mul_scaled
from kernels.combine import combine_topk_swa_indices
from kernels.decode_attention import decode_attention
from kernels.decode_attention_tc import decode_attention_tc, decode_attention_tc_stream
from kernels.embedding import embedding
from kernels.gemm_skinny import gemm_skinny, gemm_skinny_norm, gemm_skinny_rope, gemm_skinny_swiglu
from kernels.gemm_wg import gemm_wg_swiglu
from kernels.gemv import gemv, gemv_rope, gemv_swiglu
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm, add_rmsnorm_partials
from kernels.rope import rope_qkv
from toolkit.errors import ToolkitError


class CpuTimer:
    """Section laps on the host clock: NumPy/Numba work is synchronous, so wall time is device time."""

    def __init__(self):
        self._laps = []
        self._t = 0.0

    def start(self):
        self._laps.clear()
        self._t = time.perf_counter()

    def lap(self, section: str):
        now = time.perf_counter()
        self._laps.append((section, now - self._t))
        self._t = now

    def laps_ms(self) -> list:
        return [(section, dt * 1e3) for section, dt in self._laps]


class Done:
    """The CPU's Pending (cuda.py): the work already ran."""
    __slots__ = ("_result",)

    def __init__(self, result=None):
        self._result = result

    def wait(self):
        return self._result


class CpuClock:
    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        self._t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        return (self._t1 - self._t0) * 1e3


def blas_threads() -> int:
    """TOOLKIT_BLAS_THREADS (default 1; empty reads as unset), an integer >= 1."""
    text = os.environ.get("TOOLKIT_BLAS_THREADS") or "1"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ToolkitError(f"TOOLKIT_BLAS_THREADS must be an integer >= 1 (BLAS threads), got {text!r}")
    return n


class CpuBackend:
    name = "cpu"
    dtype = "float32"
    num_sms = 0  # (the plan's tensor-core decisions are for the GPU only)
    sm90 = False
    graphs_supported = pdl_supported = False
    asynchronous = False  # an op has run when it returns

    def __init__(self):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=blas_threads(), user_api="blas")

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

    def download(self, dev, host, n: int) -> "Done":
        host[:n] = dev[:n]  # a copy: the sampler's buffer is rewritten by the next step before this one is read
        return Done(host[:n])

    def copy_ids(self, src, dst, n: int):
        # A NaN row's -1 becomes token 0 here (the CUDA embedding reads an id out of range as a zero row; the CPU
        # twin refuses one): either way a row that will be dropped.
        np.maximum(src[:n], 0, out=dst[:n])

    def fence(self) -> "Done":
        return Done()

    # -- ops --------------------------------------------------------------------------------------------
    # Every op of the CUDA backend, as its CPU twin (kernels/<op>.py). The CPU's own plan uses BLAS and the plain
    # kernels; the twins of our GPU-only kernels run where a test hands the model a plan that names them.
    def linear(self, x, w, out):
        # HF layout: w is [out, in]; BLAS reads w.T without a copy.
        np.matmul(x, w.T, out=out)

    linear_tuned = linear  # (the GPU's choice between cuBLAS algorithms; one BLAS call here)

    def linear_partials(self, x, w, parts):
        S = parts.shape[0]
        ks = x.shape[1] // S
        for s in range(S):
            np.matmul(x[:, s * ks:(s + 1) * ks], w[:, s * ks:(s + 1) * ks].T, out=parts[s])

    # (the ops that are exactly their twin's function are set below the class)

    def with_pdl(self) -> "CpuBackend":
        return self  # no launches to overlap

    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, max_seq_len):
        decode_attention(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out)

    def decode_attention_tc(self, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, max_seq_len):
        # The tensor-core kernel's route, one split a sequence (the split count only moves the roundings).
        decode_attention_tc(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, 1)

    def decode_attention_stream(self, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out,
                                max_seq_len):
        decode_attention_tc_stream(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, 1)

    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale,
                          out, max_query_len):
        prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale, out)

    # The tensor-core prefill kernel computes the same function (kernels/prefill_attention.py is its twin too).
    prefill_attention_tc = prefill_attention_wg = prefill_attention

    # -- sparse prefill ops (kernels/sparse_prefill.cu, kernels/sparse_prefill.py) ------------------------
    # (and kernels/combine.cu, kernels/combine.py); the driver is toolkit/model/sparse.py.
    sparse_compress_keys = staticmethod(_sp.compress_keys)
    sparse_gather_lens = staticmethod(_sp.gather_lens)
    sparse_tile_union = staticmethod(_satc.tile_union)
    sparse_attention_tiled = staticmethod(_satc.tiled_attention)

    def sparse_query_means(self, q, query_start_loc, seq_lens, Q, r0, qbar, max_tiles=None):
        _sp.query_means(q, query_start_loc, seq_lens, Q, r0, qbar)

    def sparse_scores(self, qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores, max_tiles=None):
        _sp.indexer_scores(qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores)

    def sparse_topk(self, scores, query_start_loc, seq_lens, R, K, Q, r0, topk, rows=None):
        _sp.topk_blocks(None if scores is None else scores[:rows], query_start_loc, seq_lens, R, K, Q, r0, topk)

    # -- timing -------------------------------------------------------------------
    def section_timer(self) -> CpuTimer:
        return CpuTimer()

    def step_clock(self) -> CpuClock:
        return CpuClock()

    def synchronize(self):
        pass

    # A CPU "graph" is the step's function itself: nothing to record, replay runs it again.
    def capture(self, fn):
        fn()
        return fn

    def replay(self, graph):
        graph()

    def bind_thread(self):
        pass

    def ids_to_host(self, dev, n: int) -> np.ndarray:
        return dev[:n].copy()


# Backend ops that are exactly one CPU twin (kernels/<op>.py; the sampler's: kernels/sampler.py), as static methods.
for _twin in (embedding, add_rmsnorm, add_rmsnorm_partials, rope_qkv, silu_mul, silu_mul_scaled, gemv, gemv_swiglu,
              gemv_rope, gemm_skinny, gemm_skinny_swiglu, gemm_wg_swiglu, gemm_skinny_rope, gemm_skinny_norm,
              _smp.gumbel_sample, _smp.filter_sample, _smp.to_fp32, _smp.add_entries, _smp.apply_penalties,
              _smp.temperature_min_p, _smp.top_k_top_p, _smp.logprobs, combine_topk_swa_indices, _sp.sparse_attention):
    setattr(CpuBackend, _twin.__name__, staticmethod(_twin))
