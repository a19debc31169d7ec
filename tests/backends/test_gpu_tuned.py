"""The plan's "tuned" projections on the GPU (toolkit/backends/cuda_tuned.py): the cuBLAS algorithm measured
fastest for a (N, K, row bucket) computes the same product as gemmEx, to fp32 accumulation's rounding; a captured
graph replays the measured choice; a capture that finds no choice runs gemmEx and records none; rows other than
the measured ones and less-aligned pointers still get the right product.

Tolerance from the arithmetic: an fp32 sum of K products is within K * 2^-24 * sum_k |x_k w_k| of the exact one
(the products of 16-bit inputs are exact in fp32), so against a float64 reference each output must be within
that bound, plus half a bf16 step of the result where the output is bf16."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402

pytestmark = pytest.mark.gpu

U32 = 2.0 ** -24
# (N, K): Qwen2.5-0.5B's qkv, o, gate_up and down, Llama-3.2-1B's down
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864), (2048, 8192)]


@pytest.fixture(scope="module")
def be():
    from toolkit.backends.cuda import CudaBackend

    b = CudaBackend("bfloat16")
    if b._tuned is None:
        pytest.skip("nvmath-python missing: linear_tuned is linear")
    return b


def operands(T, N, K, seed):
    rng = np.random.default_rng(seed)
    return rounded(rng.standard_normal((T, K)), "bfloat16"), rounded(0.05 * rng.standard_normal((N, K)), "bfloat16")


def bound(x, w, bf16_out):
    """Per-output error allowed: fp32 accumulation over K, plus half a bf16 step where the output is bf16."""
    acc = x.shape[1] * U32 * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    return ref, acc + (np.abs(ref) * 2.0 ** -8 if bf16_out else 0)


def to_f32(out):
    h = cp.asnumpy(out)
    return (h.astype(np.uint32) << 16).view(np.float32) if h.dtype == np.uint16 else h


def run(be, fn, x, w, out):
    cp.cuda.Device().synchronize()  # (the backend's stream does not wait for the default one)
    fn(x, w, out)
    be.stream.synchronize()
    return to_f32(out)


@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_tuned_matches_the_exact_product(be, N, K, out_dtype):
    """First call at 1,024 rows measures; the second replays the choice; both within fp32 accumulation's bound."""
    x, w = operands(1024, N, K, N + K)
    dx, dw = dev(x, "bfloat16"), dev(w, "bfloat16")
    out = cp.empty((1024, N), cp.uint16 if out_dtype == "bfloat16" else cp.float32)
    ref, tol = bound(x, w, out_dtype == "bfloat16")
    for _ in range(2):
        got = run(be, be.linear_tuned, dx, dw, out)
        assert np.isfinite(got).all() and (np.abs(got - ref) <= tol).all(), float(np.abs(got - ref).max())
    c = be._tuned.choice(N, 1024, K, be._in_type, 0 if out_dtype == "float32" else be._in_type)
    assert c is not None and c.rows == 1024 and len(c.times_us) >= 1
    if c.algo is not None:  # a cuBLASLt algorithm only where it measured clearly faster than gemmEx
        from toolkit.backends.cuda_tuned import MARGIN
        assert min(t for t in c.times_us[1:]) < MARGIN * c.times_us[0]
        assert "cuBLASLt" in c.describe()


@pytest.mark.parametrize("T", [2048, 1500, 1030])
def test_other_rows_of_a_bucket_and_unaligned_pointers(be, T):
    """Bucket 2,048 is measured at 2,048 rows; 1,500 and 1,030 run its choice (or gemmEx where cuBLASLt's check
    refuses it), also from an x whose pointer is only 4-byte aligned."""
    N, K = 9728, 896
    x, w = operands(T, N, K, T)
    ref, tol = bound(x, w, True)
    dw, out = dev(w, "bfloat16"), cp.empty((T, N), cp.uint16)
    got = run(be, be.linear_tuned, dev(x, "bfloat16"), dw, out)
    assert (np.abs(got - ref) <= tol).all()
    buf = cp.empty(T * K + 2, cp.uint16)
    shifted = buf[2:].reshape(T, K)  # 4 bytes past the allocation's start
    shifted[...] = dev(x, "bfloat16")
    got = run(be, be.linear_tuned, shifted, dw, out)
    assert (np.abs(got - ref) <= tol).all()
    assert be._tuned.choice(N, T, K, be._in_type, be._in_type) is not None  # (one for the bucket, whichever T came)


def test_a_graph_replays_the_measured_choice(be):
    N, K, T = 896, 4864, 768
    x, w = operands(T, N, K, 7)
    dx, dw = dev(x, "bfloat16"), dev(w, "bfloat16")
    eager, replayed = cp.empty((T, N), cp.uint16), cp.zeros((T, N), cp.uint16)
    run(be, be.linear_tuned, dx, dw, eager)  # measures bucket 1,024
    run(be, be.linear_tuned, dx, dw, eager)
    graph = be.capture(lambda: be.linear_tuned(dx, dw, replayed))
    be.replay(graph)
    be.stream.synchronize()
    assert (eager == replayed).all()  # the very same algorithm: the same bits


def test_a_capture_without_a_choice_runs_gemm_ex_and_records_none(be):
    N, K, T = 1152, 896, 8192  # a bucket no other test measures
    x, w = operands(T, N, K, 9)
    dx, dw = dev(x, "bfloat16"), dev(w, "bfloat16")
    plain, captured = cp.empty((T, N), cp.uint16), cp.zeros((T, N), cp.uint16)
    run(be, be.linear, dx, dw, plain)
    cp.cuda.Device().synchronize()
    graph = be.capture(lambda: be.linear_tuned(dx, dw, captured))
    assert be._tuned.choice(N, T, K, be._in_type, be._in_type) is None
    be.replay(graph)
    be.stream.synchronize()
    assert (plain == captured).all()  # gemmEx, the same call as linear's
