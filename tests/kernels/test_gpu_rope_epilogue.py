"""The qkv projection with rope_qkv as its epilogue on the GPU: gemm_skinny_rope (gemm_skinny.cu, 2-32 rows) and
gemv_rope (gemv.cu, 1-4 rows). Each gives the very bits of its projection followed by rope_qkv (q, and the K/V
written into the caches, untouched slots left alone) at the Qwen2.5-0.5B, -1.5B and -7B qkv shapes, with and without
the bias, padding rows and a position outside the table; against its CPU twin; gemm_skinny_rope's split-K and
repeat launches; gemv_rope where its rows get fewer warps than gemv's (K = 4,096); the backend's ops against
cuBLAS + rope_qkv."""
import numpy as np
import pytest

from kernels.gemm_skinny import gemm_skinny_rope as twin

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402
from tests.kernels.test_gpu_kernels import K, check, host, ints, rope_tables  # noqa: E402

pytestmark = pytest.mark.gpu

# (Hq, Hkv, D, K): Qwen2.5-0.5B, -1.5B, -7B; the tiny shape; a head dim of 80.
SHAPES = [(14, 2, 64, 896), (12, 2, 128, 1536), (28, 4, 128, 3584), (4, 2, 64, 256), (4, 1, 80, 320)]
SLOTS = 200


def case(M, hq, hkv, D, Kin, dtype, bias, seed=0):
    """Inputs and the caches (NaN-filled, so an unwritten slot stays NaN) for M decode rows: row 1 a padding row
    (slot -1), the last row (M > 3) at a position outside the table; the others at distinct slots."""
    rng = np.random.default_rng(seed + M + D + Kin)
    N = (hq + 2 * hkv) * D
    x = rounded(rng.standard_normal((M, Kin)), dtype)
    w = rounded(0.05 * rng.standard_normal((N, Kin)), dtype)
    b = rounded(0.5 * rng.standard_normal(N), dtype) if bias else None
    cos, sin = rope_tables(64, D)
    positions = rng.integers(0, 64, M).astype(np.int32)
    slots = rng.permutation(SLOTS)[:M].astype(np.int32)
    if M > 1:
        slots[1] = -1
    if M > 3:
        positions[-1] = 64
    return x, w, b, cos, sin, positions, slots


# The projection kernel -> (its RoPE form, the rows to test).
KERNELS = {"gemm_skinny": ("gemm_skinny_rope", [2, 5, 8, 17, 32]), "gemv": ("gemv_rope", [1, 2, 3, 4])}


def run(fused, M, hq, hkv, D, x, w, b, cos, sin, positions, slots, dtype, split=None, kernel="gemm_skinny"):
    k = K(dtype)
    q = dev(np.full((M, hq, D), 7.0), dtype)
    kc, vc = dev(np.full((SLOTS, hkv, D), np.nan), dtype), dev(np.full((SLOTS, hkv, D), np.nan), dtype)
    xd, wd, bd = dev(x, dtype), dev(w, dtype), None if b is None else dev(b, dtype)
    rope = (bd, cp.asarray(cos), cp.asarray(sin), ints(positions), ints(slots))
    if fused:
        extra = {"split": split} if kernel == "gemm_skinny" else {}
        getattr(k, KERNELS[kernel][0])(xd, wd, *rope, hq, hkv, q, kc, vc, **extra)
    else:
        qkv = dev(np.zeros((M, w.shape[0])), dtype)
        getattr(k, kernel)(xd, wd, qkv)
        k.rope_qkv(qkv, bd, None, None, 1e-6, *rope[1:], hq, hkv, q, kc, vc)
    return [host(a, dtype) for a in (q, kc, vc)]


def reference(x, w, b, cos, sin, positions, slots, hq, hkv, D):
    """The CPU twin on the rows whose position is in the table (the twin refuses the others): (those rows, their
    q, the caches NaN but where written)."""
    rows = positions < cos.shape[0]
    q = np.zeros((int(rows.sum()), hq, D), np.float32)
    kc = np.full((SLOTS, hkv, D), np.nan, np.float32)
    vc = kc.copy()
    twin(x[rows], w, b, cos, sin, positions[rows], slots[rows], hq, hkv, q, kc, vc)
    return rows, q, kc, vc


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel, M", [(k, m) for k, (_, rows) in KERNELS.items() for m in rows])
@pytest.mark.parametrize("hq, hkv, D, Kin", SHAPES)
def test_equals_the_projection_then_rope_qkv(dtype, bias, kernel, M, hq, hkv, D, Kin):
    args = case(M, hq, hkv, D, Kin, dtype, bias)
    got = run(True, M, hq, hkv, D, *args, dtype, kernel=kernel)
    want = run(False, M, hq, hkv, D, *args, dtype, kernel=kernel)
    for name, g, w_ in zip(("q", "k_cache", "v_cache"), got, want):
        np.testing.assert_array_equal(g, w_, err_msg=name)  # NaN == NaN: the untouched slots
    check_against_twin(KERNELS[kernel][0], got, *args, hq, hkv, D, dtype)


