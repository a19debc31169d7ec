"""gemm_small.cu's fragment mapping, replayed in NumPy (CI): the kernel feeds mma.m16n8k16 straight from 16-byte
global loads, calling physical k-offsets by other logical names; A and B must agree on the names and every offset
must be used exactly once, or the products are silently wrong. Also the twin's checks."""
import numpy as np
import pytest

from kernels.gemm_small import K_CHUNK, gemm_small, lane_k


def mma_from_fragments(x_chunk, w_chunk, step):
    """One m16n8k16 from the registers each lane would hold at k-step `step`, per the PTX fragment layout:
    lane (g, c) holds A rows g and g+8 at logical k 2c, 2c+1 (a0, a1) and 2c+8, 2c+9 (a2, a3), and B column g at
    the same logical k (b0, b1). Rebuild the logical 16x16 A and 16x8 B from those registers and multiply."""
    A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane in range(32):
        g, c = divmod(lane, 4)
        lo, hi = lane_k(c, step)  # physical offsets behind logical (2c, 2c+1) and (2c+8, 2c+9)
        for (k0, k1), phys in (((2 * c, 2 * c + 1), lo), ((2 * c + 8, 2 * c + 9), hi)):
            A[g, [k0, k1]] = x_chunk[g, list(phys)]
            A[g + 8, [k0, k1]] = x_chunk[g + 8, list(phys)]
            B[[k0, k1], g] = w_chunk[g, list(phys)]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "a fragment register was never filled"
    return A @ B


def test_every_offset_once():
    used = sorted(k for c in range(4) for s in range(4) for pair in lane_k(c, s) for k in pair)
    assert used == list(range(K_CHUNK))


@pytest.mark.parametrize("chunks", [1, 3])
def test_fragment_mapping_gives_the_product(chunks):
    rng = np.random.default_rng(chunks)
    x = rng.standard_normal((16, K_CHUNK * chunks))
    w = rng.standard_normal((8, K_CHUNK * chunks))
    acc = np.zeros((16, 8))
    for kc in range(chunks):
        sl = slice(kc * K_CHUNK, (kc + 1) * K_CHUNK)
        for step in range(4):
            acc += mma_from_fragments(x[:, sl], w[:, sl], step)
    np.testing.assert_allclose(acc, x @ w.T, rtol=1e-12, atol=1e-12)


def test_twin_and_its_limits():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((32, 128)).astype(np.float32), rng.standard_normal((40, 128)).astype(np.float32)
    out = np.empty((32, 40), np.float32)
    gemm_small(x, w, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    for bad in [(np.zeros((33, 128), np.float32), w, np.empty((33, 40), np.float32)),   # more than 32 rows
                (np.zeros((2, 96), np.float32), np.zeros((40, 96), np.float32), np.empty((2, 40), np.float32))]:
        with pytest.raises(ValueError, match="gemm_small"):
            gemm_small(*bad)
