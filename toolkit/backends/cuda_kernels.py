"""Launchers for our CUDA C kernels (kernels/*.cu) on CuPy arrays.

Each .cu file is compiled once per process and compute dtype into a cupy.RawModule (NVRTC, cubin for the
current GPU; CuPy also keeps it in its on-disk kernel cache), and each kernel function is looked up once per
CudaKernels object. A launch is then a shape check on the host plus one kernel launch on the
current CuPy stream: no host synchronisation, no device allocation (the decode workspace is allocated once
per plan), so a step can be captured in a CUDA graph.

The step's inputs (positions, slot mapping, query_start_loc, seq_lens, block tables) are device int32 arrays read
by the kernels themselves, so a captured graph replays with new values; the host ints that shape a launch
(max_seq_len, max_query_len, block_size) are fixed per plan or per step. KV caches are paged:
[num_slots, Hkv, D] with num_slots = num_blocks * block_size (see the kernels' headers).
Storage: bf16 arrays are cupy uint16 arrays (same bits), fp16 float16, fp32 float32; logits are fp32.

One method per kernel (decode_attention and decode_attention_tc, gemm_skinny and gemm_skinny_swiglu, ...): the step
plan (toolkit/model/plan.py) decides which one runs, and a method raises ValueError for a shape its kernel does
not take rather than running another kernel.

This module imports without CuPy (cupy is imported when a CudaKernels is made), so CPU-only installs and
the compile-check test can import `kernel_names`.
"""
import copy
import functools
import math
import re
from pathlib import Path

import numpy as np

import kernels as _kernels_pkg

from .cuda_gemm import SkinnyGemms
from .cuda_gemm import kernel_names as _skinny_names
from .cuda_tuned import row_bucket
from .cuda_wg import WgGemms
from .cuda_wg import kernel_names as _wg_names

KERNEL_DIR = Path(_kernels_pkg.__file__).parent
CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# No --use_fast_math: expf/exp2f/rsqrtf keep their IEEE-ish accuracy so the GPU agrees with the CPU twins.
OPTIONS = ("-std=c++17",)
DECODE_HEAD_DIMS = (8, 16, 32, 64, 128, 256)   # decode_attention<T, D> instantiations
TC_HEAD_DIMS = (64, 128)            # prefill_attention_tc / decode_attention_tc<T, D> (16-bit T only)
WG_KEYS = {64: 64, 128: 128}        # prefill_attention_wg<T, D, BN>: keys a K/V tile at head dim D (sm_90 only)
WG_QUERIES = 128                    # prefill_attention_wg: queries a block (64 a warpgroup)
WG_BLOCKS_PER_SM = {64: 2, 128: 1}  # prefill_attention_wg: resident blocks an SM at head dim D (its shared memory)
PREFILL_MAX_SPLITS = 8              # prefill_splits: most key splits of a query tile
TC_DECODE_GROUP = 16                # decode_attention_tc: q heads a block (the mma's 16 A rows)
TC_DECODE_KT = 64                   # decode_attention_tc: keys a tile
TC_ONE_SPLIT_TILES = 4              # decode_attention_tc: a sequence of up to this many tiles is one split
STREAM_STAGES = {64: 4, 128: 3}     # decode_attention_tc_stream: K/V buffers of its ring (dt_stream_stages)
STREAM_BLOCKS_PER_SM, STREAM_MIN_TILES, STREAM_MAX_SPLITS = 2, 2, 32  # stream_splits (see there)
DECODE_ONE_SPLIT_TILES = 2          # decode_attention (CUDA cores): the same
ROPE_MIN_WARPS_PER_SM = 4           # rope_layout: narrower runs below this many warps an SM (latency, not bytes)
GEMV_MAX_ROWS = 4                   # gemv<T, TO, M> instantiations: M = 1..4
PARTS_MAX = 8                       # add_rmsnorm_partials: most slices (PART_MAX in rmsnorm.cu)
GEMV_MAX_WPR = 8                    # most warps per GEMV output row (gemv.cu; 1, 2, 4 or 8)
MAX_SPLITS = 1024                   # cap on decode-attention splits (the last split merges them all)
HEAD_SPLIT_KV_BYTES = 2 << 20       # decode_head_blocks: K/V a layer up to which a GQA group may span blocks
LOG2E = 1.4426950408889634          # kernels work in log2 units: exp(x) = exp2(x * log2(e))
_SMEM_DEFAULT = 48 * 1024           # above this a kernel must opt in to more dynamic shared memory

_MODULES = {}  # (op, ctype) -> cupy.RawModule, shared by every CudaKernels of the process


