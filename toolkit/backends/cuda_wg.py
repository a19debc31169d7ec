"""Launcher of kernels/gemm_wg.cu: a decode step's gate_up projection with SwiGLU as its epilogue, on Hopper's wgmma
with TMA loads (sm_90 GPUs, 16-bit types).

The kernel reads x and the gate_up weight through TMA descriptors ("tensor maps": the matrix's address, shape and
row stride, the box a copy moves and its 128-byte swizzle), made on the host by the driver
(cuTensorMapEncodeTiled) and kept in device memory, where the kernel reads them. A descriptor is made once per
(address, shape) on the first call (the runner's eager step before each capture: inside a capture the copy to the
device could not run) and cached, so a replayed step computes nothing here. A map holds no data, only where the
data is, so an array freed and another of the same shape made at the same address reuses it rightly.
"""
import ctypes

import numpy as np

GW_BM, GW_BK = 128, 64   # rows a tile and K a stage (GW_BM, GW_BK in gemm_wg.cu)
# (BNH, STAGES, CTAS, KIND): output columns a tile, stages of the ring, blocks an SM, and the kernel: KIND 0 the
# cooperative one (both consumer warpgroups on each 128-row tile), 1 the ping-pong one (each consumer warpgroup its
# own tiles, taking turns), 2 the decode one with the operands swapped (gemm_wg_swiglu_t: 32 columns a tile, the
# step's rows padded to NB as wgmma's n, STAGES by NB: T_STAGES). GW_CONFIG is the plan's; GW_CONFIGS every
# configuration (dev/gemm_wg.py times each, the GPU tests run each).
T_CONFIG = (32, 0, 1, 2)
T2_CONFIG = (32, 0, 2, 2)  # the same at two blocks an SM (fewer stages: T2_STAGES)
GW_CONFIG = T2_CONFIG
# (Session 22's (64, 3, 2, 0) needs more than the 80 registers two blocks an SM leave, now that gate and up are one
# wgmma: ptxas refuses it.)
GW_CONFIGS = ((128, 4, 1, 0), (64, 6, 1, 0), (64, 6, 1, 1), (32, 8, 1, 0), (32, 4, 2, 0), T_CONFIG, T2_CONFIG)
# gemm_wg_swiglu_t's instantiations: NB (the rows padded: wgmma's n) -> stages, as many as about 220 KB of shared
# memory hold (a stage is 8 KB of weights and NB x 128 bytes of x): most or all of a tile's K in flight at once;
# T2_STAGES: about 110 KB, two blocks an SM (the 0.5B's 152 tiles in one wave on 132 SMs).
T_STAGES = {8: 24, 16: 21, 32: 17, 64: 13, 128: 8}
T2_STAGES = {8: 11, 16: 10, 32: 8, 64: 6, 128: 4}
T_COLS = 32  # output columns a tile (GWT_COLS)


def config_id(config: tuple) -> str:
    """A configuration's name in dev/ output and test ids."""
    bnh, stages, ctas, kind = config
    return ("t" if ctas == 1 else f"t{ctas}") if kind == 2 else f"{bnh}x{stages}x{ctas}{'pp' if kind == 1 else ''}"


def t_rows(M: int) -> int:
    """gemm_wg_swiglu_t's NB for M rows: the smallest instantiation that holds them."""
    return next(nb for nb in sorted(T_STAGES) if nb >= M)


def t_stages(nb: int, ctas: int) -> int:
    return (T_STAGES if ctas == 1 else T2_STAGES)[nb]


def kernel_name(ctype: str, config: tuple, M: int = 1) -> str:
    bnh, stages, ctas, kind = config
    if kind == 2:
        nb = t_rows(M)
        return f"gemm_wg_swiglu_t<{ctype}, {nb}, {t_stages(nb, ctas)}, {ctas}>"
    if kind == 1:
        return f"gemm_wg_swiglu_pp<{ctype}, {bnh}, {stages}>"
    return f"gemm_wg_swiglu<{ctype}, {bnh}, {stages}, {ctas}>"


