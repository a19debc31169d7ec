"""dev/rope.py's variant rope_qkv_runs (dev/rope_runs.cu): its work split (rope_layout) and an NVRTC compile of
every instantiation it can ask for, so the GPU session that times it does not spend its call on a compile error or
a layout that faults. The kernel trusts the layout: a run wider than a pointer's alignment would fault, a lane with
more runs than its registers (KR) would leave pairs unwritten, and lanes that are not a power of two would mix items
in the norm's shuffles. No GPU; the compile skips where NVRTC is absent."""
from hypothesis import given, strategies as st

from tests.dev import load_dev_script
from tests.dev.test_prefill_attention_dev import nvrtc_compile

CTYPE = {2: "__nv_bfloat16", 4: "float"}
mod = load_dev_script("rope")


def pairs_covered(D: int, v: int, lanes: int, kr: int) -> list:
    """The pair indices the kernel's lanes of one item visit: i = (gl + lanes k) V + e for k < KR, i < D/2."""
    return sorted((gl + lanes * k) * v + e for gl in range(lanes) for k in range(kr) for e in range(v)
                  if (gl + lanes * k) * v < D // 2)


@given(half=st.integers(1, 128), itemsize=st.sampled_from([2, 4]),
       offsets=st.lists(st.integers(0, 7).map(lambda o: 2 * o), min_size=1, max_size=7),
       table_offset=st.sampled_from([0, 4, 8, 16]))
def test_every_pair_once_and_every_access_aligned(half, itemsize, offsets, table_offset):
    D = 2 * half
    ptrs = [(1 << 20) + o * (itemsize // 2) for o in offsets]  # element-aligned starts, as views give
    v, lanes, kr = mod.rope_layout(D, itemsize, ptrs, (1 << 20, (1 << 20) + table_offset))
    assert f"rope_qkv_runs<{CTYPE[itemsize]}, {v}, {kr}>" in mod.run_names(CTYPE[itemsize])
    assert v * itemsize <= 16 and half % v == 0 and all(p % (v * itemsize) == 0 for p in ptrs)
    assert v % 4 or table_offset % 16 == 0  # float4 reads of the tables
    assert 1 <= lanes <= 32 and lanes & (lanes - 1) == 0
    assert pairs_covered(D, v, lanes, kr) == list(range(half)), "each pair exactly once, none past the registers"


def test_the_bench_shapes_get_16_byte_runs():
    base = [1 << 20]
    assert mod.rope_layout(64, 2, base, base) == (8, 4, 1)     # 0.5B, Llama: 8 items a warp, one run a lane
    assert mod.rope_layout(128, 2, base, base) == (8, 8, 1)    # Qwen3, 1.5B: 4 items a warp
    assert mod.rope_layout(8, 2, base, base) == (4, 1, 1)      # stories260K's head dim
    assert mod.rope_layout(96, 2, base, base) == (8, 4, 2)     # 6 runs over 4 lanes
    assert mod.rope_layout(64, 2, [(1 << 20) + 2], base) == (1, 32, 1)  # a view 2 bytes off: scalar, one item a warp
    assert mod.rope_layout(64, 4, base, [(1 << 20) + 4]) == (2, 16, 1)  # fp32, tables off 16 bytes: no float4
    assert mod.rope_layout(256, 2, [(1 << 20) + 2], base) == (1, 32, 4)


def test_every_instantiation_compiles():
    import toolkit.backends.cuda_kernels as ck

    for ctype in ("float", "__half", "__nv_bfloat16"):
        lowered = nvrtc_compile(mod.variant_source(), mod.run_names(ctype), ck.OPTIONS)
        assert len(lowered) == len(mod.run_names(ctype))