def check_against_twin(name, got, x, w, b, cos, sin, positions, slots, hq, hkv, D, dtype):
    """The written values against the CPU twin (fp32 projection and rotation: 16-bit rounding apart), and the
    skips: a position outside the table writes no K/V, every other real row's slot is written."""
    ok = (slots >= 0) & (positions < 64)
    assert np.isnan(got[1][slots[~ok & (slots >= 0)]]).all(), "a position outside the table writes no K/V"
    assert not np.isnan(got[1][slots[ok]]).any() and not np.isnan(got[2][slots[ok]]).any()
    rows, q, kc, vc = reference(x, w, b, cos, sin, positions, slots, hq, hkv, D)
    M = len(x)
    check(f"{name} q M={M} D={D}", got[0][rows], q, dtype)
    check(f"{name} k M={M} D={D}", got[1][slots[ok]], kc[slots[ok]], dtype)
    check(f"{name} v M={M} D={D}", got[2][slots[ok]], vc[slots[ok]], dtype)


@pytest.mark.parametrize("M", [1, 4])
def test_gemv_rope_with_fewer_warps_a_row_than_gemv(M):
    """At K = 4,096 (Llama-3.1-8B's qkv: 32 + 2 x 8 heads of 128) gemv gives a row 8 warps and gemv_rope 4 (a RoPE
    pair's two rows share a block): other sums, the same values within bf16 rounding, and the skips."""
    hq, hkv, D, Kin = 32, 8, 128, 4096
    args = case(M, hq, hkv, D, Kin, "bfloat16", False, seed=5)
    got = run(True, M, hq, hkv, D, *args, "bfloat16", kernel="gemv")
    want = run(False, M, hq, hkv, D, *args, "bfloat16", kernel="gemv")
    written = args[-1][(args[-1] >= 0) & (args[-2] < 64)]  # the slots of real rows in the table
    for name, g, w_ in zip(("q", "k_cache", "v_cache"), got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w_), err_msg=name)  # the same slots written
        check(f"gemv_rope vs gemv + rope_qkv: {name}", g if name == "q" else g[written],
              w_ if name == "q" else w_[written], "bfloat16")
    check_against_twin("gemv_rope", got, *args, hq, hkv, D, "bfloat16")


@pytest.mark.parametrize("split", [(8, 4), (16, 2), (4, 1)])
def test_split_k_and_repeat_launches(split):
    """K cut into slices (the last block of a tile adds them and runs the epilogue), and repeat launches give the
    same bits (its counters are left at zero)."""
    hq, hkv, D, Kin, M = 12, 2, 128, 1536, 32
    args = case(M, hq, hkv, D, Kin, "bfloat16", True, seed=9)
    first = run(True, M, hq, hkv, D, *args, "bfloat16", split=split)
    x, w, b, cos, sin, positions, slots = args
    _, _, kc, _ = reference(*args, hq, hkv, D)
    ok = (slots >= 0) & (positions < 64)
    check(f"gemm_skinny_rope split={split}", first[1][slots[ok]], kc[slots[ok]], "bfloat16")
    for _ in range(2):
        again = run(True, M, hq, hkv, D, *args, "bfloat16", split=split)
        for a, b_ in zip(again, first):
            np.testing.assert_array_equal(a, b_)


@pytest.mark.parametrize("op, M, most", [("gemm_skinny_rope", 8, 32), ("gemv_rope", 1, 4)])
def test_backend_op_agrees_with_linear_then_rope(op, M, most):
    """CudaBackend's op (the step plan's qkv "skinny_rope" or "gemv_rope") against linear (cuBLAS) then rope_qkv
    (its "blas" qkv): the same q and K/V within bf16 rounding (only the projection's order of sums differs); a row
    past the kernel's most is refused."""
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    hq, hkv, D, Kin = 14, 2, 64, 896
    x, w, b, cos, sin, positions, slots = case(M, hq, hkv, D, Kin, "bfloat16", True, seed=2)
    xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
    rope = (dev(b, "bfloat16"), cp.asarray(cos), cp.asarray(sin), ints(positions), ints(slots))
    outs = []
    for fused in (True, False):
        q = dev(np.zeros((M, hq, D)), "bfloat16")
        kc, vc = dev(np.zeros((SLOTS, hkv, D)), "bfloat16"), dev(np.zeros((SLOTS, hkv, D)), "bfloat16")
        if fused:
            getattr(be, op)(xd, wd, *rope, hq, hkv, q, kc, vc)
        else:
            qkv = dev(np.zeros((M, w.shape[0])), "bfloat16")
            be.linear(xd, wd, qkv)
            be.rope_qkv(qkv, rope[0], None, None, 1e-6, *rope[1:], hq, hkv, q, kc, vc)
        be.synchronize()
        outs.append([host(a, "bfloat16") for a in (q, kc, vc)])
    for name, ours, theirs in zip(("q", "k_cache", "v_cache"), *outs):
        check(f"{op} vs linear + rope_qkv: {name}", ours, theirs, "bfloat16")
    n = most + 1
    with pytest.raises(ValueError, match=op):
        getattr(be, op)(dev(np.zeros((n, Kin)), "bfloat16"), wd, *rope[:3], ints(np.zeros(n)), ints(np.arange(n)),
                        hq, hkv, dev(np.zeros((n, hq, D)), "bfloat16"), kc, vc)
