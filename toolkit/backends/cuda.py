"""CUDA backend: cuBLAS for GEMMs, our CUDA C kernels (kernels/*.cu) for the rest.

Arrays are CuPy arrays in the compute dtype (bf16 is stored as uint16: the
same bits, and our kernels only need the pointer). Every launch goes to one
stream, which each step binds to the calling thread (CuPy's current stream is
per thread, and the engine may run on a worker thread).

GEMMs go through nvmath-python's cuBLAS binding with our stream and a
preallocated workspace set on the handle: that call can be captured in a CUDA
graph, while CuPy's own cuBLAS wrapper refuses to run during stream capture.
Without nvmath-python the backend falls back to CuPy's wrapper and reports
`graphs_supported = False`, so the engine runs every step eagerly.
"""
import copy
import ctypes
import os

import numpy as np

from toolkit.engine.timings import in_order
from .cuda_kernels import CudaKernels, decode_tc_pays
from .cuda_sampler import CudaSamplerKernels

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h).
_OP_N, _OP_T = 0, 1
_CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68  # fp32 accumulation; no TF32
_GEMM_DEFAULT = -1
_WORKSPACE_BYTES = 32 << 20  # cuBLAS workspace set on the handle (capture forbids cuBLAS allocating its own)
# Where our GEMV beats cuBLAS, measured on the H200 (benchmarks/results/bench_kernels.log, Qwen2.5-0.5B shapes):
# at one row the qkv/o/gate_up/down projections take 2.4-5.9 us against cuBLAS's ~9-17 us eager launches, and the
# whole batch-1 step went from 1.049 to 0.990 ms; at 2 and 4 rows, and for the 151,936-row lm_head (86.8 us
# against 67.4 us), cuBLAS is faster, so those stay on cuBLAS.
_GEMV_ROWS, _GEMV_MAX_N = 1, 32768
# From 2 to 32 rows (skinny_gemm) the small projections go to gemm_skinny (tensor cores, kernels/gemm_skinny.cu;
# a gate_up projection there takes SwiGLU in its epilogue): weights of up to _SKINNY_MAX_WEIGHTS elements, and up to
# _SKINNY_SMALL_WEIGHTS at up to _SKINNY_SMALL_ROWS rows. Measured on the H200 at Qwen2.5-0.5B
# (benchmarks/results/gemm_skinny.log): qkv and o (1.0M and 0.8M weights) take 2.7-3.8 us against cuBLAS's 3.9-4.2.
# At 32 rows gate_up (8.7M), down (4.4M) and the lm_head are faster on cuBLAS (7.3 / 7.6 / 73 us against 14.0 / 9.1
# / 118). down is faster here at 2-8 rows (6.7-7.0 against 7.3): in the decode step (skinny_max_5000000.log against
# ab_tc_skinny.log, one machine session) down here gave 0.766 against 0.795 ms at batch 8 and 0.883 against 0.863 at
# batch 32; gate_up here was slower at both (0.822 / 1.004, skinny_max_9000000.log).
# (TOOLKIT_SKINNY_MAX_WEIGHTS overrides the first limit, for A/B runs.)
_SKINNY_ROWS = (2, 32)
_SKINNY_SMALL_ROWS, _SKINNY_SMALL_WEIGHTS = 8, 6 << 20
_SKINNY_MAX_WEIGHTS = int(os.environ.get("TOOLKIT_SKINNY_MAX_WEIGHTS", 4 << 20))
# With stream_gemm, the projections of 2-32 rows whose weights gemm_skinny does not take, up to the MLP's size:
# gate_up and down (Qwen2.5-0.5B: 8.7M and 4.4M weights; -1.5B: 27.5M and 13.8M), not the lm_head (136M), which
# measured slower there than on cuBLAS (83.0 against 74.1 us at 32 rows, gemm_stream_dev.log).
# (qkv and o, 1.0M and 0.8M, stay on gemm_skinny or cuBLAS: its first design took 17-22 us there against 3-4.)
_STREAM_WEIGHTS = (2 << 20, 64 << 20)
# split_down: slices of K for the down projection (one strided-batched cuBLAS GEMM, no split-K reduce kernel; the
# next add_rmsnorm adds the fp32 partials), by rows. Measured on the H200 at Qwen2.5-0.5B (down_partials.log, the
# projection + the add_rmsnorm after it, weights from DRAM): at 2-32 rows 8 slices, 7.00-8.12 us against gemmEx +
# add_rmsnorm's 8.93-9.38 (4 slices 7.29-8.16); at 64 and 128 rows 4 slices, 8.40 / 8.75 against 9.69 / 10.09.
_DOWN_SLICES = ((32, 8), (128, 4))  # (up to rows, slices)


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

    def sections_ms(self) -> dict:
        ev = self._events
        ev[len(self._sections)].synchronize()
        return in_order((section, self._cp.cuda.get_elapsed_time(ev[i], ev[i + 1]))
                        for i, section in enumerate(self._sections))


