"""mlp_stream (gemm_stream.cu: the MLP block of a 2-32-row decode step, out = W_down SwiGLU(W_gate_up x), in one
kernel with a grid barrier between the projections) on the GPU against its CPU twins (gemm_stream's SwiGLU
projection, act rounded to the element type, then gemm_stream's): Qwen2.5-0.5B, -1.5B and the default model's
shapes, odd row counts, every slicing of the down projection's K, repeat launches bit-identical (counters and
the grid barrier left at zero), and CudaBackend.mlp choosing it only where it should. Skipped without a GPU (or
before Hopper)."""
import numpy as np
import pytest

from kernels.gemm_stream import gemm_stream, gemm_stream_swiglu

cp = pytest.importorskip("cupy")
from gpu_arrays import dev, rounded  # noqa: E402
from test_gpu_kernels import K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPES = [(896, 4864), (1536, 8960), (256, 688)]  # (H, I): Qwen2.5-0.5B, -1.5B, the default model


@pytest.fixture(autouse=True, scope="module")
def _hopper():
    if K("bfloat16").cc < 90:
        pytest.skip("mlp_stream needs the TMA unit (Hopper+)")


def case(M, H, I, dtype, seed=0):
    """x [M, H], w_gate_up [2I, H], w_down [H, I], and the twins' act [M, I] (rounded to dtype, as the kernel
    stores it) and out [M, H]."""
    rng = np.random.default_rng(seed + 7 * M + H + I)
    x = rounded(rng.standard_normal((M, H)), dtype)
    wgu = rounded(0.05 * rng.standard_normal((2 * I, H)), dtype)
    wd = rounded(0.05 * rng.standard_normal((H, I)), dtype)
    act, out = np.empty((M, I), np.float32), np.empty((M, H), np.float32)
    for r in range(0, M, 32):  # (the twins take 32 rows at a time, as the kernel)
        gemm_stream_swiglu(x[r:r + 32], wgu, act[r:r + 32])
        act[r:r + 32] = rounded(act[r:r + 32], dtype)
        gemm_stream(act[r:r + 32], wd, out[r:r + 32])
    return x, wgu, wd, act, out


def run(M, H, I, dtype, split=None, seed=0):
    x, wgu, wd, act_ref, ref = case(M, H, I, dtype, seed)
    act, out = dev(np.zeros((M, I)), dtype), dev(np.full((M, H), 7.0), dtype)
    args = (dev(x, dtype), dev(wgu, dtype), dev(wd, dtype), act, out)
    K(dtype).mlp_stream(*args, split)
    check(f"mlp_stream act M={M} H={H} I={I} S={split}", host(act, dtype), act_ref, dtype)
    check(f"mlp_stream M={M} H={H} I={I} S={split}", host(out, dtype), ref, dtype)
    return args


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [2, 5, 8, 9, 17, 32])
@pytest.mark.parametrize("H, I", SHAPES)
def test_mlp_stream(dtype, M, H, I):
    run(M, H, I, dtype)


@pytest.mark.parametrize("M", [4, 32])
@pytest.mark.parametrize("split", [2, 4, 8, 16, 19])
def test_every_slicing_is_right_and_deterministic(M, split):
    """Each slicing of the down projection's K is right (where it fits), and repeat launches give the same bits:
    the warps' partial tiles are added in warp order, the slices in slice order by the tile's last block, which
    resets the tile's counter; the grid barrier's count is left at zero."""
    from toolkit.backends.cuda_gemm import mlp_plan

    k = K("bfloat16")
    if mlp_plan(M, 896, 4864, k.num_sms, k.smem_optin, 2, split) is None:
        pytest.skip(f"{split} slices do not fit")
    args = run(M, 896, 4864, "bfloat16", split, seed=1)
    first = cp.asnumpy(args[-1])
    for _ in range(3):
        args[-1].fill(0)
        k.mlp_stream(*args, split)
        np.testing.assert_array_equal(cp.asnumpy(args[-1]), first)


def test_backend_takes_it_with_stream_gemm_only():
    """CudaBackend.mlp sends 2-32 rows here with stream_gemm, and 33 rows (or stream_gemm off) to the two
    projections; the results agree within bf16 rounding."""
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    for M, stream in ((2, True), (32, True), (33, True), (32, False)):
        x, wgu, wd, _, ref = case(M, 896, 4864, "bfloat16", seed=3)
        gu, act = dev(np.zeros((M, 9728)), "bfloat16"), dev(np.zeros((M, 4864)), "bfloat16")
        out = dev(np.zeros((M, 896)), "bfloat16")
        be.kernels._gemm_plans.clear()
        be.mlp(dev(x, "bfloat16"), dev(wgu, "bfloat16"), dev(wd, "bfloat16"), gu, act, out, stream_gemm=stream)
        check(f"mlp M={M} stream_gemm={stream}", host(out, "bfloat16"), ref, "bfloat16")
        took = any(key[0] == "mlp" for key in be.kernels._gemm_plans)
        assert took == (stream and M <= 32), (M, stream, list(be.kernels._gemm_plans))
