"""Launchers for our CUDA C kernels (kernels/*.cu) on CuPy arrays.

Each .cu file is compiled once per process and compute dtype into a cupy.RawModule (NVRTC, cubin for the
current GPU; CuPy also keeps it in its on-disk kernel cache), and each kernel function is looked up once per
CudaKernels object. A launch is then a shape check on the host plus one or two kernel launches on the
current CuPy stream: no host synchronisation, no device allocation (the decode workspace is allocated once
per cache shape), so a decode step can be captured in a CUDA graph.

The decoder position `start_pos` is a device int32[1] array read by the kernels themselves.
Storage: bf16 arrays are cupy uint16 arrays (same bits), fp16 float16, fp32 float32; logits are fp32.

This module imports without CuPy (cupy is imported when a CudaKernels is made), so CPU-only installs and
the compile-check test can import `kernel_names`.
"""
import math
from pathlib import Path

import numpy as np

import kernels as _kernels_pkg

KERNEL_DIR = Path(_kernels_pkg.__file__).parent
CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# No --use_fast_math: expf/exp2f/rsqrtf keep their IEEE-ish accuracy so the GPU agrees with the CPU twins.
OPTIONS = ("-std=c++17",)
DECODE_HEAD_DIMS = (64, 128, 256)   # decode_attention_partial<T, D> instantiations
TC_HEAD_DIMS = (64, 128)            # prefill_attention_tc<T, D> instantiations (16-bit T only)
MAX_SPLITS = 1024                   # decode_attention.cu: MAX_SPLITS
LOG2E = 1.4426950408889634          # kernels work in log2 units: exp(x) = exp2(x * log2(e))
_SMEM_DEFAULT = 48 * 1024           # above this a kernel must opt in to more dynamic shared memory

_MODULES = {}  # (op, ctype) -> cupy.RawModule, shared by every CudaKernels of the process


def kernel_names(op: str, ctype: str) -> list:
    """The name expressions (template instantiations) the wrapper uses from kernels/<op>.cu for one ctype."""
    if op == "decode_attention":
        return [f"decode_attention_partial<{ctype}, {d}>" for d in DECODE_HEAD_DIMS] + \
               [f"decode_attention_combine<{ctype}>"]
    if op == "prefill_attention":
        tc = [] if ctype == "float" else [f"prefill_attention_tc<{ctype}, {d}>" for d in TC_HEAD_DIMS]
        return [f"prefill_attention<{ctype}>"] + tc
    if op == "argmax":
        return []  # extern "C", fp32 only
    return [{"embedding": "embedding", "rmsnorm": "add_rmsnorm", "rope": "rope_qkv",
             "activation": "silu_mul"}[op] + f"<{ctype}>"]


def _module(op: str, ctype: str):
    key = (op, ctype if op != "argmax" else "")
    mod = _MODULES.get(key)
    if mod is None:
        import cupy

        src = (KERNEL_DIR / f"{op}.cu").read_text()
        mod = cupy.RawModule(code=src, options=OPTIONS, name_expressions=kernel_names(op, ctype) or None)
        _MODULES[key] = mod
    return mod