def kernel_names(op: str, ctype: str) -> list:
    """The name expressions (template instantiations) the wrapper uses from kernels/<op>.cu for one ctype."""
    if op == "decode_attention":
        return [f"decode_attention<{ctype}, {d}>" for d in DECODE_HEAD_DIMS]
    if op == "decode_attention_tc":  # GQA-packed tensor-core decode attention, 16-bit types only
        return [] if ctype == "float" else [f"decode_attention_tc{k}<{ctype}, {d}>" for k in ("", "_stream")
                                            for d in TC_HEAD_DIMS]
    if op == "prefill_attention":
        tc = [] if ctype == "float" else [f"prefill_attention_tc<{ctype}, {d}>" for d in TC_HEAD_DIMS]
        return [f"prefill_attention<{ctype}>", f"prefill_attention_merge<{ctype}>"] + tc
    if op == "combine":
        return []  # extern "C", int32 only (combine_flat_warp, combine_persistent, prefill_gather_lens)
    if op == "sparse_prefill":  # (sparse_scores and sparse_topk are extern "C": fp32 in)
        return [f"sparse_compress_keys<{ctype}>", f"sparse_query_means<{ctype}>"] + \
            [f"sparse_attention<{ctype}, {d}, {g}>" for d in (8, 16, 32, 64, 128) for g in (8, 16)]
    if op == "sparse_attention_tc":  # (sparse_tile_union is extern "C"); the attention for 16-bit types only
        return [] if ctype == "float" else [f"sparse_attention_tc<{ctype}, {d}>" for d in TC_HEAD_DIMS]
    if op == "sampler":  # templated on the logits type; the processing kernels exist for float only
        f32 = ["add_entries", "apply_penalties", "temperature_max", "min_p_mask", "top_k_top_p"]
        sample = [f"gumbel_sample<{ctype}, {gumbel_cpt(ctype)}>"]
        return sample + [f"{k}<{ctype}>" for k in ["to_fp32", "logprobs", "filter_sample"] +
                         (f32 if ctype == "float" else [])]
    if op == "gemm_skinny":
        return _skinny_names(ctype)
    if op == "gemv":
        outs = [ctype] if ctype == "float" else [ctype, "float"]
        rows = range(1, GEMV_MAX_ROWS + 1)
        rope = [] if ctype == "float" else [f"gemv_rope<{ctype}, {m}>" for m in rows]  # 16-bit types only
        return ([f"gemv<{ctype}, {o}, {m}>" for o in outs for m in rows] + [f"gemv_swiglu<{ctype}, {m}>" for m in rows]
                + rope)
    if op == "rmsnorm":  # the plain kernel, and the one that adds a split GEMM's partials first
        return [f"add_rmsnorm<{ctype}>", f"add_rmsnorm_partials<{ctype}>"]
    if op == "activation":  # silu_mul, and the form that applies a deferred RMSNorm scale (gemm_skinny_norm's)
        return [f"silu_mul<{ctype}>", f"silu_mul_scaled<{ctype}>"]
    if op == "rope":
        return rope_names(ctype)
    if op == "gemm_wg":  # wgmma only: its kernels are all in the op's sm_90a module (sm90a_kernel_names)
        return []
    return [f"embedding<{ctype}>"]


def rope_names(ctype: str) -> list:
    """Every rope_qkv<T, V, KR> instantiation rope_layout can ask for (kernels/rope.cu)."""
    return [f"rope_qkv<{ctype}, {v}, {kr}>" for v in (1, 2, 4) + ((8,) if ctype != "float" else ())
            for kr in ((1, 2, 4) if v == 1 else (1, 2))]