class _StreamScope:
    """with: make the stream current; on exit make it current again (CuPy restores the previous one, which
    turned out not to be ours even when bind_thread had made it current)."""

    def __init__(self, stream):
        self._stream = stream

    def __enter__(self):
        self._stream.__enter__()

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        self._stream.use()


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
        try:
            self._gemm = _NvmathGemm(cp, self.stream)
            self.gemm_note = "cuBLAS via nvmath-python (capturable)"
        except ImportError:
            self._gemm = _CupyGemm(cp, self.stream)
            self.gemm_note = "cuBLAS via CuPy (nvmath-python missing: no CUDA graphs)"
        self.graphs_supported = self._gemm.capturable
        self._pdl_twin = None
        self._decode_tc = {}  # (B, Hq, Hkv, D, max_seq_len) -> decode_tc_pays (shared with the PDL twin)
        # griddepcontrol (kernels/pdl.cuh) exists from Hopper (sm_90) on, and the launch needs cuda-bindings (the
        # `cuda` extra); otherwise decode kernels launch plainly and the step records pdl as off.
        self.pdl_supported = int(cp.cuda.Device().compute_capability) >= 90 and _has_cuda_bindings()
        self._storage = {"float32": cp.float32, "float16": cp.float16, "bfloat16": cp.uint16}[dtype]
        self._in_type = _CUDA_TYPE[dtype]

    def launching(self, pdl: bool) -> "CudaBackend":
        """This backend, or (pdl) its twin whose decode-step kernels launch with programmatic dependent launch
        (cuda_launch.py): same stream, handles and weights' kernels, only the launch differs."""
        if not (pdl and self.pdl_supported):
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
    def _on_stream(self):
        """`with` this for allocations and copies: they go to our stream, and afterwards our stream is current
        again. (On the H200 run, with CuPy 14.2, leaving a plain `with self.stream:` left another stream current
        even after bind_thread: later launches then ran unsynchronised with the step's events.)"""
        return _StreamScope(self.stream)

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
        # The runner synchronises once per step (the sampled ids), so the pinned source is never
        # rewritten while this copy is still in flight.
        self.cp.cuda.runtime.memcpyAsync(dev.data.ptr + 4 * offset, host.ctypes.data + 4 * offset, n * 4,
                                         self.cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    def ids_to_host(self, dev, n: int) -> np.ndarray:
        """The step's one synchronisation: the sampled ids come back."""
        return dev[:n].get(stream=self.stream)

    # -- ops --------------------------------------------------------------------
    def linear(self, x, w, out, small_batch_gemv: bool = False, skinny_gemm: bool = False,
               stream_gemm: bool = False):
        """out[T, N] = x[T, K] @ w[N, K].T, fp32 accumulation: where asked and the shape fits, our GEMV (one row),
        our tensor-core gemm_skinny (2-32 rows, small weights) or gemm_stream (2-32 rows, the MLP's weights); else
        cuBLAS.

        cuBLAS is column-major: our row-major w[N, K] is its K x N matrix, so we ask
        for C(N x T) = op_T(w) @ x, which is exactly the row-major out[T, N].
        """
        T, K = x.shape
        N = w.shape[0]
        if small_batch_gemv and self._gemv_ok(T, N, K):
            self.kernels.gemv(x, w, out)
            return
        if skinny_gemm and self._skinny_ok(T, N, K):
            self.kernels.gemm_skinny(x, w, out)
            return
        if stream_gemm and self._stream_ok(T, N, K) and out.dtype != np.float32:
            self.kernels.gemm_stream(x, w, out)
            return
        out_type = 0 if out.dtype == np.float32 else self._in_type
        self._gemm(_OP_T, _OP_N, N, T, K, w.data.ptr, self._in_type, K, x.data.ptr, self._in_type, K,
                   out.data.ptr, out_type, N)

    def down_slices(self, rows: int, n: int, k: int) -> int:
        """Slices of K for split_down at this many rows: _DOWN_SLICES's, or the most below it that K takes, each
        slice a multiple of 8 columns (16-byte aligned for cuBLAS's tensor-core kernels). 0: not here (one row
        is our GEMV's; past 128 rows, or a K that takes no 2 slices)."""
        most = next((s for top, s in _DOWN_SLICES if 2 <= rows <= top), 0)
        S = next((s for s in range(most, 1, -1) if k % (8 * s) == 0), 0)
        return S

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

    def add_rmsnorm_partials(self, parts, residual, weight, eps, out):
        self.kernels.add_rmsnorm_partials(parts, residual, weight, eps, out)

    def norm_in_gemm_ok(self, rows: int, cfg, small_batch_gemv: bool) -> bool:
        """Whether a pure decode step of `rows` tokens (with skinny_gemm) can fold its post-attention add_rmsnorm
        into the o projection (linear_norm) and silu_mul_scaled: the o projection goes to gemm_skinny, not to our
        GEMV, H splits into 16-column tiles and I into 16-byte chunks."""
        H, Q = cfg.hidden_size, cfg.num_heads * cfg.head_dim
        return (self._skinny_ok(rows, H, Q) and H % 16 == 0 and cfg.intermediate_size % self.kernels.vec == 0
                and not (small_batch_gemv and self._gemv_ok(rows, H, Q)))

    def linear_norm(self, x, w, residual, norm_w, x_out, parts):
        self.kernels.gemm_skinny_norm(x, w, residual, norm_w, x_out, parts)

    def silu_mul_scaled(self, gate_up, parts, eps, out):
        self.kernels.silu_mul_scaled(gate_up, parts, eps, out)

    def linear_swiglu(self, x, w, gate_up, act, small_batch_gemv: bool = False, skinny_gemm: bool = False,
                      stream_gemm: bool = False):
        """act[T, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for w = gate_up [2I, K]: where our GEMV, gemm_skinny or
        gemm_stream takes the projection, one kernel with SwiGLU as its epilogue (gate_up is not written), else
        the GEMM into gate_up, then silu_mul. The same roundings either way."""
        T, K = x.shape
        if small_batch_gemv and self._gemv_ok(T, w.shape[0], K):
            self.kernels.gemv_swiglu(x, w, act)
            return
        if skinny_gemm and self._skinny_ok(T, w.shape[0], K):
            self.kernels.gemm_skinny(x, w, act, swiglu=True)
            return
        if stream_gemm and self._stream_ok(T, w.shape[0], K, swiglu=True):
            self.kernels.gemm_stream(x, w, act, swiglu=True)
            return
        self.linear(x, w, gate_up)
        self.kernels.silu_mul(gate_up, act)

    def linear_rope(self, x, w, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads,
                    n_kv_heads, q_out, k_cache, v_cache, small_batch_gemv: bool = False, skinny_gemm: bool = False):
        """qkv = x @ w.T, then rope_qkv (bias, RoPE, q -> q_out, K/V -> the caches): where gemm_skinny takes the
        projection (not our GEMV) and there are no q/k norms (they need the whole head; a tile holds 8 of its
        pairs), one kernel, gemm_skinny_rope, and qkv is not written. The same bits either way."""
        T, K = x.shape
        N = w.shape[0]
        if (skinny_gemm and q_norm is None and k_cache.shape[2] % 16 == 0 and self._skinny_ok(T, N, K)
                and not (small_batch_gemv and self._gemv_ok(T, N, K))):
            self.kernels.gemm_skinny_rope(x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out,
                                          k_cache, v_cache)
            return
        self.linear(x, w, qkv, small_batch_gemv, skinny_gemm)
        self.rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out,
                      k_cache, v_cache)

    def _gemv_ok(self, rows: int, n: int, k: int) -> bool:
        """Whether out[rows, n] = x[rows, k] @ w.T goes to our GEMV (when small_batch_gemv is on)."""
        return rows <= _GEMV_ROWS and n <= _GEMV_MAX_N and k % self.kernels.vec == 0

    def _skinny_ok(self, rows: int, n: int, k: int) -> bool:
        """Whether out[rows, n] = x[rows, k] @ w.T goes to gemm_skinny (when skinny_gemm is on): 16-bit types, a
        small weight matrix."""
        lo, hi = _SKINNY_ROWS
        most = _SKINNY_SMALL_WEIGHTS if rows <= _SKINNY_SMALL_ROWS else _SKINNY_MAX_WEIGHTS
        return lo <= rows <= hi and n * k <= most and k % 32 == 0 and self.kernels.itemsize == 2

    def _stream_ok(self, rows: int, n: int, k: int, swiglu: bool = False) -> bool:
        """Whether out = x[rows, k] @ w.T (w with n rows) goes to gemm_stream (when stream_gemm is on): 2-32 rows,
        the MLP's weights (_STREAM_WEIGHTS; the lm_head's are past it), a shape it takes (Hopper+, 16-bit)."""
        lo, hi = _STREAM_WEIGHTS
        return (_SKINNY_ROWS[0] <= rows <= _SKINNY_ROWS[1] and lo <= n * k <= hi
                and self.kernels.stream_ok(rows, n // 2 if swiglu else n, k, swiglu))

    def fused_gemv_ok(self, rows: int, cfg) -> bool:
        """Whether a step of `rows` tokens runs its projections as gemv_fused (the batch-1 GEMV path, with the
        RMSNorms, residual adds and SwiGLU folded into the GEMVs; see Model.forward): each of qkv, o, gate_up and
        down (n rows of k inputs) would go to the GEMV."""
        H, I, Q = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
        return all(self._gemv_ok(rows, n, k) for n, k in ((cfg.qkv_size, H), (H, Q), (2 * I, H), (H, I)))

    def decode_mlp_ok(self, rows: int, cfg) -> bool:
        """Whether a step of `rows` tokens can run its MLP blocks as decode_mlp (batch 1, Hopper+, the shape fits)."""
        return rows == 1 and self.kernels.decode_mlp_ok(cfg.hidden_size, cfg.intermediate_size)

    def decode_mlp(self, attn, h, norm_w, eps, w_gate_up, w_down, act):
        self.kernels.decode_mlp(attn, h, norm_w, eps, w_gate_up, w_down, act)

    def gemv_fused(self, x, w, y, kind, norm_weight=None, eps=0.0):
        self.kernels.gemv_fused(x, w, y, kind, norm_weight, eps)

    def embedding(self, ids, table, out):
        self.kernels.embedding(ids, table, out)

    def add_rmsnorm(self, x, residual, weight, eps, out):
        self.kernels.add_rmsnorm(x, residual, weight, eps, out)

    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads,
                 q_out, k_cache, v_cache):
        self.kernels.rope_qkv(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads,
                              n_kv_heads, q_out, k_cache, v_cache)

    def silu_mul(self, gate_up, out):
        self.kernels.silu_mul(gate_up, out)

    def decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, max_seq_len,
                         rope=None, tensor_cores=False):
        if tensor_cores:  # the tensor-core kernel where it measured faster (decode_tc_pays), per plan
            key = (q.shape[0], q.shape[1], k_cache.shape[1], q.shape[2], max_seq_len)
            tensor_cores = self._decode_tc.get(key)
            if tensor_cores is None:
                B, Hq, Hkv, D, _ = key
                tensor_cores = self._decode_tc[key] = decode_tc_pays(B, Hkv, Hq // Hkv, D, self.kernels.itemsize,
                                                                     self.kernels.num_sms, max_seq_len)
        self.kernels.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out,
                                      max_seq_len, rope, tensor_cores)

    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale,
                          out, max_query_len, tensor_cores=True):
        self.kernels.prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size,
                                       scale, out, max_query_len, tensor_cores=tensor_cores)

    # -- sparse prefill ops (kernels/sparse_prefill.cu, kernels/sparse_prefill.py) ------------------------
    # (and kernels/combine.cu, kernels/combine.py); launchers in cuda_sparse.py, driver in toolkit/sparse.py.
    @property
    def _sparse(self):
        sp = self.__dict__.get("_sparse_ops")
        if sp is None:
            from .cuda_sparse import CudaSparse
            sp = self.__dict__["_sparse_ops"] = CudaSparse(self.kernels)
        return sp

    def sparse_compress_keys(self, k_cache, block_tables, seq_lens, block_size, R, kbar):
        self._sparse.compress_keys(k_cache, block_tables, seq_lens, block_size, R, kbar)

    def sparse_query_means(self, q, query_start_loc, seq_lens, Q, r0, qbar, max_tiles):
        self._sparse.query_means(q, query_start_loc, seq_lens, Q, r0, qbar, max_tiles)

    def sparse_scores(self, qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores, max_tiles):
        self._sparse.scores(qbar, kbar, query_start_loc, seq_lens, R, Q, r0, scores, max_tiles)

    def sparse_topk(self, scores, query_start_loc, seq_lens, R, K, Q, r0, topk, rows):
        self._sparse.topk(scores, query_start_loc, seq_lens, R, K, Q, r0, topk, rows)

    def sparse_gather_lens(self, query_start_loc, seq_lens, W, out):
        self._sparse.gather_lens(query_start_loc, seq_lens, W, out)

    def combine_topk_swa_indices(self, topk, query_start_loc, seq_lens, gather_lens, W, R, K, M, N, out, lens):
        self._sparse.combine(topk, query_start_loc, seq_lens, gather_lens, W, R, K, M, N, out, lens)

    def sparse_attention(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, M, N,
                         W, R, block_size, scale, out):
        self._sparse.attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, combined, lens, M, N,
                               W, R, block_size, scale, out)

    def sparse_tiled_ok(self, head_dim):
        return self._sparse.tiled_ok(head_dim)

    def sparse_tile_union(self, query_start_loc, seq_lens, combined, lens, M, N, W, R, K, Q, ublk, umask, ucount):
        self._sparse.tile_union(query_start_loc, seq_lens, combined, lens, M, N, W, R, K, Q, ublk, umask, ucount)

    def sparse_attention_tiled(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask,
                               ucount, W, R, K, block_size, scale, out):
        self._sparse.attention_tiled(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, ublk, umask,
                                     ucount, W, R, K, block_size, scale, out)

    # -- sampler ops (kernels/sampler.cu, kernels/sampler.py) ---------------------------------------------------
    def gumbel_sample(self, logits, temperature, seeds, positions, out):
        self.sampler_kernels.gumbel_sample(logits, temperature, seeds, positions, out)

    def to_fp32(self, logits, out):
        self.sampler_kernels.to_fp32(logits, out)

    def add_entries(self, x, offsets, tokens, values):
        self.sampler_kernels.add_entries(x, offsets, tokens, values)

    def apply_penalties(self, x, offsets, tokens, counts, rep, freq, pres):
        self.sampler_kernels.apply_penalties(x, offsets, tokens, counts, rep, freq, pres)

    def temperature_min_p(self, x, temperature, min_p):
        self.sampler_kernels.temperature_min_p(x, temperature, min_p)

    def top_k_top_p(self, x, top_k, top_p):
        self.sampler_kernels.top_k_top_p(x, top_k, top_p)

    def logprobs(self, logits, sampled, n, top_ids, top_lp, sampled_lp, sampled_rank):
        self.sampler_kernels.logprobs(logits, sampled, n, top_ids, top_lp, sampled_lp, sampled_rank)

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
