"""Launchers for the sampler's CUDA kernels (kernels/sampler.cu) on CuPy arrays; CPU twin: kernels/sampler.py.

    logits [R, V] (bf16 as uint16 bits, fp16, fp32) --to_fp32--> x f32[R, V]
    x: add_entries, apply_penalties, temperature_min_p, top_k_top_p (in place)
    logits or x --gumbel_sample--> out int32[R];   raw logits --logprobs--> top ids / logprobs, rank
    logits --filter_sample--> out int32[R] for the fast path's processing rows (no FP32 copy)

Every launch is a few host checks plus kernel launches on the current CuPy stream: no host synchronisation, no
allocation, no host->device copy, and grids that depend only on (R, V), so a launch sequence can be captured in
a CUDA graph and replayed with new data in the same buffers. The per-row workspaces (argmax merge keys, block
counters, row maxima, gumbel_sample's shared bounds) start zeroed and the kernels leave them zeroed; they are
allocated by `reserve(rows)` (or by the first eager launch with more rows than reserved: do one eager launch, or
call reserve, before capturing).
One workspace per CudaSamplerKernels: use one stream per object.
"""
import numpy as np

from kernels.sampler import HIST_CAP, VOCAB_CAP
from .cuda_kernels import _module, _i32, CTYPES, gumbel_cpt

GS_THREADS = 256    # sampler.cu: GS_THREADS (a gumbel_sample block)
GS_BLOCKS = 3       # sampler.cu: GS_BLOCKS (gumbel_sample blocks an SM holds)
ROW_CHUNK = 4096     # sampler.cu: ROW_CHUNK (values per temperature / min_p block)
SEL_THREADS = 1024   # sampler.cu: SEL_THREADS (logprobs: one block per row)
FILTER_THREADS = 1024  # sampler.cu: FILTER_THREADS (top_k_top_p and filter_sample: one block per row)
SMEM_DEFAULT = 48 * 1024  # above this a kernel opts in to more dynamic shared memory
LIST_BYTES = 4 << 15  # sampler.cu: the 16-bit histogram, or the fp32 route's coarse histogram and candidate list
MAX_LOGPROBS = 20
I32, F32, U32 = np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.uint32)
_CTYPE_OF = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half", np.dtype(np.uint16): "__nv_bfloat16"}


