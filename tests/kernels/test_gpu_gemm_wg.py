"""gemm_wg.cu (a decode step's gate_up with SwiGLU in its epilogue, on wgmma with TMA loads) on an sm_90 GPU against
its CPU twin: the four bench shapes' MLPs at decode row counts (1-128: each NB instantiation), last column tiles that
are partial and a K past the last whole stage (TMA's zero fill; rows and columns past the output must not be
stored), more tiles than fit one wave, fp16, repeat launches bit-identical, against cuBLAS + silu_mul, the rows of a
view, and the shapes it refuses."""
import numpy as np
import pytest

from kernels.gemm_wg import gemm_wg_swiglu

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402
from tests.kernels.test_gpu_kernels import K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu

SENTINEL = 7.0


@pytest.fixture(scope="module", autouse=True)
def hopper():
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("gemm_wg_swiglu needs an sm_90 (Hopper) GPU")


def case(M, I, Kin, dtype, seed=0):
    rng = np.random.default_rng(seed + 7 * M + I + Kin)
    x = rounded(rng.standard_normal((M, Kin)), dtype)
    w = rounded(rng.standard_normal((2 * I, Kin)) * Kin ** -0.5, dtype)
    ref = np.empty((M, I), np.float32)
    gemm_wg_swiglu(x, w, ref)
    return x, w, ref


# (M, I, K): the bench shapes' MLPs (the 0.5B, Qwen3, Llama, the 1.5B: 152-280 tiles of 32 columns, the 1.5B's
# past one wave of two blocks an SM) at rows of each NB instantiation (8, 16, 32, 64, 128), partly or wholly
# filled; the tiny test model's (I = 688: a partial last column tile, whose gate rows run into up's); a K of no
# whole 64-wide stage past the first three, and a K of one stage.
CASES = [(33, 4864, 896), (64, 3072, 1024), (128, 8192, 2048), (100, 8960, 1536), (1, 4864, 896), (8, 4864, 896),
         (13, 4864, 896), (32, 8192, 2048), (5, 688, 256), (16, 344, 200), (77, 128, 64)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M, I, Kin", CASES)
def test_gemm_wg_swiglu(dtype, M, I, Kin):
    x, w, ref = case(M, I, Kin, dtype)
    k = K(dtype)
    xd, wd = dev(x, dtype), dev(w, dtype)
    out = dev(np.full((M + 3, I), SENTINEL), dtype)  # rows past M: the kernel must not store its zero-filled rows
    k.gemm_wg_swiglu(xd, wd, out[:M])
    got = host(out, dtype)
    assert (got[M:] == SENTINEL).all(), "stored rows past M"
    check(f"gemm_wg_swiglu M={M} I={I} K={Kin}", got[:M], ref, dtype)
    again = dev(np.zeros((M, I)), dtype)
    k.gemm_wg_swiglu(xd, wd, again)
    assert (host(again, dtype) == got[:M]).all(), "two launches differ"
    # (A store past column I of row r would land in row r + 1's first columns, or in the sentinel rows after the
    # last row: both checked above.)


def test_matches_gemm_then_silu_mul_closely():
    """Against the two kernels it replaces (cuBLAS gate_up, silu_mul), which sum K in another order: the same
    roundings after the sum, so nearly every element is equal or one bf16 step apart."""
    from toolkit.backends.cuda import CudaBackend

    M, I, Kin = 32, 4864, 896
    x, w, ref = case(M, I, Kin, "bfloat16", seed=3)
    be = CudaBackend("bfloat16")
    xd, wd = be.from_host(x), be.from_host(w)
    gu, a, b = be.empty((M, 2 * I)), be.empty((M, I)), be.empty((M, I))
    be.linear(xd, wd, gu)
    be.silu_mul(gu, a)
    be.kernels.gemm_wg_swiglu(xd, wd, b)
    ga, gb = be.to_host(a), be.to_host(b)
    check("gemm_wg_swiglu vs cuBLAS + silu_mul", gb, ga, "bfloat16")
    steps = np.abs(ga - gb) / np.maximum(np.abs(ga), 1e-6) / 2.0 ** -7
    assert np.mean(steps > 2) < 1e-3, f"{np.mean(steps > 2):.2e} of the elements more than 2 bf16 steps apart"


def test_rows_of_a_view():
    """The engine passes the first rows of its scratch buffers: a view whose rows are the step's."""
    M, I, Kin = 100, 256, 128  # (the NaN rows past M lie inside the swapped kernel's 128-row box: not read)
    x, w, ref = case(M, I, Kin, "bfloat16", seed=4)
    k = K("bfloat16")
    big = dev(np.concatenate([x, np.full((200, Kin), np.nan, np.float32)]), "bfloat16")
    out = dev(np.zeros((M, I)), "bfloat16")
    k.gemm_wg_swiglu(big[:M], dev(w, "bfloat16"), out)
    check("gemm_wg_swiglu on a view", host(out, "bfloat16"), ref, "bfloat16")


@pytest.mark.parametrize("M, I, Kin, why", [(64, 100, 128, "I"), (64, 128, 100, "K"), (129, 128, 128, "M")])
def test_refuses_shapes_it_does_not_take(M, I, Kin, why):
    """I and K of whole 16-byte rows; up to 128 rows."""
    k = K("bfloat16")
    x, w = cp.zeros((M, Kin), cp.uint16), cp.zeros((2 * I, Kin), cp.uint16)
    with pytest.raises(ValueError, match="gemm_wg_swiglu"):
        k.gemm_wg_swiglu(x, w, cp.zeros((M, I), cp.uint16))


def test_refuses_fp32():
    k = K("float32")
    with pytest.raises(ValueError, match="gemm_wg_swiglu"):
        k.gemm_wg_swiglu(cp.zeros((64, 128), cp.float32), cp.zeros((256, 128), cp.float32),
                         cp.zeros((64, 128), cp.float32))
