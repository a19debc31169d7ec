"""Launchers of the skinny GEMMs of a decode step at 2-32 rows, on tensor cores: gemm_skinny (kernels/gemm_skinny.cu,
the small projections) and gemm_stream (kernels/gemm_stream.cu, the MLP's big ones, weights through shared memory).

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
    (benchmarks/results/gemm_skinny.log): 16 warps beat 8 on qkv at 32 rows (3.76 against 4.48 us) and o (3.56
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


def gemm_skinny(kernels, x, w, out, swiglu: bool = False, split=None):
    """out[M, N] = x[M, K] @ w[N, K].T, or with swiglu (w = gate_up [2I, K], out [M, I]) silu(gate) * up,
    for 1 <= M <= 32 rows, 16-bit types, K % 32 == 0 (see CudaKernels.gemm_skinny). split: (MT, WK, S) instead
    of skinny_plan's (benchmarks and tests)."""
    kernels._check("gemm_skinny", kernels.storage, x, w)
    M, K = x.shape
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    if (kernels.itemsize != 2 or not 1 <= M <= MAX_ROWS or w.shape[1] != K or K % K_CHUNK
            or out.shape != (M, N) or (swiglu and w.shape[0] != 2 * N)):
        raise ValueError(f"gemm_skinny{' (swiglu)' if swiglu else ''}: x {x.shape}, w {w.shape}, out {out.shape} "
                         f"in {kernels.dtype} (16-bit types, 1 <= M <= {MAX_ROWS}, K % {K_CHUNK} == 0)")
    to = "float" if out.dtype == F32 else kernels.ctype
    kernels._check("gemm_skinny", F32 if to == "float" else kernels.storage, out)
    if swiglu and to == "float":
        raise ValueError("gemm_skinny: the SwiGLU form writes the storage type")
    key = (M, N, K, swiglu, to, split)
    plan = kernels._gemm_plans.get(key)
    if plan is None:
        plan = kernels._gemm_plans[key] = _plan(kernels, M, N, K, swiglu, to, split)
    fn, grid, block, ws, counters, ints, smem = plan
    kernels._go(fn, grid, block, (x, w, out, ws, counters, *ints), smem)


def gemm_skinny_rope(kernels, x, w, bias, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
                     v_cache, split=None):
    """The qkv projection x[M, K] @ w.T with rope_qkv's epilogue (bias, RoPE, q to q_out, K/V to the caches at
    slot_mapping; see CudaKernels.gemm_skinny_rope, which checks the rope arguments). split: (WK, S) instead of
    the plan's."""
    M, K = x.shape
    num_slots, _, D = k_cache.shape
    N = (n_heads + 2 * n_kv_heads) * D
    if (kernels.itemsize != 2 or not 1 <= M <= MAX_ROWS or w.shape != (N, K) or K % K_CHUNK or D % 16
            or (bias is not None and bias.shape != (N,))):
        raise ValueError(f"gemm_skinny_rope: x {x.shape}, w {w.shape}, head dim {D}, Hq {n_heads}, Hkv "
                         f"{n_kv_heads} in {kernels.dtype} (16-bit types, 1 <= M <= {MAX_ROWS}, w [(Hq + 2 Hkv) D, "
                         f"K], K % {K_CHUNK} == 0, D % 16 == 0)")
    key = (M, N, K, "rope", D, split and (1, *split))
    plan = kernels._gemm_plans.get(key)
    if plan is None:
        plan = kernels._gemm_plans[key] = _plan(kernels, M, N, K, False, kernels.ctype, split and (1, *split), D)
    fn, grid, block, ws, counters, (m, _, k), smem = plan
    kernels._go(fn, grid, block, (x, w, ws, counters, m, k, bias, cos, sin, positions, slot_mapping,
                                  np.int32(n_heads), np.int32(n_kv_heads), np.int32(D), np.int32(cos.shape[0]),
                                  np.int32(num_slots), q_out, k_cache, v_cache), smem)