def kernel_names(ctype: str) -> list:
    """gemm_wg_swiglu's instantiations for one element type (sm_90a; none for fp32: wgmma takes 16-bit inputs)."""
    if ctype == "float":
        return []
    return ([kernel_name(ctype, c) for c in GW_CONFIGS if c[3] != 2]
            + [kernel_name(ctype, c, nb) for c in GW_CONFIGS if c[3] == 2 for nb in sorted(T_STAGES)])


def t_smem_bytes(nb: int, ctas: int = 1) -> int:
    """gemm_wg_swiglu_t's dynamic shared memory: the ring, up [32, NB] in T, inv [NB], the barriers, and 1 KB to
    align the ring."""
    stages = t_stages(nb, ctas)
    return stages * (2 * T_COLS + nb) * GW_BK * 2 + T_COLS * nb * 2 + nb * 4 + 16 * stages + 1024


def smem_bytes(bnh: int, stages: int) -> int:
    """Dynamic shared memory: the ring (A 128 x 64, gate and up BNH x 64 each, 16-bit), the full and empty
    barriers, and 1 KB to align the ring to 1,024 bytes (the 128-byte swizzle's period)."""
    return stages * (GW_BM + 2 * bnh) * GW_BK * 2 + 16 * stages + 1024


def gw_shape_ok(M: int, I: int, K: int) -> bool:
    """Whether gemm_wg_swiglu takes an x [M, K] by gate_up [2I, K] product: rows of whole 16-byte units (TMA's row
    strides); M, I and K are otherwise free (the copies fill what lies past the matrix with zeros, the stores skip
    it)."""
    return M >= 1 and I >= 1 and K >= 1 and K % 8 == 0 and I % 8 == 0


class TensorMapParam:
    """A CUtensorMap's 128 bytes, passed by value (a __grid_constant__ kernel parameter)."""

    def __init__(self, opaque):
        self.c = (ctypes.c_uint64 * 16)(*[int(v) for v in opaque])


_C_ARG = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.float32): ctypes.c_float}
_DRIVER = {}


def launch_by_value(f, grid, block, args, smem: int, stream_ptr: int, pdl: bool):
    """f(args) through cuLaunchKernelEx with kernelParams as a void* array of the arguments' addresses (what the C
    API takes: the driver copies each parameter's bytes at the launch, a stream capture into its node), so an
    argument may be a struct (TensorMapParam); with pdl, the programmatic-serialization attribute
    (cuda_launch.py)."""
    from cuda.bindings import driver as d

    objs = []
    for a in args:
        if a is None:
            objs.append(ctypes.c_void_p(0))
        elif isinstance(a, TensorMapParam):
            objs.append(a.c)
        elif isinstance(a, np.generic):
            objs.append(_C_ARG[a.dtype](a.item()))
        else:
            objs.append(ctypes.c_void_p(a.data.ptr))
    params = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (tuple(grid) + (1, 1))[:3]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (tuple(block) + (1, 1))[:3]
    cfg.sharedMemBytes = smem
    cfg.hStream = d.CUstream(stream_ptr)
    if pdl:
        if "attrs" not in _DRIVER:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            _DRIVER["attrs"] = [attr]
        cfg.attrs, cfg.numAttrs = _DRIVER["attrs"], 1
    err, = d.cuLaunchKernelEx(cfg, d.CUfunction(f.kernel.ptr), ctypes.addressof(params), 0)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx (gemm_wg_swiglu_t) failed: {err.name}")


