"""gemm_skinny.cu's fragment layout in NumPy (no GPU): lane c's 16-byte load of a 32-wide chunk, split over two
mma k-steps as the kernel does, covers every k of the chunk exactly once, on A and B alike, so the product is the
dot product; the launch plan; and gemm_skinny_rope's row and register pairing. (The twins against NumPy:
tests/kernels/test_cpu_kernels.py::test_projection_*, ::test_gemm_skinny_rope_twin.)"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tests.tolerance import U64, sum_bound

from toolkit.backends.cuda_gemm import K_CHUNK, MAX_ROWS, N_TILES, skinny_plan


# -- gemm_skinny.cu's layout, replayed in NumPy ------------------------------------------------------------
def rope_tile_rows(tile: int, h: int, g: int, D: int) -> int:
    """gemm_skinny_rope's weight row for lane row g (0..7) of half h (the mma tile's rows g, g + 8) of a tile:
    tile t of head t // (D/16) holds pairs i = 8 (t % (D/16)) + g, its half 0 being dim i and half 1 dim i + D/2
    (gemm_skinny.cu's weight_row<GS_ROPE>)."""
    tph = D // 16
    return (tile // tph) * D + h * (D // 2) + 8 * (tile % tph) + g


def rope_pair_entries(NT: int) -> list:
    """(entry, partner) of gemm_skinny.cu's Pairs<GS_ROPE, 1, NT>: entry e = f * 32 + lane, f = 4 j + r, holds
    register r of n-tile j in a lane; the epilogue pairs r < 2 (row g: half 0) with r + 2 (row g + 8: half 1)."""
    return [((o >> 6) * 128 + (o & 63), (o >> 6) * 128 + (o & 63) + 64) for o in range(NT * 64)]


def fragment_order() -> np.ndarray:
    """order[s, c, q] = the physical k (0..31) of a chunk that lane c of a row gives mma step s as its q-th
    logical k (q = 0..3: logical 2c, 2c + 1, 2c + 8, 2c + 9): lane c loads elements [8c, 8c + 8), and step s
    takes words 2s (elements 8c + 4s, + 1) and 2s + 1 (elements 8c + 4s + 2, + 3)."""
    s, c, q = np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij")
    return 8 * c + 4 * s + q


def logical_k(s: int, c: int, q: int) -> int:
    """mma.m16n8k16's logical k for lane c's q-th A/B element (mma.cuh: k = 2c, 2c + 1, 2c + 8, 2c + 9)."""
    return 2 * c + (q & 1) + 8 * (q >> 1)


def test_every_k_of_a_chunk_once():
    order = fragment_order()
    assert sorted(order.ravel().tolist()) == list(range(K_CHUNK))
    for s in range(2):  # each mma step gets 16 distinct logical k, 0..15
        ks = sorted(logical_k(s, c, q) for c in range(4) for q in range(4))
        assert ks == list(range(16))


def mma_chunk(w_row, x_row):
    """One weight row . one x row over a chunk, computed the way the lanes feed mma.m16n8k16: per step s, A's
    logical k holds w[order[s, c, q]] and B's the same physical element of x."""
    order = fragment_order()
    total = 0.0
    for s in range(2):
        a, b = np.zeros(16), np.zeros(16)
        for c in range(4):
            for q in range(4):
                a[logical_k(s, c, q)] = w_row[order[s, c, q]]
                b[logical_k(s, c, q)] = x_row[order[s, c, q]]
        total += float(a @ b)
    return total


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fragments_give_the_dot_product(seed):
    rng = np.random.default_rng(seed)
    w, x = rng.standard_normal(K_CHUNK), rng.standard_normal(K_CHUNK)
    # both float64 sums of the same 32 products, in different orders: twice gamma_32 (float64) of sum |w x|
    assert abs(mma_chunk(w, x) - w @ x) <= sum_bound(np.abs(w) @ np.abs(x), K_CHUNK, orders=2, u=U64)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, MAX_ROWS), st.integers(1, 200_000), st.integers(1, 512), st.integers(16, 200), st.booleans())
def test_plan_covers_the_rows(M, N, chunks, n_sm, swiglu):
    """NT n-tiles hold the M rows with fewer than 8 to spare; S slices divide K's chunks and leave every one of
    the WK warps a chunk in each (a warp without one would never reach the item's barrier); WK is 8 or 16 where
    K allows; slices only where the tiles alone do not fill the GPU; SwiGLU always pairs a gate and an up m-tile."""
    MT, NT, WK, S = skinny_plan(M, N, K_CHUNK * chunks, n_sm, swiglu)
    assert NT in N_TILES and 8 * NT >= M and (NT == 1 or 8 * NT // 2 < M or (swiglu and NT == 2))
    assert chunks % S == 0 and chunks // S >= WK >= 1
    assert WK in (8, 16) or WK == chunks or WK == 256 // (MT * NT * 4)
    assert WK * MT * NT * 4 * 128 <= 32 * 1024  # the partial tiles' shared memory: no opt-in needed
    tiles = -(-N // (16 if swiglu else 16 * MT))
    assert S == 1 or tiles < n_sm
    assert MT in (1, 2) and (not swiglu or MT == 2)


@pytest.mark.parametrize("D", [32, 64, 80, 128, 256])
@pytest.mark.parametrize("heads", [3, 18])
def test_rope_tiles_cover_every_row_once_in_pairs(D, heads):
    """gemm_skinny_rope's tiles (16 rows each, heads * D / 16 of them) stream every weight row of the fused qkv
    once, and lane row g of a tile's two halves is a RoPE pair: dims i and i + D/2 of one head."""
    pairs = [(rope_tile_rows(t, 0, g, D), rope_tile_rows(t, 1, g, D)) for t in range(heads * D // 16)
             for g in range(8)]
    assert sorted(r for p in pairs for r in p) == list(range(heads * D))
    assert all(b - a == D // 2 and a % D < D // 2 for a, b in pairs)


@pytest.mark.parametrize("NT", N_TILES)
def test_rope_epilogue_pairs_every_accumulator_once(NT):
    """Its epilogue's (entry, partner) pairs cover a block's NT * 4 accumulators a lane once, each pair in one
    lane and n-tile: register r < 2 (row g, half 0) with r + 2 (row g + 8, half 1)."""
    pairs = rope_pair_entries(NT)
    assert sorted(e for p in pairs for e in p) == list(range(NT * 4 * 32))
    for e, u in pairs:
        f, fu = e >> 5, u >> 5
        assert e & 31 == u & 31 and f >> 2 == fu >> 2 and f & 3 < 2 and fu & 3 == (f & 3) + 2
