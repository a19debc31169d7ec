"""The sampler launcher's host side (toolkit/backends/cuda_sampler.py) without a GPU: the constants it shares with
kernels/sampler.cu, and gumbel_sample's grid (one wave, every block with chunks to read)."""
import re

import pytest

from toolkit.backends import cuda_sampler as cs
from toolkit.backends.cuda_kernels import KERNEL_DIR

SRC = (KERNEL_DIR / "sampler.cu").read_text()


@pytest.mark.parametrize("name", ["GS_THREADS", "GS_BLOCKS", "ROW_CHUNK", "SEL_THREADS", "FILTER_THREADS"])
def test_constants_match_the_kernels(name):
    """A launcher that sizes a grid from a stale copy of a kernel's constant launches the wrong grid (a block
    count the registers cannot hold is a second wave; a thread count the kernel was not built for, garbage)."""
    m = re.search(rf"constexpr int {name} = (\d+);", SRC)
    assert m, f"{name} is no longer a constant of sampler.cu"
    assert getattr(cs, name) == int(m.group(1))


@pytest.mark.parametrize("sms", [132, 78, 16])
@pytest.mark.parametrize("R", [1, 2, 32, 128, 396, 4096])
@pytest.mark.parametrize("V", [1, 17, 2048, 4099, 151936, 262144])
def test_gumbel_grid_is_one_wave_and_every_block_reads(sms, R, V):
    s = cs.gumbel_splits(sms, R, V)
    assert s >= 1
    if s > 1:
        assert R * s <= sms * cs.GS_BLOCKS  # every block resident at once: no second wave
        assert -(-V // 16) // s >= 128  # each block has at least 128 chunks


def test_gumbel_grid_at_the_benchmark_shapes():
    V = 151936
    assert [cs.gumbel_splits(132, R, V) for R in (1, 32, 128)] == [74, 12, 3]
