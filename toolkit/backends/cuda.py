"""CUDA backend: cuBLAS for GEMMs, our CUDA C kernels (kernels/*.cu) for the rest.

Arrays are CuPy arrays in the compute dtype (bf16 is stored as uint16: the
same bits, and our kernels only need the pointer). Every launch goes to one
stream, which each step binds to the calling thread (CuPy's current stream is
per thread, and the engine may run on a worker thread).

GEMMs go through nvmath-python's cuBLAS binding with our stream and a
preallocated workspace set on the handle: that call can be captured in a CUDA
graph, while CuPy's own cuBLAS wrapper refuses to run during stream capture.
Without nvmath-python the backend falls back to CuPy's wrapper and reports
`graphs_supported = False`, so the engine runs every step eagerly. A prompt's
projections (the plan's "tuned") run whichever of gemmEx and cuBLASLt's
algorithms measured fastest for their shape (cuda_tuned.py).
"""
import contextlib
import copy
import ctypes
import functools
import operator

import numpy as np

from .cuda_kernels import CudaKernels
from .cuda_sampler import CudaSamplerKernels

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h).
_OP_N, _OP_T = 0, 1
_CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68  # fp32 accumulation; no TF32
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 << 20  # cuBLAS workspace set on the handle (capture forbids cuBLAS allocating its own)


class CudaTimer:
    """Section laps as CUDA events on the stream; read after the step's synchronisation."""

    def __init__(self, cp, stream, n_events: int = 1024):
        self._cp, self._stream = cp, stream
        self._events = [cp.cuda.Event() for _ in range(n_events)]
        self._sections = []

    def start(self):
        self._sections.clear()
        self._events[0].record(self._stream)

    def lap(self, section: str):
        self._sections.append(section)
        self._events[len(self._sections)].record(self._stream)

    def laps_ms(self) -> list:
        ev = self._events
        ev[len(self._sections)].synchronize()
        return [(section, self._cp.cuda.get_elapsed_time(ev[i], ev[i + 1])) for i, section in enumerate(self._sections)]


class Pending:
    """Work queued on the stream; wait() blocks until it has run and returns what it fills (the host side of a
    download, or None for a fence)."""
    __slots__ = ("_event", "_result")

    def __init__(self, event, result=None):
        self._event, self._result = event, result

    def wait(self):
        self._event.synchronize()
        return self._result


class CudaClock:
    """Two events around a whole step (graph replay or eager launches, plus sampling)."""

    def __init__(self, cp, stream):
        self._cp, self._stream = cp, stream
        self._start, self._stop = cp.cuda.Event(), cp.cuda.Event()

    def start(self):
        self._start.record(self._stream)

    def stop(self):
        self._stop.record(self._stream)

    def elapsed_ms(self) -> float:
        self._stop.synchronize()  # already complete once the step's tokens are on the host: no wait
        return self._cp.cuda.get_elapsed_time(self._start, self._stop)


class _NvmathGemm:
    """cublasGemmEx through nvmath-python: explicit stream and workspace, so it can be captured."""
    capturable = True

    def __init__(self, cp, stream):
        from nvmath.bindings import cublas

        self._cublas = cublas
        self._handle = cublas.create()
        cublas.set_stream(self._handle, stream.ptr)
        self._workspace = cp.empty(_WORKSPACE_BYTES, dtype=cp.uint8)
        cublas.set_workspace(self._handle, self._workspace.data.ptr, _WORKSPACE_BYTES)
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)  # host scalars (pointer mode host)
        self._alpha, self._beta = ctypes.addressof(self._one), ctypes.addressof(self._zero)

    def __call__(self, transa, transb, m, n, k, a, atype, lda, b, btype, ldb, c, ctype, ldc):
        self._cublas.gemm_ex(self._handle, transa, transb, m, n, k, self._alpha, a, atype, lda, b, btype, ldb,
                             self._beta, c, ctype, ldc, _COMPUTE_32F, _GEMM_DEFAULT)

    def tuned(self, cp, stream):
        """The measured-algorithm GEMM over this one (cuda_tuned.py): gemmEx is its baseline, the workspace shared."""
        from .cuda_tuned import TunedGemm
        return TunedGemm(cp, stream, self, self._workspace)

    def strided(self, transa, transb, m, n, k, a, atype, lda, sa, b, btype, ldb, sb, c, ctype, ldc, sc, count):
        self._cublas.gemm_strided_batched_ex(self._handle, transa, transb, m, n, k, self._alpha, a, atype, lda, sa,
                                             b, btype, ldb, sb, self._beta, c, ctype, ldc, sc, count, _COMPUTE_32F,
                                             _GEMM_DEFAULT)


