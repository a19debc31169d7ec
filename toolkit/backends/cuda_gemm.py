"""Launchers of the skinny GEMMs of a decode step at 2-32 rows, on tensor cores (kernels/gemm_skinny.cu): the plain
projection, its SwiGLU form, and the qkv and o projections with RoPE / the post-attention norm as their epilogue.

A plan per shape (rows, N, K, SwiGLU or not, output type) holds the kernel, grid, block and shared memory, made
on the first call (the runner's eager step before each capture), so a replayed step computes nothing here.
"""
import functools

import numpy as np

F32 = np.dtype(np.float32)
K_CHUNK = 32         # GS_K in gemm_skinny.cu
N_TILES = (1, 2, 4)  # gemm_skinny<..., NT, ...> instantiations: 8 rows an n-tile, so up to 32 rows
MAX_ROWS = 8 * N_TILES[-1]


def skinny_plan(M: int, N: int, K: int, n_sm: int, swiglu: bool = False, rope: bool = False) -> tuple:
    """(MT, NT, WK, S) for y[M, N] = x[M, K] @ w.T (swiglu: N = I output columns from 2I weight rows).
    NT: the fewest 8-row n-tiles that hold M (2 or more with SwiGLU). MT: 2 m-tiles (32 weight rows a tile) when
    there are still a tile an SM, else 1: every block reads its slice of x from L2, so wider tiles read it fewer
    times. Where the tiles leave SMs idle: a long K (more than 32 chunks: the down projection, 56 tiles of 4,864
    columns at Qwen2.5-0.5B) is cut into the fewest S slices that give a block an SM, 8 warps each; a short one
    gets 16 warps a block (more weight bytes in flight). Else 8 warps. Measured on the H200 at 2-32 rows
    (experiments/logs/gemm_skinny.log): 16 warps beat 8 on qkv at 32 rows (3.76 against 4.48 us) and o (3.56
    against 4.33); on the down projection 4 slices of 8 warps beat 1 of 16 (6.65 against 8.15 us at 2 rows, 9.12
    against 10.06 at 32). rope (gemm_skinny_rope, and gemm_skinny_norm): MT = 1, a RoPE pair's halves being one
    m-tile's two rows (the norm's epilogue is written for 16-column tiles)."""
    NT = next(t for t in N_TILES if 8 * t >= M and (t > 1 or not swiglu))  # (SwiGLU at NT = 1 spills registers)
    MT = 2 if swiglu or (-(-N // 32) >= n_sm and not rope) else 1
    tiles = -(-N // (16 if swiglu else 16 * MT))
    chunks = K // K_CHUNK
    WK, S = min(8, chunks), 1  # (a K of fewer than 8 chunks: a warp a chunk)
    if tiles < n_sm and chunks > 32:
        fits = [s for s in range(2, chunks + 1) if chunks % s == 0 and chunks // s >= WK]
        S = next((s for s in fits if tiles * s >= n_sm), fits[-1] if fits else 1)
    elif tiles < n_sm:
        WK = min(16, chunks)
    # The warps' partial tiles (WK * F * 128 bytes of shared memory, F = MT * NT * 4) stay within 32 KB: past 48 KB
    # a launch needs an opt-in (a 12-warp SwiGLU block at 32 rows failed to launch without one).
    return MT, NT, min(WK, 256 // (MT * NT * 4)), S


def kernel_names(ctype: str) -> list:
    """gemm_skinny's instantiations for one element type (none for fp32: tensor cores take 16-bit inputs)."""
    if ctype == "float":
        return []
    plain = [f"gemm_skinny<{ctype}, {o}, {mt}, {nt}, false>" for o in (ctype, "float") for mt in (1, 2)
             for nt in N_TILES]
    return (plain + [f"gemm_skinny<{ctype}, {ctype}, 2, {nt}, true>" for nt in N_TILES[1:]]
            + [f"gemm_skinny_{form}<{ctype}, {nt}>" for form in ("rope", "norm") for nt in N_TILES])


class SkinnyGemms:
    """CudaKernels' launchers of gemm_skinny.cu (a mixin: self is the CudaKernels, for its checks, functions,
    launch and plan cache)."""

    def _skinny(self, swiglu: bool, x, w, out, *, split=None):
        """out[M, N] = x[M, K] @ w[N, K].T, or with swiglu (w = gate_up [2I, K], out [M, I]) silu(gate) * up, for
        1 <= M <= 32 rows, 16-bit types, K % 32 == 0; out is the storage dtype or fp32 (SwiGLU: the storage
        dtype). split: (MT, WK, S) instead of skinny_plan's (benchmarks and tests)."""
        self._check("gemm_skinny", self.storage, x, w)
        M, K = x.shape
        N = w.shape[0] // 2 if swiglu else w.shape[0]
        if (self.itemsize != 2 or not 1 <= M <= MAX_ROWS or w.shape[1] != K or K % K_CHUNK
                or out.shape != (M, N) or (swiglu and w.shape[0] != 2 * N)):
            raise ValueError(f"gemm_skinny{'_swiglu' if swiglu else ''}: x {x.shape}, w {w.shape}, out {out.shape} "
                             f"in {self.dtype} (16-bit types, 1 <= M <= {MAX_ROWS}, K % {K_CHUNK} == 0)")
        to = "float" if out.dtype == F32 else self.ctype
        self._check("gemm_skinny", F32 if to == "float" else self.storage, out)
        if swiglu and to == "float":
            raise ValueError("gemm_skinny_swiglu: writes the storage type")
        plans, key = self._gemm_plans, (M, N, K, swiglu, to, split)
        if key not in plans:
            plans[key] = self._skinny_plan(M, N, K, swiglu, to, split)
        fn, grid, block, ws, counters, ints, smem = plans[key]
        self._go(fn, grid, block, (x, w, out, ws, counters, *ints), smem)

    gemm_skinny = functools.partialmethod(_skinny, False)
    gemm_skinny_swiglu = functools.partialmethod(_skinny, True)  # the bits of gemm_skinny, then silu_mul

    def gemm_skinny_rope(self, x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
                         v_cache, *, split=None):
        """qkv = x @ w.T and then rope_qkv's work in one kernel (no q/k norms): bias, RoPE, q -> q_out, K/V -> the
        caches at slot_mapping, with rope_qkv's skips and roundings; the qkv projection of a decode step at
        1 <= M <= 32 rows (bf16/fp16). split: (WK, S) instead of the plan's."""
        M, K, N, D, num_slots = self._check_rope_projection("gemm_skinny_rope", MAX_ROWS, K_CHUNK, 16, x, w, bias,
                                                            cos, sin, positions, slot_mapping, n_heads, n_kv_heads,
                                                            q_out, k_cache, v_cache)
        plans, key = self._gemm_plans, (M, N, K, "rope", D, split and (1, *split))
        if key not in plans:
            plans[key] = self._skinny_plan(M, N, K, False, self.ctype, split and (1, *split), D)
        fn, grid, block, ws, counters, (m, _, k), smem = plans[key]
        self._go(fn, grid, block, (x, w, ws, counters, m, k, bias, cos, sin, positions, slot_mapping,
                                   np.int32(n_heads), np.int32(n_kv_heads), np.int32(D), np.int32(cos.shape[0]),
                                   np.int32(num_slots), q_out, k_cache, v_cache), smem)

    def gemm_skinny_norm(self, x, w, residual, norm_w, x_out, parts, *, split=None):
        """The o projection y = x[M, K] @ w.T of a decode step at 1 <= M <= 32 rows with the post-attention
        add_rmsnorm folded in: residual += y (add_rmsnorm's add and roundings), x_out = residual * norm_w,
        parts[N / 16, M] = the row's sums of squares a tile of 16 columns; silu_mul_scaled applies the norm's
        scale after the gate_up GEMM. split: (WK, S) instead of the plan's."""
        self._check("gemm_skinny_norm", self.storage, x, w, residual, norm_w, x_out)
        self._check("gemm_skinny_norm", F32, parts)
        M, K = x.shape
        N = w.shape[0]
        if (self.itemsize != 2 or not 1 <= M <= MAX_ROWS or w.shape[1] != K or K % K_CHUNK or N % 16
                or residual.shape != (M, N) or x_out.shape != (M, N) or norm_w.shape != (N,)
                or parts.dtype != F32 or parts.size < N // 16 * M):
            raise ValueError(f"gemm_skinny_norm: x {x.shape}, w {w.shape}, residual {residual.shape}, norm weight "
                             f"{norm_w.shape}, out {x_out.shape}, parts {parts.shape} {parts.dtype} in {self.dtype} "
                             f"(16-bit types, 1 <= M <= {MAX_ROWS}, K % {K_CHUNK} == 0, N % 16 == 0, float32 parts "
                             f"of N / 16 * M)")
        plans, key = self._gemm_plans, (M, N, K, "norm", split and (1, *split))
        if key not in plans:
            plans[key] = self._skinny_plan(M, N, K, False, self.ctype, split and (1, *split), norm=True)
        fn, grid, block, ws, counters, ints, smem = plans[key]
        self._go(fn, grid, block, (x, w, ws, counters, *ints, residual, norm_w, x_out, parts), smem)

    def _skinny_plan(self, M, N, K, swiglu, to, split, rope_d=0, norm=False):
        """The launch: kernel, grid (tiles, slices), block, split-K workspace and counters, int arguments, shared
        memory. rope_d: gemm_skinny_rope's, for heads of rope_d dims; norm: gemm_skinny_norm's (one m-tile)."""
        MT, NT, WK, S = skinny_plan(M, N, K, self.num_sms, swiglu, rope=bool(rope_d) or norm)
        if split is not None:
            MT, WK, S = split
            MT = 2 if swiglu else MT
        chunks = K // K_CHUNK
        if chunks % S or chunks // S < WK or WK * MT * NT * 4 > 256:
            raise ValueError(f"gemm_skinny: split (MT {MT}, WK {WK}, S {S}) does not fit {chunks} chunks of K "
                             f"(each warp a chunk, partial tiles within 32 KB)")
        tiles = -(-N // (16 if swiglu else 16 * MT))
        F = MT * NT * 4
        smem = WK * F * 32 * 4  # the warps' fp32 partial tiles
        name = (f"gemm_skinny_rope<{self.ctype}, {NT}>" if rope_d else f"gemm_skinny_norm<{self.ctype}, {NT}>"
                if norm else f"gemm_skinny<{self.ctype}, {to}, {MT}, {NT}, {'true' if swiglu else 'false'}>")
        fn = self._fn("gemm_skinny", name, smem)
        cp = self.cp
        ws = cp.empty(S * tiles * F * 32 if S > 1 else 1, cp.float32)  # each slice's fp32 tiles
        counters = cp.zeros(tiles if S > 1 else 1, cp.uint32)  # the kernel leaves them zero
        return fn, (tiles, S), (32 * WK,), ws, counters, tuple(np.int32(v) for v in (M, N, K)), smem
