"""gemm_skinny.cu (tensor-core projections at 2-32 rows) on the GPU against its CPU twin: the Qwen2.5 decode
shapes, odd row counts, N not a multiple of the tile's rows, K of one chunk, (MT, WK, S) splits with and
without split-K, the SwiGLU epilogue (gemm_skinny_swiglu), fp32 logits out, repeat launches bit-identical, and
the backend's ops agreeing with cuBLAS."""
import numpy as np
import pytest

from kernels.gemm_skinny import gemm_skinny, gemm_skinny_swiglu

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402
from tests.kernels.test_gpu_kernels import VOCAB, K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu

# (N, K): qkv, o, gate_up, down at Qwen2.5-0.5B and -1.5B; a small odd N; a K of one chunk.
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (2048, 1536), (1536, 8960), (40, 64), (1000, 32)]
SPLITS = [(1, 8, 1), (1, 16, 1), (2, 8, 1), (2, 4, 1), (1, 8, 4), (1, 16, 2), (2, 8, 19)]


def case(M, N, Kin, dtype, seed=0, swiglu=False, twins=(gemm_skinny, gemm_skinny_swiglu)):
    """x [M, K], w [N, K] (swiglu: [2N, K]) and the reference out [M, N] from `twins` (the projection's twin, its
    SwiGLU form)."""
    rng = np.random.default_rng(seed + M * N + Kin)
    x = rounded(rng.standard_normal((M, Kin)), dtype)
    w = rounded(0.05 * rng.standard_normal((2 * N if swiglu else N, Kin)), dtype)
    ref = np.empty((M, N), np.float32)
    if M > 32:  # past the kernel: the reference for cuBLAS
        np.matmul(x, w.T, out=ref)
    else:
        twins[swiglu](x, w, ref)
    return x, w, ref


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [2, 5, 8, 9, 16, 17, 31, 32])
@pytest.mark.parametrize("N, Kin", SHAPES)
def test_gemm_skinny(dtype, M, N, Kin):
    x, w, ref = case(M, N, Kin, dtype)
    k = K(dtype)
    xd, wd = dev(x, dtype), dev(w, dtype)
    out = dev(np.full((M, N), 7.0), dtype)
    k.gemm_skinny(xd, wd, out)
    check(f"gemm_skinny M={M} N={N} K={Kin}", host(out, dtype), ref, dtype)
    # fp32 out: only the order of the fp32 sums differs from the twin.
    out32 = cp.full((M, N), 7.0, cp.float32)
    k.gemm_skinny(xd, wd, out32)
    check(f"gemm_skinny M={M} N={N} K={Kin} -> fp32", cp.asnumpy(out32), ref, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [2, 8, 13, 32])
@pytest.mark.parametrize("I, Kin", [(4864, 896), (8960, 1536), (40, 64), (768, 384)])
def test_gemm_skinny_swiglu(dtype, M, I, Kin):
    """The SwiGLU epilogue against the twin (projection, then silu_mul's roundings). (768, 384): the default
    model's MLP, whose 12-chunk K once asked for a 12-warp block and 48 KB + 1 byte of shared memory."""
    x, w, ref = case(M, I, Kin, dtype, seed=5, swiglu=True)
    out = dev(np.full((M, I), 7.0), dtype)
    K(dtype).gemm_skinny_swiglu(dev(x, dtype), dev(w, dtype), out)
    check(f"gemm_skinny_swiglu M={M} I={I} K={Kin}", host(out, dtype), ref, dtype)


@pytest.mark.parametrize("M", [8, 32])
def test_gemm_skinny_swiglu_split_k(M):
    """SwiGLU with K cut into slices: the last block of a tile adds both the gate and the up slices, in order."""
    x, w, ref = case(M, 896, 4864, "bfloat16", seed=6, swiglu=True)
    out = dev(np.zeros((M, 896)), "bfloat16")
    k = K("bfloat16")
    k.gemm_skinny_swiglu(dev(x, "bfloat16"), dev(w, "bfloat16"), out, split=(2, 8, 4))
    check(f"gemm_skinny_swiglu split-k M={M}", host(out, "bfloat16"), ref, "bfloat16")


@pytest.mark.parametrize("M", [4, 32])
@pytest.mark.parametrize("split", SPLITS)
def test_every_split_is_right_and_deterministic(M, split):
    """Each (m-tiles, warps a block, slices of K) split is right, and repeat launches give the same bits (the
    warps' partial tiles are added in warp order, the slices in slice order, and the last block of a tile resets
    its counter)."""
    N, Kin = 896, 4864
    x, w, ref = case(M, N, Kin, "bfloat16", seed=1)
    k = K("bfloat16")
    xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
    out = cp.full((M, N), 7.0, cp.float32)
    k.gemm_skinny(xd, wd, out, split=split)
    first = cp.asnumpy(out)
    check(f"gemm_skinny split={split}", first, ref, "float32")
    for _ in range(3):
        k.gemm_skinny(xd, wd, out, split=split)
        np.testing.assert_array_equal(cp.asnumpy(out), first)


def test_lm_head_rows():
    M, (N, Kin) = 32, (VOCAB, 896)
    x, w, ref = case(M, N, Kin, "bfloat16", seed=2)
    out = cp.zeros((M, N), cp.float32)
    K("bfloat16").gemm_skinny(dev(x, "bfloat16"), dev(w, "bfloat16"), out)
    check("gemm_skinny lm_head -> fp32", cp.asnumpy(out), ref, "float32")


def test_backend_ops_agree_with_cublas():
    """CudaBackend.gemm_skinny / gemm_skinny_swiglu (the step plan's "skinny") at 2 and 32 rows against the twin,
    and linear (cuBLAS) within bf16 rounding of the same product; 33 rows are past the kernel and refused."""
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    for M in (2, 32):
        x, w, ref = case(M, 1152, 896, "bfloat16", seed=3)
        xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
        ours, theirs = dev(np.zeros((M, 1152)), "bfloat16"), dev(np.zeros((M, 1152)), "bfloat16")
        be.gemm_skinny(xd, wd, ours)
        be.linear(xd, wd, theirs)
        be.synchronize()
        check(f"gemm_skinny M={M}", host(ours, "bfloat16"), ref, "bfloat16")
        check(f"linear M={M} (cuBLAS)", host(theirs, "bfloat16"), ref, "bfloat16")
        x, w, ref = case(M, 64, 896, "bfloat16", seed=4, swiglu=True)
        act = dev(np.zeros((M, 64)), "bfloat16")
        be.gemm_skinny_swiglu(dev(x, "bfloat16"), dev(w, "bfloat16"), act)
        be.synchronize()
        check(f"gemm_skinny_swiglu M={M}", host(act, "bfloat16"), ref, "bfloat16")
    x, w, _ = case(33, 1152, 896, "bfloat16", seed=3)
    with pytest.raises(ValueError, match="gemm_skinny"):
        be.gemm_skinny(dev(x, "bfloat16"), dev(w, "bfloat16"), dev(np.zeros((33, 1152)), "bfloat16"))
