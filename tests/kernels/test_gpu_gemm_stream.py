"""gemm_stream.cu (the MLP's projections at 2-32 rows, weights streamed through shared memory by the TMA unit) on
the GPU against its CPU twin: the Qwen2.5 gate_up (SwiGLU epilogue) and down shapes and the default model's, odd
row counts, every slicing of K (split-K partials added by each tile's last warp), repeat launches bit-identical
(the counters left at zero), more tiles than stages (the producer waiting for freed stages), and the backend's
linear / linear_swiglu choosing it only where it should. Skipped without a GPU (or before Hopper)."""
import numpy as np
import pytest

from kernels.gemm_stream import gemm_stream, gemm_stream_swiglu

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev  # noqa: E402
from tests.kernels.test_gpu_gemm_skinny import case as skinny_case  # noqa: E402
from tests.kernels.test_gpu_kernels import K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, scope="module")
def _hopper():
    if K("bfloat16").cc < 90:
        pytest.skip("gemm_stream needs the TMA unit (Hopper+)")


def case(M, N, Kin, dtype, seed=0, swiglu=False):
    return skinny_case(M, N, Kin, dtype, seed, swiglu, (gemm_stream, gemm_stream_swiglu))


def run(M, N, Kin, dtype, swiglu, split=None, seed=0):
    x, w, ref = case(M, N, Kin, dtype, seed, swiglu)
    out = dev(np.full((M, N), 7.0), dtype)
    K(dtype).gemm_stream(dev(x, dtype), dev(w, dtype), out, swiglu, split)
    check(f"gemm_stream{' swiglu' if swiglu else ''} M={M} N={N} K={Kin} S={split}", host(out, dtype), ref, dtype)
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [2, 5, 8, 9, 17, 32])
@pytest.mark.parametrize("N, Kin, swiglu", [(4864, 896, True), (896, 4864, False), (8960, 1536, True),
                                            (1536, 8960, False), (688, 256, True), (256, 688, False)])
def test_gemm_stream(dtype, M, N, Kin, swiglu):
    """Qwen2.5-0.5B and -1.5B gate_up (I, K) and down (N, K), the default model's, against the twin."""
    run(M, N, Kin, dtype, swiglu)


@pytest.mark.parametrize("M", [4, 32])
@pytest.mark.parametrize("N, Kin, swiglu", [(896, 4864, False), (4864, 896, True)])
@pytest.mark.parametrize("split", [1, 2, 4, 8, 16, 19])
def test_every_slicing_is_right_and_deterministic(M, N, Kin, swiglu, split):
    """Each slicing of K is right (where it fits), and repeat launches give the same bits: the slices are added
    in slice order by the tile's last warp, which resets the tile's counter for the next launch."""
    from toolkit.backends.cuda_gemm import stream_plan

    k = K("bfloat16")
    if stream_plan(M, N, Kin, k.num_sms, k.smem_optin, 2, swiglu, split) is None:
        pytest.skip(f"{split} slices do not fit")
    out = run(M, N, Kin, "bfloat16", swiglu, split, seed=1)
    first = cp.asnumpy(out)
    x, w, _ = case(M, N, Kin, "bfloat16", 1, swiglu)
    xd, wd = dev(x, "bfloat16"), dev(w, "bfloat16")
    for _ in range(3):
        k.gemm_stream(xd, wd, out, swiglu, split)
        np.testing.assert_array_equal(cp.asnumpy(out), first)


def test_more_tiles_than_stages():
    """151,936 rows (the lm_head's shape): 72 tiles a block through 5 stages, each refilled once its warp is done."""
    from toolkit.backends.cuda_gemm import stream_plan

    k = K("bfloat16")
    NT, S, B, NS = stream_plan(32, 151936, 896, k.num_sms, k.smem_optin)
    assert -(-151936 // 16 // B) > NS
    run(32, 151936, 896, "bfloat16", False, seed=2)


def test_backend_picks_it_for_the_mlp_only():
    """CudaBackend.linear / linear_swiglu with stream_gemm send gate_up and down at 2-32 rows here, not 33 rows,
    not the small qkv weights (gemm_skinny's or cuBLAS's) and not fp32 logits; cuBLAS gives the same product
    within bf16 rounding."""
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend("bfloat16")
    be.bind_thread()
    for M in (2, 32, 33):
        x, w, ref = case(M, 896, 4864, "bfloat16", seed=3)
        ours, theirs = dev(np.zeros((M, 896)), "bfloat16"), dev(np.zeros((M, 896)), "bfloat16")
        be.linear(dev(x, "bfloat16"), dev(w, "bfloat16"), ours, stream_gemm=True)
        be.linear(dev(x, "bfloat16"), dev(w, "bfloat16"), theirs)
        check(f"linear M={M} (ours)", host(ours, "bfloat16"), ref, "bfloat16")
        check(f"linear M={M} (cuBLAS)", host(theirs, "bfloat16"), ref, "bfloat16")
        if M > 32:
            continue
        x, w, ref = case(M, 4864, 896, "bfloat16", seed=4, swiglu=True)
        act, gu = dev(np.zeros((M, 4864)), "bfloat16"), dev(np.zeros((M, 9728)), "bfloat16")
        be.linear_swiglu(dev(x, "bfloat16"), dev(w, "bfloat16"), gu, act, stream_gemm=True)
        check(f"linear_swiglu M={M} (ours)", host(act, "bfloat16"), ref, "bfloat16")
    x, w, _ = case(32, 1152, 896, "bfloat16", seed=5)  # qkv: under the weights gemm_stream takes
    be.linear(dev(x, "bfloat16"), dev(w, "bfloat16"), dev(np.zeros((32, 1152)), "bfloat16"), stream_gemm=True)
    x, w, _ = case(32, 4096, 896, "bfloat16", seed=6)  # fp32 out (logits): cuBLAS
    be.linear(dev(x, "bfloat16"), dev(w, "bfloat16"), cp.zeros((32, 4096), cp.float32), stream_gemm=True)
    keys = [k for k in be.kernels._gemm_plans if k[0] == "stream"]
    assert {(k[1], k[2], k[4]) for k in keys} == {(2, 896, False), (32, 896, False), (2, 4864, True),
                                                  (32, 4864, True)}, keys
