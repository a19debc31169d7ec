"""gemm_small.cu (tensor-core projections at 2-32 rows) on the GPU against its CPU twin, at the Qwen2.5 decode
shapes, with odd row counts, N not a multiple of 64, and every split of K, and through the backend's linear."""
import numpy as np
import pytest

from kernels.gemm_small import gemm_small

cp = pytest.importorskip("cupy")
from gpu_arrays import dev, rounded  # noqa: E402
from test_gpu_kernels import VOCAB, K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (3072, 1536), (40, 64), (1000, 128)]


def case(M, N, Kin, dtype, seed=0):
    rng = np.random.default_rng(seed + M * N + Kin)
    x = rounded(rng.standard_normal((M, Kin)), dtype)
    w = rounded(0.05 * rng.standard_normal((N, Kin)), dtype)
    ref = np.empty((M, N), np.float32)
    if M <= 32:
        gemm_small(x, w, ref)
    else:  # past the kernel: the backend's reference for cuBLAS
        np.matmul(x, w.T, out=ref)
    return x, w, ref


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [1, 2, 3, 8, 16, 17, 31, 32])
@pytest.mark.parametrize("N, Kin", SHAPES)
def test_gemm_small(dtype, M, N, Kin):
    x, w, ref = case(M, N, Kin, dtype)
    k = K(dtype)
    xd, wd = dev(x, dtype), dev(w, dtype)
    out = dev(np.full((M, N), 7.0), dtype)
    k.gemm_small(xd, wd, out)
    check(f"gemm_small M={M} N={N} K={Kin}", host(out, dtype), ref, dtype)
    # fp32 out: only the order of the fp32 sums differs from the twin.
    out32 = cp.full((M, N), 7.0, cp.float32)
    k.gemm_small(xd, wd, out32)
    check(f"gemm_small M={M} N={N} K={Kin} -> fp32", cp.asnumpy(out32), ref, "float32")


@pytest.mark.parametrize("M", [4, 32])
def test_every_split_of_k(M):
    """Split-k with 1..76 slices (the down projection's 76 chunks): each right, and each deterministic over
    repeated launches (the last block of a column resets its counter, and adds the slices in order)."""
    N, Kin = 896, 4864
    x, w, ref = case(M, N, Kin, "bfloat16", seed=1)
    k = K("bfloat16")
    xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
    for slices in (1, 2, 3, 5, 10, 19, 38, 76):
        out = cp.full((M, N), 7.0, cp.float32)
        k.gemm_small(xd, wd, out, slices)
        first = cp.asnumpy(out)
        check(f"gemm_small slices={slices}", first, ref, "float32")
        for _ in range(3):
            k.gemm_small(xd, wd, out, slices)
            np.testing.assert_array_equal(cp.asnumpy(out), first)


def test_lm_head_rows():
    M, (N, Kin) = 32, (VOCAB, 896)
    x, w, ref = case(M, N, Kin, "bfloat16", seed=2)
    out = dev(np.zeros((M, N)), "bfloat16")
    K("bfloat16").gemm_small(dev(x, "bfloat16"), dev(w, "bfloat16"), out)
    check("gemm_small lm_head", host(out, "bfloat16"), ref, "bfloat16")


def test_backend_linear_picks_it_and_agrees_with_cublas():
    """CudaBackend.linear with small_batch_gemv sends 2-32 rows here; cuBLAS (small_batch_gemv off) gives the same
    product within bf16 rounding; 33 rows go to cuBLAS."""
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    for M in (2, 32, 33):
        x, w, ref = case(M, 1152, 896, "bfloat16", seed=3)
        xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
        ours, theirs = dev(np.zeros((M, 1152)), "bfloat16"), dev(np.zeros((M, 1152)), "bfloat16")
        be.linear(xd, wd, ours, small_batch_gemv=True)
        be.linear(xd, wd, theirs, small_batch_gemv=False)
        check(f"linear M={M} (ours)", host(ours, "bfloat16"), ref, "bfloat16")
        check(f"linear M={M} (cuBLAS)", host(theirs, "bfloat16"), ref, "bfloat16")
    assert any(key[0] == 32 for key in be.kernels._gemm_plans) and not any(
        key[0] == 33 for key in be.kernels._gemm_plans), "gemm_small should serve 32 rows and not 33"
