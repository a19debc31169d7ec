"""gemm_stream.cu's work split and shared-memory layout in NumPy (no GPU): the blocks of a slice own every tile
once, a tile's rows cover the weight matrix once (with SwiGLU, gate row j and up row I + j as the mma tile's rows
g and g + 8, so one lane holds both), the plan fits the SMs and the shared memory, and stage rows are an odd
number of 16-byte units (the rows of an ldmatrix matrix in different bank quads). (The twin against NumPy:
tests/test_cpu_kernels.py::test_projection_*.)"""
import pytest
from hypothesis import given, settings, strategies as st

from kernels.gemm_stream import block_tiles, tile_rows
from toolkit.backends.cuda_gemm import stream_ld, stream_plan, stream_smem

H200_SMS, H200_SMEM = 132, 232448


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 600), st.integers(1, 132))
def test_blocks_own_every_tile_once(tiles, blocks):
    blocks = min(blocks, tiles)
    owned = [t for b in range(blocks) for t in block_tiles(b, tiles, blocks)]
    assert owned == list(range(tiles))
    sizes = [len(block_tiles(b, tiles, blocks)) for b in range(blocks)]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == -(-tiles // blocks)  # the kernel's `most`


@pytest.mark.parametrize("n, swiglu", [(64, False), (96, True), (4864, True), (896, False)])
def test_tiles_cover_the_weight_rows_once(n, swiglu):
    tiles = n // 8 if swiglu else n // 16
    rows = [r for t in range(tiles) for r in tile_rows(t, n, swiglu)]
    assert sorted(rows) == list(range(2 * n if swiglu else n))
    if swiglu:  # lane g: gate row 8t + g (mma row g) with up row I + 8t + g (row g + 8): output column 8t + g
        for t in range(tiles):
            r = tile_rows(t, n, swiglu)
            assert all(r[g + 8] == r[g] + n for g in range(8))


# (M, N, K, swiglu): Qwen2.5-0.5B and -1.5B gate_up and down at 2-32 rows, the tiny shape's, the lm_head.
SHAPES = [(M, N, K, sw) for M in (2, 8, 9, 32) for N, K, sw in
          ((4864, 896, True), (896, 4864, False), (8960, 1536, True), (1536, 8960, False), (384, 128, True),
           (128, 384, False), (151936, 896, False))]


@pytest.mark.parametrize("M, N, K, swiglu", SHAPES)
def test_plan_fits(M, N, K, swiglu):
    NT, S, B, NS = stream_plan(M, N, K, H200_SMS, H200_SMEM, 2, swiglu)
    tiles = N // 8 if swiglu else N // 16
    assert 8 * NT >= M and S * B <= H200_SMS and B <= tiles and (K // S) % 16 == 0
    most = -(-tiles // B)
    assert 1 <= NS <= most and stream_smem(NT, K, S, NS, most) + 1024 <= H200_SMEM
    assert (stream_ld(K // S) // 8) % 2 == 1


def test_plan_at_qwen05b():
    """The plans the README quotes: gate_up streams 5 tiles a block on 132 blocks; down (56 tiles of 4,864
    columns) is cut into slices."""
    assert stream_plan(8, 4864, 896, H200_SMS, H200_SMEM, 2, True) == (1, 1, 132, 5)
    assert stream_plan(32, 896, 4864, H200_SMS, H200_SMEM, 2, False)[1] > 1
    assert stream_plan(33, 896, 896, H200_SMS, H200_SMEM) is None  # past 32 rows
    assert stream_plan(8, 100, 896, H200_SMS, H200_SMEM) is None   # N not a multiple of 16