def gumbel_splits(sms: int, R: int, V: int) -> int:
    """Blocks per row of gumbel_sample: as many as fill one wave of the GPU (GS_BLOCKS an SM), and no more than
    leave each block 128 of the row's 16-token chunks. At V = 151,936 on 132 SMs: 3 a row at B = 128 (each thread
    6-7 steps of 2 chunks), 12 at B = 32, 74 at B = 1."""
    return max(1, min(sms * GS_BLOCKS // R, -(-V // 16) // 128))


class CudaSamplerKernels:
    """The sampler ops on CuPy arrays. `dtype` is the model's compute dtype; the logits inputs may be that
    dtype's storage (bf16 = uint16) or fp32 (the processed copy): each op picks its instantiation per call."""

    def __init__(self, dtype: str):
        import cupy

        if dtype not in CTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(CTYPES)}")
        self.cp, self.dtype = cupy, dtype
        self._fns = {}
        self._optin = {}  # (kernel, ctype) -> the dynamic shared memory opted in
        self._rows = 0
        self._sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self._ws = self._counters = self._rowmax = self._row_key = None

    def _fn(self, name: str, ctype: str = "float", *more):
        key = (name, ctype) + more
        if key not in self._fns:
            self._fns[key] = _module("sampler", ctype).get_function(f"{name}<{', '.join(map(str, key[1:]))}>")
        return self._fns[key]

    def reserve(self, rows: int):
        """Allocate the zeroed per-row workspaces for up to `rows` rows (once; outside any graph capture)."""
        if rows > self._rows:
            cp = self.cp
            self._ws = cp.zeros(rows, cp.uint64)
            self._counters = cp.zeros(rows, cp.uint32)
            self._rowmax = cp.zeros(rows, cp.uint32)
            self._row_key = cp.zeros(rows, cp.uint32)  # gumbel_sample: the best key a row's blocks know so far
            self._rows = rows

    # -- checks ---------------------------------------------------------------------------------------------------
    def _arr(self, op, dtype, shape, **arrays):
        for name, a in arrays.items():
            if not isinstance(a, self.cp.ndarray):
                raise ValueError(f"{op}: {name} must be a CuPy array, got {type(a).__name__}")
            if a.dtype != dtype or not a.flags.c_contiguous or a.shape != shape:
                strided = "" if a.flags.c_contiguous else " (strided)"
                raise ValueError(f"{op}: {name} must be a C-contiguous {np.dtype(dtype).name} array of shape "
                                 f"{shape}, got {a.dtype} shape {a.shape}{strided}")

    def _logits(self, op, logits):
        ct = _CTYPE_OF.get(np.dtype(logits.dtype))
        if ct is None or not isinstance(logits, self.cp.ndarray) or logits.ndim != 2 or not logits.flags.c_contiguous:
            raise ValueError(f"{op}: logits must be a C-contiguous [R, V] float32/float16/uint16(bf16) array, got "
                             f"{logits.dtype} shape {logits.shape}")
        return ct, logits.shape

    def _x32(self, op, x):
        if not isinstance(x, self.cp.ndarray) or x.dtype != F32 or x.ndim != 2 or not x.flags.c_contiguous:
            raise ValueError(f"{op}: x must be a C-contiguous float32 [R, V] array, got {x.dtype} shape {x.shape}")
        return x.shape

    # -- ops ---------------------------------------------------------------------------------------------------------
    def gumbel_sample(self, logits, temperature, seeds, positions, out):
        ct, (R, V) = self._logits("gumbel_sample", logits)
        self._arr("gumbel_sample", F32, (R,), temperature=temperature)
        self._arr("gumbel_sample", U32, (R, 2), seeds=seeds)
        self._arr("gumbel_sample", I32, (R,), positions=positions, out=out)
        if not R or not V:
            return
        self.reserve(R)
        s = gumbel_splits(self._sms, R, V)
        self._fn("gumbel_sample", ct, gumbel_cpt(ct))((R * s,), (GS_THREADS,), (
            logits, _i32(V), _i32(s), temperature, seeds, positions, self._ws, self._row_key, self._counters,
            out))

    def to_fp32(self, logits, out):
        ct, shape = self._logits("to_fp32", logits)
        self._arr("to_fp32", F32, shape, out=out)
        n = logits.size
        if n:
            blocks = max(1, min(-(-n // 1024), 65536))
            self._fn("to_fp32", ct)((blocks,), (256,), (logits, out, np.int64(n)))

    def _csr(self, op, R, offsets, tokens, dtype, **entries):
        self._arr(op, I32, (R + 1,), offsets=offsets)
        self._arr(op, I32, tokens.shape, tokens=tokens)
        self._arr(op, dtype, tokens.shape, **entries)  # shaped like tokens

    def add_entries(self, x, offsets, tokens, values):
        R, V = self._x32("add_entries", x)
        self._csr("add_entries", R, offsets, tokens, F32, values=values)
        if R:
            self._fn("add_entries")((R,), (128,), (x, _i32(V), offsets, tokens, values))

    def apply_penalties(self, x, offsets, tokens, counts, rep, freq, pres):
        R, V = self._x32("apply_penalties", x)
        self._csr("apply_penalties", R, offsets, tokens, I32, counts=counts)
        self._arr("apply_penalties", F32, (R,), rep=rep, freq=freq, pres=pres)
        if R:
            self._fn("apply_penalties")((R,), (128,), (x, _i32(V), offsets, tokens, counts, rep, freq, pres))

    def temperature_min_p(self, x, temperature, min_p):
        R, V = self._x32("temperature_min_p", x)
        self._arr("temperature_min_p", F32, (R,), temperature=temperature, min_p=min_p)
        if not R or not V:
            return
        self.reserve(R)
        grid = (-(-V // ROW_CHUNK), R)
        self._fn("temperature_max")(grid, (256,), (x, _i32(V), temperature, min_p, self._rowmax))
        self._fn("min_p_mask")(grid, (256,), (x, _i32(V), temperature, min_p, self._rowmax, self._counters))

    def top_k_top_p(self, x, top_k, top_p):
        R, V = self._x32("top_k_top_p", x)
        self._arr("top_k_top_p", I32, (R,), top_k=top_k)
        self._arr("top_k_top_p", F32, (R,), top_p=top_p)
        if R and V:
            self._big("top_k_top_p", "float", LIST_BYTES)((R,), (FILTER_THREADS,), (x, _i32(V), top_k, top_p),
                                                         shared_mem=LIST_BYTES)

    def filter_sample(self, logits, temperature, top_k, top_p, min_p, rep, freq, pres, sample_temp, seeds, positions,
                      bias_off, bias_tok, bias_val, pen_off, pen_tok, pen_cnt, ban_off, ban_tok, ban_val, ws_tok,
                      ws_val, out):
        ct, (R, V) = self._logits("filter_sample", logits)
        self._arr("filter_sample", F32, (R,), temperature=temperature, top_p=top_p, min_p=min_p, rep=rep, freq=freq,
                  pres=pres, sample_temp=sample_temp)
        self._arr("filter_sample", I32, (R,), top_k=top_k, positions=positions, out=out)
        self._arr("filter_sample", U32, (R, 2), seeds=seeds)
        self._csr("filter_sample", R, bias_off, bias_tok, F32, bias_val=bias_val)
        self._csr("filter_sample", R, pen_off, pen_tok, I32, pen_cnt=pen_cnt)
        self._csr("filter_sample", R, ban_off, ban_tok, F32, ban_val=ban_val)
        # a row's history beyond HIST_CAP entries lives at its CSR starts' sum in the workspace
        n_ws = bias_tok.size + pen_tok.size + ban_tok.size
        self._arr("filter_sample", I32, (n_ws,), ws_tok=ws_tok[:n_ws])
        self._arr("filter_sample", F32, (n_ws,), ws_val=ws_val[:n_ws])
        if V > VOCAB_CAP:
            raise ValueError(f"filter_sample: V = {V} is above the fast path's {VOCAB_CAP} (the gate sends it slow)")
        if not R or not V:
            return
        # the history bitmap, HIST_CAP (token, value) pairs, the row's 16-bit histogram or fp32 list (128 KB), and
        # the largest 16-bit value of each chunk of 16 tokens
        smem = 16 * ((V + 127) // 128) + 8 * HIST_CAP + LIST_BYTES + 4 * ((V + 31) // 32)
        self._big("filter_sample", ct, smem)((R,), (FILTER_THREADS,), (
            logits, _i32(V), temperature, top_k, top_p, min_p, rep, freq, pres, sample_temp, seeds, positions, bias_off,
            bias_tok, bias_val, pen_off, pen_tok, pen_cnt, ban_off, ban_tok, ban_val, ws_tok, ws_val, out),
            shared_mem=smem)

    def _big(self, name, ct, smem):
        """The kernel, opted in (once per instantiation: cudaFuncSetAttribute) to smem bytes of dynamic shared
        memory."""
        f = self._fn(name, ct)
        if smem > SMEM_DEFAULT and self._optin.get((name, ct), 0) < smem:
            f.max_dynamic_shared_size_bytes = smem
            self._optin[(name, ct)] = smem
        return f

    def logprobs(self, logits, sampled, n, top_ids, top_lp, sampled_lp, sampled_rank):
        ct, (R, V) = self._logits("logprobs", logits)
        if not 0 <= n <= MAX_LOGPROBS:
            raise ValueError(f"logprobs: n must be in [0, {MAX_LOGPROBS}], got {n}")
        self._arr("logprobs", I32, (R,), sampled=sampled)
        self._arr("logprobs", I32, (R, n), top_ids=top_ids)
        self._arr("logprobs", F32, (R, n), top_lp=top_lp)
        self._arr("logprobs", F32, (R,), sampled_lp=sampled_lp)
        self._arr("logprobs", I32, (R,), sampled_rank=sampled_rank)
        if R and V:
            self._fn("logprobs", ct)((R,), (SEL_THREADS,), (logits, _i32(V), sampled, _i32(n), top_ids, top_lp,
                                                           sampled_lp, sampled_rank))