def gemm_skinny_norm(kernels, x, w, residual, norm_w, x_out, parts, split=None):
    """The o projection y = x[M, K] @ w.T with add_rmsnorm's add and the norm weight as its epilogue: residual +=
    y (rounded as add_rmsnorm does), x_out = residual * norm_w, parts[N / 16, M] = the row's sums of squares a tile
    of 16 columns (see CudaKernels.gemm_skinny_norm). split: (WK, S) instead of the plan's."""
    M, K = x.shape
    N = w.shape[0]
    if (kernels.itemsize != 2 or not 1 <= M <= MAX_ROWS or w.shape[1] != K or K % K_CHUNK or N % 16
            or residual.shape != (M, N) or x_out.shape != (M, N) or norm_w.shape != (N,)
            or parts.dtype != F32 or parts.size < N // 16 * M):
        raise ValueError(f"gemm_skinny_norm: x {x.shape}, w {w.shape}, residual {residual.shape}, norm weight "
                         f"{norm_w.shape}, out {x_out.shape}, parts {parts.shape} {parts.dtype} in {kernels.dtype} "
                         f"(16-bit types, 1 <= M <= {MAX_ROWS}, K % {K_CHUNK} == 0, N % 16 == 0, float32 parts of "
                         f"N / 16 * M)")
    key = (M, N, K, "norm", split and (1, *split))
    plan = kernels._gemm_plans.get(key)
    if plan is None:
        plan = kernels._gemm_plans[key] = _plan(kernels, M, N, K, False, kernels.ctype, split and (1, *split),
                                                norm=True)
    fn, grid, block, ws, counters, ints, smem = plan
    kernels._go(fn, grid, block, (x, w, ws, counters, *ints, residual, norm_w, x_out, parts), smem)


def _plan(kernels, M, N, K, swiglu, to, split, rope_d=0, norm=False):
    """The launch: kernel, grid (tiles, slices), block, split-K workspace and counters, int arguments, shared
    memory. rope_d: gemm_skinny_rope's, for heads of rope_d dims; norm: gemm_skinny_norm's (one m-tile)."""
    MT, NT, WK, S = skinny_plan(M, N, K, kernels.num_sms, swiglu, rope=bool(rope_d) or norm)
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
    name = (f"gemm_skinny_rope<{kernels.ctype}, {NT}>" if rope_d else f"gemm_skinny_norm<{kernels.ctype}, {NT}>"
            if norm else f"gemm_skinny<{kernels.ctype}, {to}, {MT}, {NT}, {'true' if swiglu else 'false'}>")
    fn = kernels._fn("gemm_skinny", name, smem)
    cp = kernels.cp
    ws = cp.empty(S * tiles * F * 32 if S > 1 else 1, cp.float32)  # each slice's fp32 tiles
    counters = cp.zeros(tiles if S > 1 else 1, cp.uint32)  # the kernel leaves them zero
    return fn, (tiles, S), (32 * WK,), ws, counters, tuple(np.int32(v) for v in (M, N, K)), smem


STREAM_CW = 8            # consumer warps a block in gemm_stream.cu (and one producer warp)
STREAM_MAX_STAGES = 8
STREAM_CHAIN = 64        # most k-steps a tile (one warp's chain of mma) before K is sliced
STREAM_SLICE_COST = 0.03  # each slice of K, as a fraction of the weight bytes (partials written, then added)


def stream_ld(ksl: int) -> int:
    """gemm_stream's shared-memory row (elements) for a slice of ksl columns: ksl / 8 16-byte units, padded to
    an odd number (the rows of an ldmatrix matrix in different bank quads)."""
    return ksl + (0 if (ksl // 8) % 2 else 8)


def stream_smem(NT: int, K: int, S: int, NS: int, most: int, itemsize: int = 2) -> int:
    """gemm_stream's dynamic shared memory: NS stages of 16 rows, 8 max(NT, 2) rows of x, 2 mbarriers for each
    of the busiest block's `most` tiles."""
    LD = stream_ld(K // S)
    return (NS * 16 + 8 * max(NT, 2)) * LD * itemsize + 16 * most


@functools.lru_cache(maxsize=256)  # asked for every projection of an eager step (CudaBackend._stream_ok)
def stream_plan(M: int, N: int, K: int, n_sm: int, smem: int, itemsize: int = 2, swiglu: bool = False,
                split: int = None) -> tuple:
    """(NT, S, B, NS) for gemm_stream: NT 8-row n-tiles, S slices of K, B blocks a slice (S * B <= n_sm), NS
    stages. Tiles are 16 weight rows (swiglu: 8 gate + 8 up); block b of a slice owns tiles [b T / B,
    (b + 1) T / B), so the busiest block streams ceil(T / B) tiles of K / S columns; a tile is one warp's chain
    of K / 16 S mma k-steps, at most STREAM_CHAIN. The plan whose busiest block streams the least, each slice
    counted STREAM_SLICE_COST dearer (measured on the H200, bench_gemm_skinny.py --stream-sweep, in
    benchmarks/results/gemm_stream_dev.log: gate_up at Qwen2.5-0.5B 10.9 us unsliced against 13.4 in 2 slices at
    32 rows; down 8.9 us in 8 slices against 10.3 in 4 and 11.9 in 16); `split` forces S. None where nothing fits
    (fewer than 2 stages in `smem` bytes)."""
    NT = next((t for t in N_TILES if 8 * t >= M), None)
    tiles, nks = (N // 8 if swiglu else N // 16), K // 16
    if NT is None or N % (8 if swiglu else 16) or K % 16:
        return None
    best = None
    for S in (s for s in range(1, min(nks, n_sm) + 1)
              if nks % s == 0 and (split == s or split is None and nks // s <= STREAM_CHAIN)):
        B = min(n_sm // S, tiles)
        per = -(-tiles // B)
        fixed = stream_smem(NT, K, S, 0, per, itemsize) + 1024
        NS = min(STREAM_MAX_STAGES, per, (smem - fixed) // (16 * stream_ld(K // S) * itemsize))
        if NS < 2 and per > 1 or NS < 1:
            continue
        cost = per * (K // S) * (1.0 + STREAM_SLICE_COST * S)
        if best is None or cost < best[0]:
            best = (cost, (NT, S, B, NS))
    return best and best[1]


def stream_kernel_names(ctype: str) -> list:
    """gemm_stream's instantiations for one element type (none for fp32)."""
    if ctype == "float":
        return []
    return [f"gemm_stream<{ctype}, {nt}, {sw}>" for nt in N_TILES for sw in ("false", "true")]


def gemm_stream(kernels, x, w, out, swiglu: bool = False, split: int = None):
    """out[M, N] = x[M, K] @ w[N, K].T, or with swiglu (w = gate_up [2I, K], out [M, I]) silu(gate) * up, for
    1 <= M <= 32 rows, 16-bit types, on Hopper or later (see CudaKernels.gemm_stream). split: S slices of K
    instead of the plan's (benchmarks and tests)."""
    kernels._check("gemm_stream", kernels.storage, x, w, out)
    M, K = x.shape
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    key = ("stream", M, N, K, swiglu, split)
    plan = kernels._gemm_plans.get(key)
    if plan is None:
        sp = None
        if kernels.itemsize == 2 and kernels.cc >= 90 and w.shape[1] == K and out.shape == (M, N) and \
                (not swiglu or w.shape[0] == 2 * N):
            sp = stream_plan(M, N, K, kernels.num_sms, kernels.smem_optin, kernels.itemsize, swiglu, split)
        if sp is None:
            raise ValueError(f"gemm_stream{' (swiglu)' if swiglu else ''}: x {x.shape}, w {w.shape}, out "
                             f"{out.shape} in {kernels.dtype} (16-bit types, Hopper+, 1 <= M <= {MAX_ROWS}, N % 16 "
                             f"== 0, K % 16 == 0, a split of K that fits: stream_plan)")
        NT, S, B, NS = sp
        tiles = N // 8 if swiglu else N // 16
        smem = stream_smem(NT, K, S, NS, -(-tiles // B), kernels.itemsize)
        fn = kernels._fn("gemm_stream", f"gemm_stream<{kernels.ctype}, {NT}, {'true' if swiglu else 'false'}>", smem)
        cp = kernels.cp
        ws = cp.empty(S * tiles * NT * 128 if S > 1 else 1, cp.float32)
        counters = cp.zeros(tiles if S > 1 else 1, cp.uint32)  # the kernel leaves them zero
        ints = tuple(np.int32(v) for v in (M, N, K, S, NS))
        plan = kernels._gemm_plans[key] = (fn, (S * B,), (32 * (STREAM_CW + 1),), ws, counters, ints, smem)
    fn, grid, block, ws, counters, ints, smem = plan
    kernels._go(fn, grid, block, (x, w, out, ws, counters, *ints), smem)