class _CupyGemm:
    """CuPy's cuBLAS wrapper: fine eagerly, refused inside stream capture."""
    capturable = False

    def __init__(self, cp, stream):
        from cupy_backends.cuda.libs import cublas

        self._cublas = cublas
        self._handle = cp.cuda.device.get_cublas_handle()
        self._stream = stream
        self._one, self._zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    def __call__(self, transa, transb, m, n, k, a, atype, lda, b, btype, ldb, c, ctype, ldc):
        self._cublas.setStream(self._handle, self._stream.ptr)
        self._cublas.gemmEx(self._handle, transa, transb, m, n, k, self._one.ctypes.data, a, atype, lda, b,
                            btype, ldb, self._zero.ctypes.data, c, ctype, ldc, _COMPUTE_32F, _GEMM_DEFAULT)

    def strided(self, transa, transb, m, n, k, a, atype, lda, sa, b, btype, ldb, sb, c, ctype, ldc, sc, count):
        self._cublas.setStream(self._handle, self._stream.ptr)
        self._cublas.gemmStridedBatchedEx(self._handle, transa, transb, m, n, k, self._one.ctypes.data, a, atype,
                                          lda, sa, b, btype, ldb, sb, self._zero.ctypes.data, c, ctype, ldc, sc,
                                          count, _COMPUTE_32F, _GEMM_DEFAULT)


def _has_cuda_bindings() -> bool:
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


