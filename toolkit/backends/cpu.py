"""CPU backend: NumPy for GEMMs, our Numba/NumPy twins (kernels/*.py) for the rest.

Everything is float32: 16-bit checkpoints are upcast at load, which makes this
backend the reference the CUDA kernels are tested against.
"""
import numpy as np

from kernels.activation import silu_mul
from kernels.argmax import argmax
from kernels.decode_attention import decode_attention
from kernels.embedding import embedding
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm
from kernels.rope import rope_qkv

from ..timings import CpuTimer


class CpuBackend:
    name = "cpu"
    dtype = "float32"

    def __init__(self):
        self.start_pos = 0

    # -- memory ---------------------------------------------------------------
    def from_host(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float32)

    from_host_f32 = from_host

    def empty(self, shape, dtype=None) -> np.ndarray:
        return np.empty(shape, dtype=dtype or np.float32)

    def zeros(self, shape, dtype=None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype or np.float32)

    def to_host(self, a) -> np.ndarray:
        # A copy, as on the GPU: the model reuses its logits buffer on the next step.
        return np.array(a, dtype=np.float32)

    # -- step state -----------------------------------------------------------
    def begin_step(self, start_pos: int, ids: np.ndarray) -> np.ndarray:
        self.start_pos = start_pos
        return np.ascontiguousarray(ids, dtype=np.int32)

    # -- ops --------------------------------------------------------------------
    def linear(self, x, w, out):
        # HF layout: w is [out, in]; BLAS reads w.T without a copy.
        np.matmul(x, w.T, out=out)

    embedding = staticmethod(embedding)
    add_rmsnorm = staticmethod(add_rmsnorm)
    silu_mul = staticmethod(silu_mul)

    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, n_heads, n_kv_heads, q_out, k_cache, v_cache):
        rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, self.start_pos, n_heads, n_kv_heads,
                 q_out, k_cache, v_cache)

    def attention(self, q, k_cache, v_cache, scale, out):
        if q.shape[0] == 1:  # one new token: the decode kernel, over the whole cache so far
            decode_attention(q[0], k_cache, v_cache, self.start_pos + 1, scale, out[0])
        else:
            prefill_attention(q, k_cache, v_cache, self.start_pos, scale, out)

    def argmax(self, logits) -> int:
        return int(argmax(logits[-1]))

    # -- timing -------------------------------------------------------------------
    def timer(self) -> CpuTimer:
        return CpuTimer()

    def synchronize(self):
        pass