def rope_layout(D: int, itemsize: int, ptrs, table_ptrs=(), items: int = 0, min_warps: int = 0) -> tuple:
    """(V, lanes an item, KR) for rope_qkv at head dim D (kernels/rope.cu): V the pairs a lane loads as one run of
    each half, the widest of 8, 4, 2, 1 that fits 16 bytes and divides D/2 and every pointer's alignment (a view may
    start anywhere; at V = 4 or 8 the fp32 cos/sin tables are read as float4, so they must be 16-byte aligned too),
    then narrowed while `items` (token, head) items would fill fewer than `min_warps` warps: a small step is latency,
    not bytes, and more lanes an item put more loads in flight (a one-token decode step: 1.6 us a call as one warp
    an item, 2.0 at V = 8 with 8 items a warp, H100). lanes: the largest power of two up to D/2 / V runs, at most
    32; KR the runs a lane (1 or 2; 3 -> 4 at V = 1), a template argument so that the common case holds one run's
    registers (48 at V = 8, KR = 1; 72 at KR = 2)."""
    half, v = D // 2, 16 // itemsize
    while v > 1 and (half % v or any(p % (v * itemsize) for p in ptrs)
                     or (v % 4 == 0 and any(p % 16 for p in table_ptrs))):
        v //= 2

    def lanes(v):
        return 1 << (min(32, half // v).bit_length() - 1)
    while v > 1 and items * lanes(v) < 32 * min_warps:
        v //= 2
    kr = -(-(half // v) // lanes(v))
    return v, lanes(v), 4 if kr == 3 else kr


def sm90a_kernel_names(op: str, ctype: str) -> list:
    """The kernels of kernels/<op>.cu that use Hopper's own instructions (wgmma): built into a second module of the op
    with -arch=sm_90a, on sm_90 GPUs only (the op's ordinary module stays a plain sm_90 build)."""
    if op == "prefill_attention" and ctype != "float":
        return [f"prefill_attention_wg<{ctype}, {d}, {WG_KEYS[d]}>" for d in TC_HEAD_DIMS]
    if op == "gemm_wg":
        return _wg_names(ctype)
    return []


def gumbel_cpt(ctype: str) -> int:
    """gumbel_sample<T, CPT>'s 16-token chunks a thread per step: 2 for 16-bit logits (64 bytes in flight a
    thread), 1 for fp32 (the same bytes in flight; two would need 32 more registers a thread)."""
    return 1 if ctype == "float" else 2


def gemv_warps_per_row(kc: int) -> int:
    """Warps per output row of gemv.cu for rows of kc 16-byte chunks: the most (up to GEMV_MAX_WPR) that still
    leave each lane 2+ chunks, so a long row keeps more loads in flight (K = 4,864 in bf16: 8; K = 896: 1)."""
    wpr = 1
    while wpr < GEMV_MAX_WPR and kc >= 64 * (2 * wpr):
        wpr *= 2
    return wpr


def kernel_source(op: str) -> str:
    """kernels/<op>.cu with its local `#include "x.cuh"` lines replaced by the files themselves.

    Pasting the headers in (rather than passing -I) makes the text CuPy hashes for its kernel cache cover them,
    so an edited header is recompiled instead of a stale cubin being reused.
    """
    return inline_headers((KERNEL_DIR / f"{op}.cu").read_text())


def inline_headers(src: str) -> str:
    """`src` with each `#include "x.cuh"` line replaced by kernels/x.cuh (kernel_source; other versions of a .cu)."""
    return re.sub(r'^#include "([\w.]+\.cuh)"$', lambda m: (KERNEL_DIR / m.group(1)).read_text(), src,
                  flags=re.MULTILINE)


def _module(op: str, ctype: str, sm90a: bool = False):
    key = (op + (":sm_90a" if sm90a else ""), ctype if op != "combine" else "")
    mod = _MODULES.get(key)
    if mod is None:
        import cupy

        src = kernel_source(op)
        # sm90a: CuPy appends its own -arch=sm_90 after these options; NVRTC then builds for sm_90a, the superset
        # (tests/kernels/test_cuda_compile.py compiles with exactly that pair).
        options = OPTIONS + (("-arch=sm_90a",) if sm90a else ())
        names = sm90a_kernel_names(op, ctype) if sm90a else kernel_names(op, ctype)
        mod = cupy.RawModule(code=src, options=options, name_expressions=names or None)
        _MODULES[key] = mod
    return mod


def decode_head_blocks(batch: int, n_kv_heads: int, group: int, n_sm: int, kv_bytes: int) -> int:
    """Blocks that share one GQA group's q heads in decode attention (each takes ceil(group / that) <= 8 heads).
    Fewer heads a block means more blocks re-reading the same K/V (from L2), but a shorter chain of math per key
    tile, which is what a small batch at a short context waits on: at batch 1 a Qwen2.5-0.5B layer has 2 kv
    heads, so 2 blocks of 7 heads did all the work on 2 of 132 SMs (a block a head: 140 -> 74 us a step at
    context 1, 245 -> 143 at 100; decode_heads_ab_A.log / _B.log). So when the plan's K/V (kv_bytes, at its
    max_seq_len) is small: the most heads a block (the least re-reading) that still gives about a block per SM.
    Past HEAD_SPLIT_KV_BYTES the re-reads cost more than they save (batch 32, 8.4 MB at 512 keys: 409 -> 464 us
    a step), and a group is one block."""
    fewest = math.ceil(group / 8)
    if kv_bytes > HEAD_SPLIT_KV_BYTES:
        return fewest
    for per_block in range(min(8, group), 0, -1):
        if batch * n_kv_heads * math.ceil(group / per_block) >= n_sm:
            return max(fewest, math.ceil(group / per_block))
    return group


def plan_kv_bytes(batch: int, n_kv_heads: int, D: int, itemsize: int, max_seq_len: int) -> int:
    """A decode plan's K/V bytes a layer at its max_seq_len (what decode_head_blocks weighs)."""
    return 2 * batch * max(1, max_seq_len) * n_kv_heads * D * itemsize


def decode_splits(batch: int, n_kv_heads: int, head_blocks: int, D: int, itemsize: int, n_sm: int,
                  max_seq_len: int, kt: int = None, one_split_tiles: int = DECODE_ONE_SPLIT_TILES) -> int:
    """Number of sequence splits for decode attention, fixed per (batch, max_seq_len) plan so a captured graph
    stays valid at every length <= max_seq_len. The kernels spread each sequence's actual length evenly over
    the splits in whole tiles of kt keys (default: Shape<T, D>'s KT in decode_attention.cu).
    Enough splits for ~2 blocks per SM, and at most 2 tiles per block at full context (a block's tiles run one
    after another, so long chunks are latency-bound), but never a split shorter than a tile at full context;
    and at most ~16 blocks per SM in all: a big batch fills the GPU by itself, and every split costs a block
    launch (mostly empty ones at short lengths) and combine work. A plan of at most one_split_tiles tiles (the
    kernel's own one-split limit: split_chunk in decode_split.cuh) gets 1: every sequence it takes is one split,
    and the blocks of any other split would only start and return. (Five splits of the 512-key plan at batch 32,
    4 of them empty at 2-256 keys, against one of a 256-key plan: experiments/NOTEBOOK.md, "Does the smallest context
    bucket launch empty splits?")"""
    if kt is None:  # the CUDA-core kernel's tile (kt: the tensor-core kernel's)
        lpk = min(D // (16 // itemsize), 32)
        kt = 4 * (32 // lpk) * 4
    blocks_per_split = batch * n_kv_heads * head_blocks
    tiles = math.ceil(max_seq_len / kt)
    if tiles <= one_split_tiles:
        return 1
    want = max(math.ceil(2 * n_sm / blocks_per_split), math.ceil(tiles / 2))
    cap = 16 * n_sm // blocks_per_split
    return max(1, min(MAX_SPLITS, tiles, want, cap))


def stream_splits(batch: int, n_kv_heads: int, n_sm: int, max_seq_len: int) -> int:
    """Splits for decode_attention_tc_stream: as many as one wave of its blocks holds (STREAM_BLOCKS_PER_SM a
    multiprocessor, by its shared memory), but no split of fewer than STREAM_MIN_TILES tiles at full context and
    at most STREAM_MAX_SPLITS (the merge reads every split's partial in one block). More splits than a wave only
    cost: at batch 128 and 8,192 keys (Qwen2.5-0.5B) 1 split took 159 us, 8 splits 189, 64 splits 376; at batch
    32, 4 splits (one wave) 51 us, 1 split 130, 16 splits 66. At batch 1 and 8,192 keys 32 splits took 11.5 us,
    16 14.5, 64 12.1 (the tensor-core kernel's 128: 14.6); at 2,048 keys 16 or 32 splits 8.3-8.5, 8 splits 9.7
    (dev/decode_attention_long.py; experiments/logs/decode_long_sweep.log, decode_long_graph.log)."""
    tiles = math.ceil(max_seq_len / TC_DECODE_KT)
    wave = STREAM_BLOCKS_PER_SM * n_sm // (batch * n_kv_heads)
    return max(1, min(STREAM_MAX_SPLITS, wave, tiles // STREAM_MIN_TILES))


def prefill_splits(batch: int, max_query_len: int, tokens: int, n_heads: int, D: int, n_sm: int) -> int:
    """Key splits a query tile of prefill_attention_wg takes: as many as keep its blocks within one wave
    (WG_BLOCKS_PER_SM an SM), at most PREFILL_MAX_SPLITS. Its blocks: a head's query tiles of 128 rows, at most
    ceil(max_query_len / 128) a request and about ceil(tokens / 128) + batch in all. From host sizes only (the
    step's padded shape), so a graph's grid holds for every prefix: each block sizes its split from the device-side
    length (split_keys in prefill_attention.cu). A whole prompt of 4,096 tokens fills the GPU alone (1 split); a
    512-token chunk has 4 tiles a head, 56 blocks for Qwen2.5-0.5B's 14 heads on 132 SMs (4 splits)."""
    tiles = min(batch * -(-max_query_len // WG_QUERIES), -(-tokens // WG_QUERIES) + batch)
    wave = WG_BLOCKS_PER_SM.get(D, 1) * n_sm
    return max(1, min(PREFILL_MAX_SPLITS, wave // max(1, n_heads * tiles)))


def prefill_workspace_rows(N: int) -> int:
    """Rows of the split workspace that serves a step of N rows: the power of two >= N, at least 128."""
    return max(128, row_bucket(N))


I32, F32 = np.dtype(np.int32), np.dtype(np.float32)
# Launch arguments as NumPy scalars, cached: a cache hit costs a fraction of making np.int32(v) again.
_i32, _f32 = functools.lru_cache(4096)(np.int32), functools.lru_cache(4096)(np.float32)


def _bad(op: str, dtype, arrays):
    """Slow path of CudaKernels._check: name the offending array."""
    for i, a in enumerate(arrays):
        if a is not None and (a.dtype != dtype or not a.flags.c_contiguous):
            return ValueError(f"{op}: argument {i} must be a C-contiguous {np.dtype(dtype).name} array, got "
                              f"{a.dtype} {'contiguous' if a.flags.c_contiguous else 'strided'} shape {a.shape}")
    return None


class CudaKernels(SkinnyGemms, WgGemms):
    """The ops of the spec on CuPy arrays of one compute dtype ("float32" | "float16" | "bfloat16").

    Host cost matters at batch 1 (a decode step is ~10 launches per layer), so the checks on the fast path
    are identity tests (`dtype is`, CuPy's cached `_c_contiguous`) and the launch arguments are built
    directly; a CUDA graph of the step removes the host cost altogether."""

    def __init__(self, dtype: str):
        import cupy

        if dtype not in CTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(CTYPES)}")
        self.cp = cupy
        self.dtype = dtype
        self.ctype = CTYPES[dtype]
        self.storage = np.dtype(STORAGE[dtype])
        self.itemsize = self.storage.itemsize
        self.vec = 16 // self.itemsize  # elements per 16-byte chunk
        self._fns = {}          # name -> cupy Function
        self._decode_plans = {} # (B, Hq, Hkv, D, max_seq_len, tc) -> kernel, grid, splits, workspace
        self._prefill_ws = {}   # (rows, Hq, D, splits) -> prefill_attention_wg's split partials
        self._gemm_plans = {}   # (M, N, K, swiglu, out type, split) -> gemm_skinny's launch (cuda_gemm.py)
        self._tmaps = {}        # (address, rows, cols, box rows, dtype) -> gemm_wg's TMA descriptors (cuda_wg.py)
        self.num_sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.sm90 = cupy.cuda.Device().compute_capability == "90"  # Hopper: the wgmma kernels (sm90a_kernel_names)
        self._smem_optin = {}   # name -> dynamic shared memory opted in
        self.pdl = False  # see with_pdl
        self._go = self._launch  # how the decode-step kernels launch

    # -- plumbing ---------------------------------------------------------------------------------------
    def _fn(self, op: str, name: str, smem: int = 0, sm90a: bool = False):
        if name not in self._fns:
            self._fns[name] = _module(op, self.ctype, sm90a).get_function(name)
        f = self._fns[name]
        if smem > _SMEM_DEFAULT and self._smem_optin.get(name, 0) < smem:
            f.max_dynamic_shared_size_bytes = smem  # opt in once (cudaFuncSetAttribute)
            self._smem_optin[name] = smem
        return f

    def with_pdl(self) -> "CudaKernels":
        """These kernels, sharing their functions and decode plans, with the decode-step kernels (those that call
        pdl_wait, kernels/pdl.cuh) launched with programmatic dependent launch (cuda_launch.py); every other kernel
        launches normally."""
        from .cuda_launch import PdlLauncher

        twin = copy.copy(self)
        twin.pdl, twin._pdl = True, PdlLauncher()
        twin._go = twin._launch_pdl
        return twin

    @staticmethod
    def _launch(f, grid, block, args, smem: int = 0):
        f(grid, block, args, shared_mem=smem)

    def _launch_pdl(self, f, grid, block, args, smem: int = 0):
        self._pdl(f, grid, block, args, smem, self.cp.cuda.get_current_stream().ptr)

    @staticmethod
    def _check(op: str, dtype, *arrays):
        """Every array (None allowed) is C-contiguous with this dtype; numpy's builtin dtypes are singletons,
        so `is` decides the common case and `!=` only runs on a mismatch."""
        for a in arrays:
            if a is not None and ((a.dtype is not dtype and a.dtype != dtype) or not a._c_contiguous):
                raise _bad(op, dtype, arrays)

    def _check_rope(self, op, rows, n_heads, n_kv_heads, D, qkv, bias, q_norm, k_norm, cos, sin, positions,
                    slot_mapping):
        """RoPE's inputs for `rows` tokens (rope_qkv, or gemv_rope / gemm_skinny_rope doing its work): dtypes, then
        shapes. qkv None: the projection is computed in the same kernel (gemv_rope, gemm_skinny_rope)."""
        self._check(op, self.storage, qkv, bias, q_norm, k_norm)
        self._check(op, F32, cos, sin)
        self._check(op, I32, positions, slot_mapping)
        NH = n_heads + 2 * n_kv_heads
        if (qkv is not None and (qkv.shape[0] < rows or qkv.shape[1] != NH * D)) or D % 2 or D > 256:
            raise ValueError(f"{op}: qkv {None if qkv is None else qkv.shape} for {rows} tokens, Hq={n_heads}, "
                             f"Hkv={n_kv_heads}, D={D} (D even, <= 256)")
        if positions.shape[0] < rows or slot_mapping.shape[0] < rows:
            raise ValueError(f"{op}: positions {positions.shape} / slot_mapping {slot_mapping.shape} must cover "
                             f"{rows} tokens")
        if sin.shape != cos.shape or cos.shape[1] != D // 2:
            raise ValueError(f"{op}: cos {cos.shape} / sin {sin.shape} must be [positions, D/2={D // 2}]")
        if ((bias is not None and bias.shape != (NH * D,)) or (q_norm is not None and q_norm.shape != (D,))
                or (k_norm is not None and k_norm.shape != (D,))):
            raise ValueError(f"{op}: bias / q_norm / k_norm must be [{NH * D}] / [{D}] / [{D}]")

    def _check_rope_projection(self, op, most, k_multiple, d_multiple, x, w, bias, cos, sin, positions, slot_mapping,
                               n_heads, n_kv_heads, q_out, k_cache, v_cache):
        """The checks of a qkv projection with RoPE in its epilogue (gemv_rope, gemm_skinny_rope): 16-bit types,
        1 <= M <= most rows, K a multiple of k_multiple, D of d_multiple, and rope's inputs. Returns
        (M, K, N, D, num_slots)."""
        M, K = x.shape
        num_slots, Hkv, D = kshape = k_cache.shape
        self._check_rope(op, M, n_heads, n_kv_heads, D, None, bias, None, None, cos, sin, positions, slot_mapping)
        self._check(op, self.storage, x, w, q_out, k_cache, v_cache)
        if Hkv != n_kv_heads or q_out.shape != (M, n_heads, D) or v_cache.shape != kshape:
            raise ValueError(f"{op}: x {x.shape}, q_out {q_out.shape}, k_cache {kshape}, v_cache {v_cache.shape}, "
                             f"Hq={n_heads}, Hkv={n_kv_heads}")
        N = (n_heads + 2 * n_kv_heads) * D
        if self.itemsize != 2 or not 1 <= M <= most or w.shape != (N, K) or K % k_multiple or D % d_multiple:
            raise ValueError(f"{op}: x {x.shape}, w {w.shape}, head dim {D}, Hq {n_heads}, Hkv {n_kv_heads} in "
                             f"{self.dtype} (16-bit types, 1 <= M <= {most}, w [(Hq + 2 Hkv) D, K], K % {k_multiple} "
                             f"== 0, D % {d_multiple} == 0)")
        return M, K, N, D, num_slots

    # -- ops ----------------------------------------------------------------------------------------------
    def embedding(self, ids, table, out):
        """out[t] = table[ids[t]]; ids int32[T], table [V, H], out [T, H]. Out-of-range ids give zero rows."""
        self._check("embedding", I32, ids)
        self._check("embedding", self.storage, table, out)
        V, H = table.shape
        T = ids.shape[0]
        if out.shape != (T, H):
            raise ValueError(f"embedding: out {out.shape} != ({T}, {H})")
        if T:
            self._go(self._fn("embedding", f"embedding<{self.ctype}>"), (T,), (128,),
                     (ids, table, out, _i32(V), _i32(H)))

    def add_rmsnorm(self, x, residual, weight, eps, out):
        """residual += x (if x is not None), out = rmsnorm(residual) * weight; rows of H = residual.shape[-1]."""
        self._check("add_rmsnorm", self.storage, x, residual, weight, out)
        shape = residual.shape
        H = shape[-1]
        if weight.shape != (H,) or out.shape != shape or (x is not None and x.shape != shape):
            raise ValueError(f"add_rmsnorm: x {None if x is None else x.shape}, residual {shape}, "
                             f"weight {weight.shape}, out {out.shape}")
        rows = residual.size // H
        # One 16-byte chunk per thread covers the row in one pass (128 threads for H = 896 in bf16).
        threads = min(1024, max(32, 32 * -(-H // (32 * self.vec))))
        if rows:
            self._go(self._fn("rmsnorm", f"add_rmsnorm<{self.ctype}>"), (rows,), (threads,),
                     (x, residual, weight, out, _f32(eps), _i32(H)))

    def add_rmsnorm_partials(self, parts, residual, weight, eps, out):
        """add_rmsnorm with x = parts[0] + ... + parts[S-1] (fp32 [S, rows, H], added in slice order, rounded to
        the compute type): the S partial products CudaBackend.linear_partials leaves."""
        self._check("add_rmsnorm_partials", F32, parts)
        self._check("add_rmsnorm_partials", self.storage, residual, weight, out)
        rows, H = residual.shape
        if (parts.ndim != 3 or parts.shape[1:] != (rows, H) or weight.shape != (H,) or out.shape != (rows, H)
                or H % self.vec or not 1 <= parts.shape[0] <= PARTS_MAX):
            raise ValueError(f"add_rmsnorm_partials: parts {parts.shape}, residual {residual.shape}, weight "
                             f"{weight.shape}, out {out.shape} (H a multiple of {self.vec}, 1-{PARTS_MAX} slices)")
        if rows:
            self._go(self._fn("rmsnorm", f"add_rmsnorm_partials<{self.ctype}>"), (rows,),
                     (32 * -(-H // (32 * self.vec)),), (parts, _i32(parts.shape[0]), residual, weight, out, _f32(eps),
                                                        _i32(H)))

    def rope_qkv(self, qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads,
                 q_out, k_cache, v_cache):
        """Bias, optional q/k norm, rotary embedding; token t at position positions[t]: q -> q_out[t], k/v ->
        caches[slot_mapping[t]] ([num_slots, Hkv, D]). A slot < 0 (padding row) writes q only; a position
        outside the cos table or a slot >= num_slots skips the writes (never out of bounds)."""
        T = qkv.shape[0]
        num_slots, Hkv, D = kshape = k_cache.shape
        self._check_rope("rope_qkv", T, n_heads, n_kv_heads, D, qkv, bias, q_norm, k_norm, cos, sin, positions,
                         slot_mapping)
        self._check("rope_qkv", self.storage, q_out, k_cache, v_cache)
        if Hkv != n_kv_heads or q_out.shape != (T, n_heads, D) or v_cache.shape != kshape:
            raise ValueError(f"rope_qkv: qkv {qkv.shape}, q_out {q_out.shape}, k_cache {kshape}, "
                             f"v_cache {v_cache.shape}, Hq={n_heads}, Hkv={n_kv_heads}")
        NH, cshape = n_heads + 2 * n_kv_heads, cos.shape
        if T:
            ptrs = [a.data.ptr for a in (qkv, bias, q_norm, k_norm, q_out, k_cache, v_cache) if a is not None]
            v, lanes, kr = rope_layout(D, self.itemsize, ptrs, (cos.data.ptr, sin.data.ptr), T * NH,
                                       ROPE_MIN_WARPS_PER_SM * self.num_sms)
            self._go(
                self._fn("rope", f"rope_qkv<{self.ctype}, {v}, {kr}>"), (-(-T * NH // (4 * (32 // lanes))),), (128,),
                (qkv, bias, q_norm, k_norm, _f32(eps), cos, sin, positions, slot_mapping, _i32(T),
                 _i32(n_heads), _i32(n_kv_heads), _i32(D), _i32(cshape[0]), _i32(num_slots), _i32(lanes), q_out,
                 k_cache, v_cache))

    def silu_mul(self, gate_up, out):
        """out[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:]."""
        self._check("silu_mul", self.storage, gate_up, out)
        T, I2 = gate_up.shape
        if I2 % 2 or out.shape != (T, I2 // 2):
            raise ValueError(f"silu_mul: gate_up {gate_up.shape}, out {out.shape}")
        if T:
            # Grid-stride loop over 16-byte chunks: enough blocks to fill the GPU, never more than the work.
            blocks = max(1, min(-(-T * (I2 // 2) // (256 * self.vec)), 4096))
            self._go(self._fn("activation", f"silu_mul<{self.ctype}>"), (blocks,), (256,),
                     (gate_up, out, _i32(T), _i32(I2 // 2)))

    def silu_mul_scaled(self, gate_up, parts, eps, out):
        """out[T, I] = swiglu(inv * gate, inv * up) with inv = rsqrt(sum of parts[:, t] / H + eps) a row: the
        RMSNorm scale that gemm_skinny_norm left to apply (parts float[N / 16, T], H = 16 * its tiles)."""
        self._check("silu_mul_scaled", self.storage, gate_up, out)
        self._check("silu_mul_scaled", F32, parts)
        T, I2 = gate_up.shape
        I, tiles = I2 // 2, parts.shape[0]
        if I2 % 2 or out.shape != (T, I) or I % self.vec or parts.ndim != 2 or parts.shape[1] != T:
            raise ValueError(f"silu_mul_scaled: gate_up {gate_up.shape}, out {out.shape}, parts {parts.shape} "
                             f"(I a multiple of {self.vec}, parts [tiles, T])")
        if T:
            blocks = -(-I // (256 * self.vec))  # a row's 16-byte chunks over blocks of 256 threads
            self._go(self._fn("activation", f"silu_mul_scaled<{self.ctype}>"), (blocks, T), (256,),
                     (gate_up, out, _i32(I), parts, _i32(tiles), _i32(T), _i32(16 * tiles), _f32(eps)))

    def gemv(self, x, w, out):
        """out[M, N] = x[M, K] @ w[N, K].T for 1 <= M <= GEMV_MAX_ROWS (decode projections); out is the storage
        dtype or fp32 (logits). K must be a multiple of 16 bytes' worth of elements."""
        self._check("gemv", self.storage, x, w)
        M, K = x.shape
        N = w.shape[0]
        if not 1 <= M <= GEMV_MAX_ROWS or w.shape[1] != K or out.shape != (M, N) or K % self.vec:
            raise ValueError(f"gemv: x {x.shape}, w {w.shape}, out {out.shape} (1 <= M <= {GEMV_MAX_ROWS}, "
                             f"K % {self.vec} == 0)")
        to = "float" if out.dtype == F32 else self.ctype
        self._check("gemv", F32 if to == "float" else self.storage, out)
        grid, wpr = self._gemv_grid(N, K)
        self._go(self._fn("gemv", f"gemv<{self.ctype}, {to}, {M}>"), grid, (256,), (x, w, out, _i32(N), _i32(K), wpr))

    def _gemv_grid(self, rows: int, K: int) -> tuple:
        """gemv.cu's launch for `rows` output rows of K inputs: (grid, wpr), 8 / wpr rows a 256-thread block."""
        wpr = gemv_warps_per_row(K // self.vec)
        return (-(-rows // (8 // wpr)),), _i32(wpr)

    def gemv_swiglu(self, x, w, out):
        """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T), w = gate_up [2I, K]: gemv and silu_mul in one kernel
        (gemv.cu's gemv_swiglu; the same bits as the two), for 1 <= M <= GEMV_MAX_ROWS."""
        self._check("gemv_swiglu", self.storage, x, w, out)
        M, K = x.shape
        I = w.shape[0] // 2
        if not 1 <= M <= GEMV_MAX_ROWS or w.shape != (2 * I, K) or out.shape != (M, I) or K % self.vec:
            raise ValueError(f"gemv_swiglu: x {x.shape}, w {w.shape}, out {out.shape} (1 <= M <= {GEMV_MAX_ROWS}, "
                             f"w [2I, K], out [M, I], K % {self.vec} == 0)")
        grid, wpr = self._gemv_grid(I, K)
        self._go(self._fn("gemv", f"gemv_swiglu<{self.ctype}, {M}>"), grid, (256,), (x, w, out, _i32(I), _i32(K), wpr))

    def gemv_rope(self, x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
                  v_cache):
        """qkv = x @ w.T and then rope_qkv's work in one kernel (no q/k norms): bias, RoPE, q -> q_out, K/V -> the
        caches at slot_mapping, with rope_qkv's skips and roundings; the qkv projection of a decode step at
        1 <= M <= GEMV_MAX_ROWS rows (16-bit types). A RoPE pair's two rows share a block, so a row gets at most 4
        warps: where gemv gives it 4 or fewer (K < 4,096 in 16-bit) the sums are gemv's, bit for bit."""
        M, K, N, D, num_slots = self._check_rope_projection("gemv_rope", GEMV_MAX_ROWS, self.vec, 2, x, w, bias, cos,
                                                            sin, positions, slot_mapping, n_heads, n_kv_heads, q_out,
                                                            k_cache, v_cache)
        wpr = min(gemv_warps_per_row(K // self.vec), 4)
        self._go(self._fn("gemv", f"gemv_rope<{self.ctype}, {M}>"), (-(-N // 2 // (4 // wpr)),), (256,),
                 (x, w, _i32(K), _i32(wpr), bias, cos, sin, positions, slot_mapping, _i32(n_heads), _i32(n_kv_heads),
                  _i32(D), _i32(cos.shape[0]), _i32(num_slots), q_out, k_cache, v_cache))

    def _paged(self, op, q, k_cache, v_cache, block_tables, seq_lens, block_size, out):
        """Shared checks of the attention ops; returns (Hq, D, Hkv, M, num_blocks)."""
        self._check(op, self.storage, q, k_cache, v_cache, out)
        self._check(op, I32, block_tables, seq_lens)
        Hq, D = q.shape[1:]
        num_slots, Hkv, Dk = k_cache.shape
        B = seq_lens.shape[0]
        if (out.shape != q.shape or v_cache.shape != k_cache.shape or Dk != D or Hq % Hkv or D > 256
                or block_tables.ndim != 2 or block_tables.shape[0] != B or not 0 < block_size <= num_slots):
            raise ValueError(f"{op}: q {q.shape}, out {out.shape}, k_cache {k_cache.shape}, v_cache "
                             f"{v_cache.shape}, block_tables {block_tables.shape}, seq_lens {seq_lens.shape}, "
                             f"block_size {block_size} (Hq % Hkv == 0, D <= 256, a cache of >= 1 block)")
        return Hq, D, Hkv, block_tables.shape[1], num_slots // block_size

    def _prefill(self, kind, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, block_size, scale, out,
                 max_query_len, n_splits=None):
        """Varlen causal attention over the paged caches: sequence b's queries are the rows query_start_loc[b]..
        query_start_loc[b+1]-1 of q [N, Hq, D], at positions ending at seq_lens[b]-1. max_query_len bounds every
        sequence's query count (it sizes the grid); rows outside [query_start_loc[0], query_start_loc[B]) are not
        touched. kind: "cuda_cores" (fp32 math, any dtype and D <= 256), "tc" (the mma.sync FlashAttention-2 kernel)
        or "wg" (the same loop on Hopper's wgmma, sm_90 GPUs only); tc and wg take 16-bit dtypes and D 64 or 128
        (ValueError otherwise). wg splits each query tile's keys over prefill_splits blocks (n_splits overrides
        it: dev/ sweeps, tests) and merges them in prefill_attention_merge (workspace: _prefill_workspace)."""
        op = {"cuda_cores": "prefill_attention", "tc": "prefill_attention_tc", "wg": "prefill_attention_wg"}[kind]
        Hq, D, Hkv, M, n_blocks = self._paged(op, q, k_cache, v_cache, block_tables, seq_lens, block_size, out)
        self._check(op, I32, query_start_loc)
        B = seq_lens.shape[0]
        if query_start_loc.shape != (B + 1,):
            raise ValueError(f"{op}: query_start_loc {query_start_loc.shape} != ({B + 1},)")
        if kind != "cuda_cores" and (self.dtype == "float32" or D not in TC_HEAD_DIMS):
            raise ValueError(f"{op}: {self.dtype}, head dim {D} (16-bit dtypes, head dim in {TC_HEAD_DIMS})")
        if kind == "wg" and not self.sm90:
            raise ValueError(f"{op}: needs an sm_90 (Hopper) GPU")
        if not B or max_query_len < 1 or not q.shape[0]:
            return
        args = (q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, _i32(block_size), _i32(M),
                _i32(n_blocks), _f32(scale), _i32(Hq), _i32(Hkv))
        if kind == "wg":  # Q, two K and two V tiles (128-byte swizzled), and 1 KB to align them to 1,024 bytes
            bn, N, tiles = WG_KEYS[D], q.shape[0], -(-int(max_query_len) // WG_QUERIES)
            n = n_splits or prefill_splits(B, int(max_query_len), N, Hq, D, self.num_sms)
            n = max(1, min(PREFILL_MAX_SPLITS, int(n)))
            ws_o, ws_ml = self._prefill_workspace(N, Hq, D, n)
            smem = (WG_QUERIES + 4 * bn) * D * self.itemsize + 1024
            f = self._fn("prefill_attention", f"prefill_attention_wg<{self.ctype}, {D}, {bn}>", smem, sm90a=True)
            f((Hq, B, tiles * n), (256,), args + (_i32(n), ws_o, ws_ml, out), shared_mem=smem)
            if n > 1:
                merge = self._fn("prefill_attention", f"prefill_attention_merge<{self.ctype}>")
                merge((N,), (128,), (ws_o, ws_ml, query_start_loc, seq_lens, _i32(B), _i32(M * block_size), _i32(n),
                                     _i32(WG_QUERIES), _i32(bn), _i32(Hq), _i32(D), out))
        elif kind == "tc":
            smem = 5 * 64 * (D + 8) * self.itemsize  # Q + double-buffered K and V, rows padded by 8
            f = self._fn("prefill_attention", f"prefill_attention_tc<{self.ctype}, {D}>", smem)
            f((Hq, B, -(-int(max_query_len) // 64)), (128,), args + (out,), shared_mem=smem)
        else:
            smem = (16 * D + 32 * (D + 1) + 32 * D) * 4
            f = self._fn("prefill_attention", f"prefill_attention<{self.ctype}>", smem)
            f((Hq, B, -(-int(max_query_len) // 16)), (128,), args + (_i32(D), out), shared_mem=smem)

    def _prefill_workspace(self, N, Hq, D, n):
        """The split partials of prefill_attention_wg for N rows: fp32 [rows, Hq, n, D] and [rows, Hq, n, 2] with
        rows = prefill_workspace_rows(N), made once and kept, since a captured graph holds their addresses; so eager
        steps of every other row count share a few buffers instead of adding one each. (None, None) for one split."""
        if n == 1:
            return None, None
        key = (prefill_workspace_rows(N), Hq, D, n)
        ws = self._prefill_ws.get(key)
        if ws is None:
            ws = self._prefill_ws[key] = (self.cp.empty((key[0], Hq, n, D), self.cp.float32),
                                          self.cp.empty((key[0], Hq, n, 2), self.cp.float32))
        return ws

    prefill_attention = functools.partialmethod(_prefill, "cuda_cores")
    prefill_attention_tc = functools.partialmethod(_prefill, "tc")
    prefill_attention_wg = functools.partialmethod(_prefill, "wg")

    def _decode(self, kind, q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, max_seq_len,
                n_splits=None):
        """One query per sequence and head, q[B, Hq, D], over keys 0..seq_lens[b]-1 of the paged caches ->
        out[B, Hq, D] (zeros where seq_lens[b] == 0). max_seq_len (>= every seq_lens entry) and B fix the split
        count and workspace: one plan, reused by every call and graph replay of that shape. kind: "cuda_cores"
        (kernels/decode_attention.cu), "tc" (decode_attention_tc.cu: a GQA group's heads as the rows of one mma
        tile) or "stream" (its long-context form, decode_attention_tc_stream: a ring of K/V tiles in flight); the
        last two for 16-bit dtypes, D 64 or 128 and groups of up to TC_DECODE_GROUP heads (ValueError otherwise).
        n_splits overrides the plan's split count (dev/ sweeps; at most MAX_SPLITS)."""
        op = "decode_attention" if kind == "cuda_cores" else "decode_attention_tc"
        Hq, D, Hkv, M, n_blocks = self._paged(op, q, k_cache, v_cache, block_tables, seq_lens, block_size, out)
        B = q.shape[0]
        if seq_lens.shape != (B,):
            raise ValueError(f"{op}: seq_lens {seq_lens.shape} != ({B},)")
        if kind != "cuda_cores" and (self.dtype == "float32" or D not in TC_HEAD_DIMS or Hq // Hkv > TC_DECODE_GROUP):
            raise ValueError(f"{op}: {self.dtype}, head dim {D}, {Hq // Hkv} q heads a kv head (16-bit dtypes, "
                             f"head dim in {TC_HEAD_DIMS}, at most {TC_DECODE_GROUP} q heads a kv head)")
        if not B:
            return
        key = (B, Hq, Hkv, D, max_seq_len, kind, n_splits)
        if key not in self._decode_plans:
            self._decode_plans[key] = self._decode_plan(*key)
        fn, grid, n, ws_ml, ws_acc, counters, smem = self._decode_plans[key]
        self._go(fn, grid, (128,), (q, k_cache, v_cache, block_tables, seq_lens, _i32(block_size), _i32(M),
                                    _i32(n_blocks), _f32(scale * LOG2E), _i32(Hq), _i32(Hkv), n, ws_ml, ws_acc,
                                    counters, out), smem)

    decode_attention = functools.partialmethod(_decode, "cuda_cores")
    decode_attention_tc = functools.partialmethod(_decode, "tc")
    decode_attention_stream = functools.partialmethod(_decode, "stream")

    def _decode_plan(self, B, Hq, Hkv, D, max_seq_len, kind, n_splits=None):
        """Kernel, grid, split count and workspace for one plan: made once, so decode steps allocate nothing."""
        if D not in DECODE_HEAD_DIMS:
            raise ValueError(f"decode_attention: head dim {D} not in {DECODE_HEAD_DIMS}")
        group, L = Hq // Hkv, max(1, max_seq_len)
        if kind == "stream":  # a block a GQA group, few long splits (the merge reads them all in one block)
            head_blocks, n = 1, stream_splits(B, Hkv, self.num_sms, L)
        elif kind == "tc":  # a block takes the whole group (up to 16 heads: the A tile's rows), tiles of 64 keys
            head_blocks = 1
            n = decode_splits(B, Hkv, 1, D, self.itemsize, self.num_sms, L, TC_DECODE_KT, TC_ONE_SPLIT_TILES)
        else:
            head_blocks = decode_head_blocks(B, Hkv, group, self.num_sms, plan_kv_bytes(B, Hkv, D, self.itemsize, L))
            n = decode_splits(B, Hkv, head_blocks, D, self.itemsize, self.num_sms, L)
        n = max(1, min(MAX_SPLITS, n_splits or n))
        ws_ml = self.cp.empty((B, Hq, n, 2), self.cp.float32)
        ws_acc = self.cp.empty((B, Hq, n, D), self.cp.float32)
        grid = (Hkv * head_blocks, n, B)
        counters = self.cp.zeros((B, grid[0]), self.cp.uint32)  # the kernel leaves them zeroed
        if kind != "cuda_cores":  # Q (16 rows) and 2 (tc) or STREAM_STAGES (stream) K and V tiles, rows padded by 8
            stages = STREAM_STAGES[D] if kind == "stream" else 2
            smem = (TC_DECODE_GROUP + 2 * stages * TC_DECODE_KT) * (D + 8) * self.itemsize
            name = "decode_attention_tc_stream" if kind == "stream" else "decode_attention_tc"
            fn = self._fn("decode_attention_tc", f"{name}<{self.ctype}, {D}>", smem)
        else:
            smem, fn = 0, self._fn("decode_attention", f"decode_attention<{self.ctype}, {D}>")
        return fn, grid, _i32(n), ws_ml, ws_acc, counters, smem