class WgGemms:
    """CudaKernels' launcher of gemm_wg.cu (a mixin: self is the CudaKernels, for its checks, functions and
    caches)."""

    def _tensor_map(self, a, rows: int, cols: int, box_rows: int, on_host: bool = False):
        """The TMA descriptor of the 16-bit row-major matrix a [rows, cols] (cached): boxes of 64 columns x box_rows
        rows, 128-byte swizzle, zeros past the matrix. In device memory, or (on_host) its 128 bytes as a ctypes
        array for a by-value kernel parameter (gemm_wg_swiglu_t)."""
        key = (a.data.ptr, rows, cols, box_rows, self.dtype, on_host)
        tm = self._tmaps.get(key)
        if tm is None:
            from cuda.bindings import driver as d

            kind = (d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if self.dtype == "bfloat16"
                    else d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16)
            err, tmap = d.cuTensorMapEncodeTiled(
                kind, 2, a.data.ptr, [d.cuuint64_t(cols), d.cuuint64_t(rows)], [d.cuuint64_t(cols * 2)],
                [d.cuuint32_t(GW_BK), d.cuuint32_t(box_rows)], [d.cuuint32_t(1), d.cuuint32_t(1)],
                d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
            if err != d.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuTensorMapEncodeTiled: {err.name}")
            tm = self._tmaps[key] = (TensorMapParam(tmap.opaque) if on_host
                                     else self.cp.asarray(np.array(tmap.opaque, dtype=np.uint64)))
        return tm

    def gemm_wg_swiglu(self, x, w, out, *, config=None, parts=None, eps=0.0):
        """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for x [M, K], w = gate_up [2I, K]: silu_mul's bits from a
        gate_up product rounded to the storage type, never written. With parts (float32 [tiles, M], the sums of
        squares gemm_skinny_norm left), silu_mul_scaled's bits: each row's product scaled by its RMSNorm inv =
        rsqrt(sum / (16 tiles) + eps) first. sm_90 GPUs, 16-bit types, I and K multiples of 8, 16-byte aligned x and
        w. config: one of GW_CONFIGS instead of the plan's (dev/, tests); T_CONFIG takes up to 128 rows."""
        bnh, stages, ctas, kind = config = config or GW_CONFIG
        self._check("gemm_wg_swiglu", self.storage, x, w, out)
        M, K = x.shape
        I = w.shape[0] // 2
        if (not self.sm90 or self.itemsize != 2 or config not in GW_CONFIGS or w.shape != (2 * I, K)
                or (kind == 2 and M > max(T_STAGES))
                or out.shape != (M, I) or not gw_shape_ok(M, I, K) or x.data.ptr % 16 or w.data.ptr % 16
                or out.data.ptr % 4 or (parts is not None and (parts.ndim != 2 or parts.shape[1] != M))):
            raise ValueError(f"gemm_wg_swiglu: x {x.shape}, w {w.shape}, out {out.shape}"
                             f"{'' if parts is None else f', parts {parts.shape}'} in {self.dtype} (an sm_90 GPU, "
                             f"16-bit types, w [2I, K], out [M, I], parts [tiles, M], I and K multiples of 8, x and w "
                             f"16-byte aligned)")
        tiles = parts.shape[0] if parts is not None else 0
        if parts is not None:
            self._check("gemm_wg_swiglu", np.dtype(np.float32), parts)
        scale = (parts, np.int32(tiles), np.int32(16 * tiles), np.float32(eps))
        if kind == 2:  # the swapped decode kernel: one 32-column tile a block, x's rows padded to NB
            nb = t_rows(M)
            smem = t_smem_bytes(nb, ctas)
            f = self._fn("gemm_wg", kernel_name(self.ctype, config, M), smem, sm90a=True)
            args = (self._tensor_map(x, M, K, nb, True), self._tensor_map(w, 2 * I, K, T_COLS, True), out,
                    np.int32(M), np.int32(I), np.int32(K)) + scale
            # By-value maps: CuPy's call cannot pass a struct, so the driver's launch, PDL in a decode step's chain
            # (weights before the wait, gemm_wg.cu)
            launch_by_value(f, (-(-I // T_COLS),), (160,), args, smem, self.cp.cuda.get_current_stream().ptr,
                            self.pdl)
            return
        smem = smem_bytes(bnh, stages)
        f = self._fn("gemm_wg", kernel_name(self.ctype, config), smem, sm90a=True)
        args = (self._tensor_map(x, M, K, GW_BM), self._tensor_map(w, 2 * I, K, bnh), out, np.int32(M), np.int32(I),
                np.int32(K)) + scale
        grid = min(-(-M // GW_BM) * -(-I // bnh), ctas * self.num_sms)
        self._go(f, (grid,), (384,), args, smem)  # PDL in a decode step's chain (GwRing::produce)

    def gemm_wg_swiglu_scaled(self, x, w, parts, eps, out):
        """gemm_wg_swiglu with silu_mul_scaled's bits: the decode step's gate_up after a gemm_skinny_norm o."""
        self.gemm_wg_swiglu(x, w, out, parts=parts, eps=eps)