class CudaBackend:
    name = "cuda"

    def __init__(self, dtype: str = "bfloat16"):
        import cupy as cp

        if dtype not in _CUDA_TYPE:
            raise ValueError(f"unsupported CUDA compute dtype {dtype!r}")
        self.cp = cp
        self.dtype = dtype
        self.kernels = CudaKernels(dtype)
        self.sampler_kernels = CudaSamplerKernels(dtype)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.asynchronous = True  # ops are queued on the stream: a launch returns before its work is done
        try:
            self._gemm = _NvmathGemm(cp, self.stream)
            self.gemm_note = "cuBLAS via nvmath-python (capturable)"
        except ImportError:
            self._gemm = _CupyGemm(cp, self.stream)
            self.gemm_note = "cuBLAS via CuPy (nvmath-python missing: no CUDA graphs)"
        self.graphs_supported = self._gemm.capturable
        self.num_sms, self.sm90 = self.kernels.num_sms, self.kernels.sm90
        self._pdl_twin = None
        # griddepcontrol (kernels/pdl.cuh) exists from Hopper (sm_90) on, and the launch needs cuda-bindings (the
        # `cuda` extra); otherwise decode kernels launch plainly and the step records pdl as off.
        self.pdl_supported = int(cp.cuda.Device().compute_capability) >= 90 and _has_cuda_bindings()
        self._storage = {"float32": cp.float32, "float16": cp.float16, "bfloat16": cp.uint16}[dtype]
        self._in_type = _CUDA_TYPE[dtype]

    def with_pdl(self) -> "CudaBackend":
        """The twin of this backend whose kernels launch with programmatic dependent launch (cuda_launch.py):
        same stream, handles and weights, only the launch differs (this backend itself where PDL is not
        supported)."""
        if not self.pdl_supported:
            return self
        if self._pdl_twin is None:
            twin = copy.copy(self)
            twin.kernels = self.kernels.with_pdl()
            twin._pdl_twin = twin
            self._pdl_twin = twin
        return self._pdl_twin

    def bind_thread(self):
        """Make our stream the calling thread's current CuPy stream (kernels launch on it)."""
        self.stream.use()

    # -- memory ---------------------------------------------------------------
    @contextlib.contextmanager
    def _on_stream(self):
        """`with` this for allocations and copies: they go to our stream, and afterwards our stream is current
        again. (On the H200 run, with CuPy 14.2, leaving a plain `with self.stream:` left another stream current
        even after bind_thread: later launches then ran unsynchronised with the step's events.)"""
        try:
            with self.stream:
                yield
        finally:
            self.stream.use()

    def from_host(self, a: np.ndarray):
        """Host array (any float dtype) -> device array in the compute dtype."""
        import ml_dtypes

        target = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[self.dtype]
        a = np.ascontiguousarray(a.astype(target, copy=False))
        if self.dtype == "bfloat16":
            a = a.view(np.uint16)
        with self._on_stream():
            return self.cp.asarray(a)

    def from_host_f32(self, a: np.ndarray):
        with self._on_stream():
            return self.cp.asarray(np.ascontiguousarray(a, dtype=np.float32))

    def empty(self, shape, dtype=None):
        with self._on_stream():
            return self.cp.empty(shape, dtype=dtype or self._storage)

    def to_host(self, a) -> np.ndarray:
        """Device array -> float32 NumPy array (synchronizes)."""
        h = self.cp.asnumpy(a, stream=self.stream)
        self.stream.synchronize()
        if h.dtype == np.uint16:  # bf16 bits -> fp32 is a 16-bit shift, exact
            return (h.astype(np.uint32) << 16).view(np.float32)
        return h.astype(np.float32, copy=False)

    def int_buffer(self, n: int) -> tuple:
        """Pinned host int32[n] + device int32[n]: staging copies are then truly asynchronous."""
        mem = self.cp.cuda.alloc_pinned_memory(n * 4)
        host = np.frombuffer(mem, np.int32, n)
        host[:] = 0
        with self._on_stream():
            return host, self.cp.zeros(n, self.cp.int32)

    def upload(self, host, dev, n: int, offset: int = 0):
        """dev[offset:offset+n] = host[offset:offset+n], asynchronously on our stream."""
        # The pinned source must not be rewritten before this copy has run: the runner waits on a fence()
        # recorded after a step's uploads before it writes the next step's (one step may still be queued).
        self.cp.cuda.runtime.memcpyAsync(dev.data.ptr + 4 * offset, host.ctypes.data + 4 * offset, n * 4,
                                         self.cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    def download(self, dev, host, n: int) -> "Pending":
        """host[:n] = dev[:n] (int32, host pinned from int_buffer), asynchronously; wait() returns host[:n]."""
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(host.ctypes.data, dev.data.ptr, n * 4, rt.memcpyDeviceToHost, self.stream.ptr)
        return Pending(self._record(), host[:n])

    def copy_ids(self, src, dst, n: int):
        """dst[:n] = src[:n] on the device (int32), asynchronously: a step fed the tokens its predecessor sampled."""
        rt = self.cp.cuda.runtime
        if n:
            rt.memcpyAsync(dst.data.ptr, src.data.ptr, n * 4, rt.memcpyDeviceToDevice, self.stream.ptr)

    def fence(self) -> "Pending":
        """A mark after everything queued so far; wait() blocks until the GPU has reached it."""
        return Pending(self._record())

    def _record(self):
        ev = self.cp.cuda.Event(block=False, disable_timing=True)
        ev.record(self.stream)
        return ev

    def ids_to_host(self, dev, n: int) -> np.ndarray:
        """int32 dev[:n] on the host (synchronises; logprobs' arrays: the sampled ids come back by download)."""
        return dev[:n].get(stream=self.stream)

    # -- ops ----------------------------------------------------------------------------------------------
    # The plan (toolkit/model/plan.py) names one op per kernel; most are exactly one of our kernels and are
    # forwarded to their launchers below the class (KERNEL_OPS, SAMPLER_OPS, SPARSE_OPS).
    def linear(self, x, w, out):
        """out[T, N] = x[T, K] @ w[N, K].T on cuBLAS, fp32 accumulation (out in the compute dtype or fp32).

        cuBLAS is column-major: our row-major w[N, K] is its K x N matrix, so we ask
        for C(N x T) = op_T(w) @ x, which is exactly the row-major out[T, N].
        """
        T, K = x.shape
        N = w.shape[0]
        out_type = 0 if out.dtype == np.float32 else self._in_type
        self._gemm(_OP_T, _OP_N, N, T, K, w.data.ptr, self._in_type, K, x.data.ptr, self._in_type, K,
                   out.data.ptr, out_type, N)

    def linear_tuned(self, x, w, out):
        """linear's product by the algorithm measured fastest for its (N, K, row bucket): gemmEx's or one of
        cuBLASLt's (cuda_tuned.py; the first call of a bucket measures, so it must not be inside a capture to
        count). Without nvmath-python: linear."""
        if self._tuned is None:
            return self.linear(x, w, out)
        T, K = x.shape
        out_type = 0 if out.dtype == np.float32 else self._in_type
        self._tuned(w.shape[0], T, K, w.data.ptr, x.data.ptr, out.data.ptr, self._in_type, out_type)

    @functools.cached_property
    def _tuned(self):
        return self._gemm.tuned(self.cp, self.stream) if isinstance(self._gemm, _NvmathGemm) else None

    def linear_partials(self, x, w, parts):
        """parts[s] = x[:, sK:(s+1)K] @ w[:, sK:(s+1)K].T in fp32 for S = parts.shape[0] slices of K columns each:
        one strided-batched cuBLAS call, no reduce kernel (add_rmsnorm_partials adds the slices)."""
        T, K = x.shape
        S, N = parts.shape[0], w.shape[0]
        if K % S or (K // S) % 8 or parts.shape != (S, T, N) or parts.dtype != np.float32:
            raise ValueError(f"linear_partials: x {x.shape}, w {w.shape}, parts {parts.shape} {parts.dtype} "
                             f"(float32 [S, T, N], K / S a multiple of 8)")
        ks = K // S
        self._gemm.strided(_OP_T, _OP_N, N, T, ks, w.data.ptr, self._in_type, K, ks, x.data.ptr, self._in_type, K,
                           ks, parts.data.ptr, 0, N, T * N, S)

    @functools.cached_property
    def _sparse(self):
        from toolkit.backends.cuda_sparse import CudaSparse
        return CudaSparse(self.kernels)

    # -- graphs and timing ---------------------------------------------------------------
    def capture(self, fn):
        """Run fn() under stream capture and return the CUDA graph (replay with graph.launch(stream))."""
        # Relaxed: other threads' CUDA calls (a UI, CuPy's allocator) are not forbidden during the capture.
        self.stream.begin_capture(self.cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            fn()
        finally:
            graph = self.stream.end_capture()
        return graph

    def replay(self, graph):
        graph.launch(self.stream)

    def section_timer(self) -> CudaTimer:
        return CudaTimer(self.cp, self.stream)

    def step_clock(self) -> CudaClock:
        return CudaClock(self.cp, self.stream)

    def synchronize(self):
        self.stream.synchronize()


# Backend ops that are exactly one launcher: (the object that holds it, {backend op: its method there}).
KERNEL_OPS = ("kernels", {n: n for n in (
    "embedding", "add_rmsnorm", "add_rmsnorm_partials", "rope_qkv", "silu_mul", "silu_mul_scaled", "gemv",
    "gemv_swiglu", "gemv_rope", "gemm_skinny", "gemm_skinny_swiglu", "gemm_wg_swiglu", "gemm_skinny_rope",
    "gemm_skinny_norm", "decode_attention", "decode_attention_tc", "decode_attention_stream", "prefill_attention",
    "prefill_attention_tc", "prefill_attention_wg")})
SAMPLER_OPS = ("sampler_kernels", {n: n for n in (
    "gumbel_sample", "filter_sample", "to_fp32", "add_entries", "apply_penalties", "temperature_min_p", "top_k_top_p",
    "logprobs")})
# (kernels/sparse_prefill.cu, sparse_attention_tc.cu and combine.cu; launchers in cuda_sparse.py, driver in
# toolkit/model/sparse.py)
SPARSE_OPS = ("_sparse", {
    "sparse_compress_keys": "compress_keys", "sparse_query_means": "query_means", "sparse_scores": "scores",
    "sparse_topk": "topk", "sparse_gather_lens": "gather_lens", "combine_topk_swa_indices": "combine",
    "sparse_attention": "attention", "sparse_tile_union": "tile_union",
    "sparse_attention_tiled": "attention_tiled"})


for _holder, _ops in (KERNEL_OPS, SAMPLER_OPS, SPARSE_OPS):
    for _op, _method in _ops.items():
        setattr(CudaBackend, _op, property(operator.attrgetter(f"{_holder}.{_method}"), doc=f"{_holder}.{_method}"))
