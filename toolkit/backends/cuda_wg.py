"""Launcher of kernels/gemm_wg.cu: a decode step's gate_up projection with SwiGLU as its epilogue, on Hopper's wgmma
with TMA loads (sm_90 GPUs, 16-bit types, up to 128 rows).

The kernel reads x and the gate_up weight through TMA descriptors ("tensor maps": the matrix's address, shape and
row stride, the box a copy moves and its 128-byte swizzle), made on the host by the driver
(cuTensorMapEncodeTiled) and passed by value as kernel parameters. A descriptor is made once per (address, shape)
and cached, so a replayed step computes nothing here (a captured launch keeps its parameters' bytes). A map holds no
data, only where the data is, so an array freed and another of the same shape made at the same address reuses it
rightly.
"""
import numpy as np

from .cuda_launch import StructParam, launch_by_value

GW_BK = 64  # K a stage (GW_BK in gemm_wg.cu)
T_COLS = 32  # output columns a tile (GWT_COLS)
CTAS = 2     # blocks an SM (the kernel's CTAS): the 0.5B's 152 tiles in one wave on 132 SMs
# gemm_wg_swiglu_t's instantiations: NB (the step's rows padded: wgmma's n) -> stages, as many as about 110 KB of
# shared memory hold at two blocks an SM (a stage is 8 KB of weights and NB x 128 bytes of x). (One block an SM with
# about 220 KB of stages, T_CONFIG, measured slower in the step: experiments/NOTEBOOK.md.)
T2_STAGES = {8: 11, 16: 10, 32: 8, 64: 6, 128: 4}
MAX_ROWS = max(T2_STAGES)


def t_rows(M: int) -> int:
    """gemm_wg_swiglu_t's NB for M rows: the smallest instantiation that holds them."""
    return next(nb for nb in sorted(T2_STAGES) if nb >= M)


def kernel_name(ctype: str, M: int = 1) -> str:
    nb = t_rows(M)
    return f"gemm_wg_swiglu_t<{ctype}, {nb}, {T2_STAGES[nb]}, {CTAS}>"


def kernel_names(ctype: str) -> list:
    """gemm_wg_swiglu_t's instantiations for one element type (sm_90a; none for fp32: wgmma takes 16-bit inputs)."""
    return [] if ctype == "float" else [kernel_name(ctype, nb) for nb in sorted(T2_STAGES)]


def t_smem_bytes(nb: int) -> int:
    """gemm_wg_swiglu_t's dynamic shared memory: the ring, up [32, NB] in T, the barriers, and 1 KB to align the
    ring to 1,024 bytes (the 128-byte swizzle's period)."""
    stages = T2_STAGES[nb]
    return stages * (2 * T_COLS + nb) * GW_BK * 2 + T_COLS * nb * 2 + 16 * stages + 1024


def gw_shape_ok(M: int, I: int, K: int) -> bool:
    """Whether gemm_wg_swiglu takes an x [M, K] by gate_up [2I, K] product: up to MAX_ROWS rows, rows of whole
    16-byte units (TMA's row strides); I and K are otherwise free (the copies fill what lies past the matrix with
    zeros, the stores skip it)."""
    return 1 <= M <= MAX_ROWS and I >= 1 and K >= 1 and K % 8 == 0 and I % 8 == 0


class WgGemms:
    """CudaKernels' launcher of gemm_wg.cu (a mixin: self is the CudaKernels, for its checks, functions and
    caches)."""

    def _tensor_map(self, a, rows: int, cols: int, box_rows: int) -> StructParam:
        """The TMA descriptor of the 16-bit row-major matrix a [rows, cols] (cached): boxes of 64 columns x box_rows
        rows, 128-byte swizzle, zeros past the matrix; its 128 bytes for a by-value kernel parameter."""
        key = (a.data.ptr, rows, cols, box_rows, self.dtype)
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
            tm = self._tmaps[key] = StructParam(tmap.opaque)  # its 128 bytes
        return tm

    def gemm_wg_swiglu(self, x, w, out):
        """out[M, I] = silu(x @ w[:I].T) * (x @ w[I:].T) for x [M, K], w = gate_up [2I, K]: silu_mul's bits from a
        gate_up product rounded to the storage type, never written. sm_90 GPUs, 16-bit types, 1 <= M <= MAX_ROWS, I
        and K multiples of 8, 16-byte aligned x and w."""
        self._check("gemm_wg_swiglu", self.storage, x, w, out)
        M, K = x.shape
        I = w.shape[0] // 2
        if (not self.sm90 or self.itemsize != 2 or w.shape != (2 * I, K) or out.shape != (M, I)
                or not gw_shape_ok(M, I, K) or x.data.ptr % 16 or w.data.ptr % 16 or out.data.ptr % 4):
            raise ValueError(f"gemm_wg_swiglu: x {x.shape}, w {w.shape}, out {out.shape} in {self.dtype} (an sm_90 "
                             f"GPU, 16-bit types, 1 <= M <= {MAX_ROWS}, w [2I, K], out [M, I], I and K multiples of "
                             f"8, x and w 16-byte aligned)")
        nb = t_rows(M)  # one 32-column tile a block, x's rows padded to NB
        smem = t_smem_bytes(nb)
        f = self._fn("gemm_wg", kernel_name(self.ctype, M), smem, sm90a=True)
        args = (self._tensor_map(x, M, K, nb), self._tensor_map(w, 2 * I, K, T_COLS), out, np.int32(M), np.int32(I),
                np.int32(K))
        # By-value maps: CuPy's call cannot pass a struct, so the driver's launch, PDL in a decode step's chain
        # (weights before the wait, gemm_wg.cu)
        launch_by_value(f, (-(-I // T_COLS),), (160,), args, smem, self.cp.cuda.get_current_stream().ptr, self.pdl)
