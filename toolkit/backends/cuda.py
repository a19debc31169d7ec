"""CUDA backend: cuBLAS for GEMMs, our CUDA C kernels (kernels/*.cu) for the rest.

Arrays are CuPy arrays in the compute dtype (bf16 is stored as uint16: the
same bits, and our kernels only need the pointer). Every launch goes to one
stream; nothing here synchronizes with the host except `argmax`/`to_host`,
which end a step by bringing the chosen token back.
"""
import numpy as np

from ..timings import SECTIONS
from .cuda_kernels import CudaKernels

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h).
_OP_N, _OP_T = 0, 1
_CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68  # fp32 accumulation; no TF32 unless CUPY_TF32=1 asks for it
_GEMM_DEFAULT = -1


class CudaTimer:
    """Laps as CUDA events on the stream; read once per step after the last one completes."""

    def __init__(self, cp, stream, n_events: int = 512):
        self._cp, self._stream = cp, stream
        self._events = [cp.cuda.Event() for _ in range(n_events)]
        self._sections = []

    def start(self):
        self._sections.clear()
        self._events[0].record(self._stream)

    def lap(self, section: str):
        self._sections.append(section)
        self._events[len(self._sections)].record(self._stream)

    def sections_ms(self) -> dict:
        out = dict.fromkeys(SECTIONS, 0.0)
        ev = self._events
        ev[len(self._sections)].synchronize()
        for i, section in enumerate(self._sections):
            out[section] += self._cp.cuda.get_elapsed_time(ev[i], ev[i + 1])
        return out


class CudaBackend:
    name = "cuda"

    def __init__(self, dtype: str = "bfloat16"):
        import cupy as cp
        from cupy_backends.cuda.libs import cublas

        if dtype not in _CUDA_TYPE:
            raise ValueError(f"unsupported CUDA compute dtype {dtype!r}")
        self.cp, self._cublas = cp, cublas
        self.dtype = dtype
        self.kernels = CudaKernels(dtype)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._handle = cp.cuda.device.get_cublas_handle()
        cublas.setPointerMode(self._handle, 0)  # alpha/beta are host scalars
        self._one = np.ones(1, np.float32)
        self._zero = np.zeros(1, np.float32)
        self._storage = {"float32": cp.float32, "float16": cp.float16, "bfloat16": cp.uint16}[dtype]
        # Step state lives on the device (see backends/__init__.py).
        self.start_pos_dev = cp.zeros(1, dtype=cp.int32)
        self._ids_dev = cp.zeros(1, dtype=cp.int32)
        self._step_host = np.zeros(1, np.int32)
        self.start_pos = 0
        # Fast-path switch: tensor-core prefill attention (False: the generic fp32-math kernel).
        self.tensor_cores = dtype != "float32"

    # -- memory ---------------------------------------------------------------
    def from_host(self, a: np.ndarray):
        """Host array (any float dtype) -> device array in the compute dtype."""
        import ml_dtypes

        target = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[self.dtype]
        a = np.ascontiguousarray(a.astype(target, copy=False))
        if self.dtype == "bfloat16":
            a = a.view(np.uint16)
        with self.stream:
            return self.cp.asarray(a)

    def from_host_f32(self, a: np.ndarray):
        """Host array -> float32 device array (tables that stay fp32 whatever the dtype)."""
        with self.stream:
            return self.cp.asarray(np.ascontiguousarray(a, dtype=np.float32))

    def empty(self, shape, dtype=None):
        with self.stream:
            return self.cp.empty(shape, dtype=dtype or self._storage)

    def zeros(self, shape, dtype=None):
        with self.stream:
            return self.cp.zeros(shape, dtype=dtype or self._storage)

    def to_host(self, a) -> np.ndarray:
        """Device array -> float32 NumPy array (synchronizes)."""
        h = self.cp.asnumpy(a, stream=self.stream)
        self.stream.synchronize()
        if h.dtype == np.uint16:  # bf16 bits -> fp32 is a 16-bit shift, exact
            return (h.astype(np.uint32) << 16).view(np.float32)
        return h.astype(np.float32, copy=False)

    # -- step state -----------------------------------------------------------
    def begin_step(self, start_pos: int, ids: np.ndarray):
        self.stream.use()  # every launch of this thread goes to our stream
        self.start_pos = start_pos
        if self._ids_dev.size < len(ids):
            self._ids_dev = self.cp.empty(max(len(ids), 1), dtype=self.cp.int32)
        ids_dev = self._ids_dev[: len(ids)]
        ids_dev.set(np.asarray(ids, dtype=np.int32), stream=self.stream)
        self._step_host[0] = start_pos
        self.start_pos_dev.set(self._step_host, stream=self.stream)
        return ids_dev

    # -- ops --------------------------------------------------------------------
    def linear(self, x, w, out):
        """out[T, N] = x[T, K] @ w[N, K].T through cuBLAS, fp32 accumulation.

        cuBLAS is column-major: our row-major w[N, K] is its K x N matrix, so we ask
        for C(N x T) = op_T(w) @ x, which is exactly the row-major out[T, N].
        """
        T, K = x.shape
        N = w.shape[0]
        out_type = 0 if out.dtype == np.float32 else _CUDA_TYPE[self.dtype]
        in_type = _CUDA_TYPE[self.dtype]
        self._cublas.gemmEx(
            self._handle, _OP_T, _OP_N, N, T, K,
            self._one.ctypes.data, w.data.ptr, in_type, K, x.data.ptr, in_type, K,
            self._zero.ctypes.data, out.data.ptr, out_type, N, _COMPUTE_32F, _GEMM_DEFAULT)

    def embedding(self, ids, table, out):
        self.kernels.embedding(ids, table, out)

    def add_rmsnorm(self, x, residual, weight, eps, out):
        self.kernels.add_rmsnorm(x, residual, weight, eps, out)

    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, n_heads, n_kv_heads, q_out, k_cache, v_cache):
        self.kernels.rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, self.start_pos_dev,
                              n_heads, n_kv_heads, q_out, k_cache, v_cache)

    def silu_mul(self, gate_up, out):
        self.kernels.silu_mul(gate_up, out)

    def attention(self, q, k_cache, v_cache, scale, out):
        if q.shape[0] == 1:
            self.kernels.decode_attention(q[0], k_cache, v_cache, self.start_pos_dev, scale, out[0])
        else:
            self.kernels.prefill_attention(q, k_cache, v_cache, self.start_pos_dev, scale, out,
                                           tensor_cores=self.tensor_cores)

    def argmax(self, logits) -> int:
        if not hasattr(self, "_argmax_out"):
            self._argmax_out = self.cp.zeros(1, dtype=self.cp.int32)
        self.kernels.argmax(logits[-1:], self._argmax_out)
        return int(self._argmax_out.get(stream=self.stream)[0])  # the step's one sync

    # -- timing -------------------------------------------------------------------
    def timer(self) -> CudaTimer:
        return CudaTimer(self.cp, self.stream)

    def synchronize(self):
        self.stream.synchronize()