def decode_splits(S: int, n_kv_heads: int, group: int, D: int, itemsize: int, n_sm: int) -> int:
    """Number of sequence splits for decode attention: ~2 blocks per SM at full length, but no split shorter
    than one tile of the kernel (KT keys, mirroring Shape<T, D> in decode_attention.cu) at full context S."""
    ch = D // (16 // itemsize)
    lpk = min(ch, 32)
    kt = 4 * (32 // lpk) * 4
    blocks_per_split = n_kv_heads * math.ceil(group / 8)
    return max(1, min(MAX_SPLITS, math.ceil(S / kt), math.ceil(2 * n_sm / blocks_per_split)))


class CudaKernels:
    """The ops of the spec on CuPy arrays of one compute dtype ("float32" | "float16" | "bfloat16")."""

    def __init__(self, dtype: str):
        import cupy

        if dtype not in CTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(CTYPES)}")
        self.cp = cupy
        self.dtype = dtype
        self.ctype = CTYPES[dtype]
        self.storage = np.dtype(STORAGE[dtype])
        self.itemsize = self.storage.itemsize
        self._fns = {}          # name -> cupy Function
        self._decode_ws = {}    # (Hq, Hkv, S, D) -> (ws_ml, ws_acc, n_splits)
        self._n_sm = None
        self._smem_optin = {}   # name -> dynamic shared memory opted in

    # -- plumbing ---------------------------------------------------------------------------------------
    def _fn(self, op: str, name: str, smem: int = 0):
        f = self._fns.get(name)
        if f is None:
            f = _module(op, self.ctype).get_function(name)
            self._fns[name] = f
        if smem > _SMEM_DEFAULT and self._smem_optin.get(name, 0) < smem:
            f.max_dynamic_shared_size_bytes = smem  # opt in once (cudaFuncSetAttribute)
            self._smem_optin[name] = smem
        return f

    def _check(self, op: str, dtype, **arrays):
        for name, a in arrays.items():
            if a is None:
                continue
            if a.dtype != dtype or not a.flags.c_contiguous:
                raise ValueError(f"{op}: {name} must be a C-contiguous {np.dtype(dtype).name} array, "
                                 f"got {a.dtype} {'contiguous' if a.flags.c_contiguous else 'strided'} {a.shape}")

    # -- ops ----------------------------------------------------------------------------------------------
    def embedding(self, ids, table, out):
        """out[t] = table[ids[t]]; ids int32[T], table [V, H], out [T, H]. Out-of-range ids give zero rows."""
        self._check("embedding", np.int32, ids=ids)
        self._check("embedding", self.storage, table=table, out=out)
        V, H = table.shape
        T = ids.shape[0]
        if out.shape != (T, H):
            raise ValueError(f"embedding: out {out.shape} != ({T}, {H})")
        if T:
            self._fn("embedding", f"embedding<{self.ctype}>")((T,), (128,), (ids, table, out, np.int32(V), np.int32(H)))

    def add_rmsnorm(self, x, residual, weight, eps, out):
        """residual += x (if x is not None), out = rmsnorm(residual) * weight; rows of H = residual.shape[-1]."""
        self._check("add_rmsnorm", self.storage, x=x, residual=residual, weight=weight, out=out)
        H = residual.shape[-1]
        if weight.shape != (H,) or out.shape != residual.shape or (x is not None and x.shape != residual.shape):
            raise ValueError(f"add_rmsnorm: x {None if x is None else x.shape}, residual {residual.shape}, "
                             f"weight {weight.shape}, out {out.shape}")
        rows = residual.size // H
        # One 16-byte chunk per thread covers the row in one pass (128 threads for H = 896 in bf16).
        threads = min(1024, max(32, 32 * math.ceil(H / (16 // self.itemsize) / 32)))
        if rows:
            self._fn("rmsnorm", f"add_rmsnorm<{self.ctype}>")(
                (rows,), (threads,), (x, residual, weight, out, np.float32(eps), np.int32(H)))

    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, start_pos_dev, n_heads, n_kv_heads,
                 q_out, k_cache, v_cache):
        """Bias, optional q/k norm, rotary embedding; q -> q_out[T, Hq, D], k/v -> caches[Hkv, S, D] at
        positions start_pos_dev[0] + t. Positions >= S are skipped (the caller must keep them in range)."""
        self._check("rope_qkv", self.storage, qkv=qkv, bias=bias, q_norm=q_norm, k_norm=k_norm, q_out=q_out,
                    k_cache=k_cache, v_cache=v_cache)
        self._check("rope_qkv", np.float32, cos=cos, sin=sin)
        self._check("rope_qkv", np.int32, start_pos_dev=start_pos_dev)
        T = qkv.shape[0]
        Hkv, S, D = k_cache.shape
        NH = n_heads + 2 * n_kv_heads
        if (Hkv != n_kv_heads or qkv.shape[1] != NH * D or q_out.shape != (T, n_heads, D)
                or v_cache.shape != k_cache.shape or D % 2 or D > 256):
            raise ValueError(f"rope_qkv: qkv {qkv.shape}, q_out {q_out.shape}, k_cache {k_cache.shape}, "
                             f"v_cache {v_cache.shape}, Hq={n_heads}, Hkv={n_kv_heads} (D even, <= 256)")
        if cos.shape != sin.shape or cos.shape[1] != D // 2 or cos.shape[0] < S:
            raise ValueError(f"rope_qkv: cos {cos.shape} / sin {sin.shape} must be [>= S={S}, D/2={D // 2}]")
        for name, a, n in (("bias", bias, NH * D), ("q_norm", q_norm, D), ("k_norm", k_norm, D)):
            if a is not None and a.shape != (n,):
                raise ValueError(f"rope_qkv: {name} shape {a.shape} != ({n},)")
        if T:
            self._fn("rope", f"rope_qkv<{self.ctype}>")(
                (math.ceil(T * NH / 4),), (128,),
                (qkv, bias, q_norm, k_norm, np.float32(eps), cos, sin, start_pos_dev, np.int32(T),
                 np.int32(n_heads), np.int32(n_kv_heads), np.int32(D), np.int32(S), q_out, k_cache, v_cache))

    def silu_mul(self, gate_up, out):
        """out[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:]."""
        self._check("silu_mul", self.storage, gate_up=gate_up, out=out)
        T, I2 = gate_up.shape
        if I2 % 2 or out.shape != (T, I2 // 2):
            raise ValueError(f"silu_mul: gate_up {gate_up.shape}, out {out.shape}")
        n = T * (I2 // 2) // (16 // self.itemsize)  # 16-byte chunks (the kernel falls back to elements itself)
        if T:
            # Grid-stride loop: enough blocks to fill the GPU, never more than the work.
            blocks = max(1, min(math.ceil(n / 256), 4096))
            self._fn("activation", f"silu_mul<{self.ctype}>")(
                (blocks,), (256,), (gate_up, out, np.int32(T), np.int32(I2 // 2)))

    def prefill_attention(self, q, k_cache, v_cache, start_pos_dev, scale, out, tensor_cores=True):
        """Causal attention of q[T, Hq, D] (positions start_pos..start_pos+T-1) over the caches -> out.
        tensor_cores: use the mma.sync FlashAttention-2 kernel when the dtype is 16-bit and D is 64 or 128;
        False forces the generic fp32-math kernel (the reference path)."""
        self._check("prefill_attention", self.storage, q=q, k_cache=k_cache, v_cache=v_cache, out=out)
        self._check("prefill_attention", np.int32, start_pos_dev=start_pos_dev)
        T, Hq, D = q.shape
        Hkv, S, Dk = k_cache.shape
        if out.shape != q.shape or v_cache.shape != k_cache.shape or Dk != D or Hq % Hkv or D > 256:
            raise ValueError(f"prefill_attention: q {q.shape}, out {out.shape}, k_cache {k_cache.shape}, "
                             f"v_cache {v_cache.shape} (Hq % Hkv == 0, D <= 256)")
        if not T:
            return
        args = (q, k_cache, v_cache, start_pos_dev, np.float32(scale), np.int32(T), np.int32(Hq), np.int32(Hkv),
                np.int32(S))
        if tensor_cores and self.dtype != "float32" and D in TC_HEAD_DIMS:
            smem = 5 * 64 * (D + 8) * self.itemsize  # Q + double-buffered K and V, rows padded by 8
            f = self._fn("prefill_attention", f"prefill_attention_tc<{self.ctype}, {D}>", smem)
            f((Hq, math.ceil(T / 64)), (128,), args + (out,), shared_mem=smem)
        else:
            smem = (16 * D + 32 * (D + 1) + 32 * D) * 4
            f = self._fn("prefill_attention", f"prefill_attention<{self.ctype}>", smem)
            f((math.ceil(T / 16), Hq), (128,), args + (np.int32(D), out), shared_mem=smem)

    def decode_attention(self, q, k_cache, v_cache, start_pos_dev, scale, out):
        """One query per head, q[Hq, D], over keys 0..start_pos_dev[0] of the caches -> out[Hq, D]."""
        self._check("decode_attention", self.storage, q=q, k_cache=k_cache, v_cache=v_cache, out=out)
        self._check("decode_attention", np.int32, start_pos_dev=start_pos_dev)
        Hq, D = q.shape
        Hkv, S, Dk = k_cache.shape
        if out.shape != q.shape or v_cache.shape != k_cache.shape or Dk != D or Hq % Hkv:
            raise ValueError(f"decode_attention: q {q.shape}, out {out.shape}, k_cache {k_cache.shape}, "
                             f"v_cache {v_cache.shape}")
        if D not in DECODE_HEAD_DIMS:
            raise ValueError(f"decode_attention: head dim {D} not in {DECODE_HEAD_DIMS}")
        ws_ml, ws_acc, n_splits = self._workspace(Hq, Hkv, S, D)
        group = Hq // Hkv
        partial = self._fn("decode_attention", f"decode_attention_partial<{self.ctype}, {D}>")
        partial((Hkv * math.ceil(group / 8), n_splits), (128,),
                (q, k_cache, v_cache, start_pos_dev, np.float32(scale * LOG2E), np.int32(Hq), np.int32(Hkv),
                 np.int32(S), np.int32(n_splits), ws_ml, ws_acc))
        combine = self._fn("decode_attention", f"decode_attention_combine<{self.ctype}>")
        combine((Hq,), (128,), (ws_ml, ws_acc, np.int32(n_splits), np.int32(D), out))

    def _workspace(self, Hq, Hkv, S, D):
        key = (Hq, Hkv, S, D)
        ws = self._decode_ws.get(key)
        if ws is None:  # once per cache shape: later decode steps allocate nothing
            if self._n_sm is None:
                self._n_sm = self.cp.cuda.Device().attributes["MultiProcessorCount"]
            n = decode_splits(S, Hkv, Hq // Hkv, D, self.itemsize, self._n_sm)
            ws = (self.cp.empty((Hq, n, 2), self.cp.float32), self.cp.empty((Hq, n, D), self.cp.float32), n)
            self._decode_ws[key] = ws
        return ws

    def argmax(self, logits, out):
        """out[r] = argmax(logits[r]) (lowest index on ties); logits float32[R, V] (or [V]), out int32[R]."""
        self._check("argmax", np.float32, logits=logits)
        self._check("argmax", np.int32, out=out)
        V = logits.shape[-1]
        R = logits.size // V if V else 0
        if out.size != R:
            raise ValueError(f"argmax: out has {out.size} entries for {R} rows")
        if R:
            self._fn("argmax", "argmax")((R,), (1024,), (logits, np.int32(V), out))
