"""rope_qkv's work split (rope_layout in toolkit/backends/cuda_kernels.py; the kernel is kernels/rope.cu). The
kernel trusts the layout: a run wider than a pointer's alignment would fault, a lane with more runs than its
registers (KR) would leave pairs unwritten, and lanes that are not a power of two would mix items in the norm's
shuffles. No GPU (the kernel's outputs are tested in tests/kernels/test_gpu_kernels.py)."""
from hypothesis import given, strategies as st

from toolkit.backends.cuda_kernels import rope_layout, rope_names

CTYPE = {2: "__nv_bfloat16", 4: "float"}
BASE = [1 << 20]


def pairs_covered(D: int, v: int, lanes: int, kr: int) -> list:
    """The pair indices the kernel's lanes of one item visit: i = (gl + lanes k) V + e for k < KR, i < D/2."""
    return sorted((gl + lanes * k) * v + e for gl in range(lanes) for k in range(kr) for e in range(v)
                  if (gl + lanes * k) * v < D // 2)


@given(half=st.integers(1, 128), itemsize=st.sampled_from([2, 4]),
       offsets=st.lists(st.integers(0, 7).map(lambda o: 2 * o), min_size=1, max_size=7),
       table_offset=st.sampled_from([0, 4, 8, 16]), items=st.integers(0, 1 << 16), min_warps=st.integers(0, 2048))
def test_every_pair_once_and_every_access_aligned(half, itemsize, offsets, table_offset, items, min_warps):
    D = 2 * half
    ptrs = [(1 << 20) + o * (itemsize // 2) for o in offsets]  # element-aligned starts, as views give
    v, lanes, kr = rope_layout(D, itemsize, ptrs, (1 << 20, (1 << 20) + table_offset), items, min_warps)
    assert f"rope_qkv<{CTYPE[itemsize]}, {v}, {kr}>" in rope_names(CTYPE[itemsize])
    assert v * itemsize <= 16 and half % v == 0 and all(p % (v * itemsize) == 0 for p in ptrs)
    assert v % 4 or table_offset % 16 == 0  # float4 reads of the tables
    assert 1 <= lanes <= 32 and lanes & (lanes - 1) == 0
    assert pairs_covered(D, v, lanes, kr) == list(range(half)), "each pair exactly once, none past the registers"


def test_the_bench_shapes_get_16_byte_runs():
    assert rope_layout(64, 2, BASE, BASE) == (8, 4, 1)     # 0.5B, Llama: 8 items a warp, one run a lane
    assert rope_layout(128, 2, BASE, BASE) == (8, 8, 1)    # Qwen3, 1.5B: 4 items a warp
    assert rope_layout(8, 2, BASE, BASE) == (4, 1, 1)      # stories260K's head dim
    assert rope_layout(96, 2, BASE, BASE) == (8, 4, 2)     # 6 runs over 4 lanes
    assert rope_layout(64, 2, [(1 << 20) + 2], BASE) == (1, 32, 1)  # a view 2 bytes off: scalar, one item a warp
    assert rope_layout(64, 4, BASE, [(1 << 20) + 4]) == (2, 16, 1)  # fp32, tables off 16 bytes: no float4
    assert rope_layout(256, 2, [(1 << 20) + 2], BASE) == (1, 32, 4)


def test_a_small_step_gets_narrower_runs_to_fill_the_warps():
    sms = 132
    # 0.5B (18 items a token): a 4,096-token prefill keeps 16-byte runs; a decode token is one item a warp again.
    assert rope_layout(64, 2, BASE, BASE, 4096 * 18, 4 * sms) == (8, 4, 1)
    assert rope_layout(64, 2, BASE, BASE, 1 * 18, 4 * sms) == (1, 32, 1)
    # In between, the widest run that still gives each SM 4 warps: 2,112 items at 8 lanes is 528 warps.
    assert rope_layout(64, 2, BASE, BASE, 2112, 4 * sms) == (4, 8, 1)
    assert rope_layout(64, 2, BASE, BASE, 2111, 4 * sms) == (2, 16, 1)
    assert rope_layout(128, 2, BASE, BASE, 1, 4 * sms) == (1, 32, 2)  # D 128 at V = 1: two runs a lane
