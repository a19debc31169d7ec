"""The post-attention RMSNorm in the o projection on the GPU: gemm_skinny_norm (gemm_skinny.cu: the o projection with
add_rmsnorm's add and the norm weight as its epilogue) writes the residual add_rmsnorm would, bit for bit, x_out =
T(h * w) and the tiles' sums of h^2; silu_mul_scaled (activation.cu) against NumPy with its roundings and against
the CPU twin; split-K and repeat launches; the engine's tokens with the plan's skinny_norm o against a plan without
it (bf16 agreement), the same from graphs and eagerly. Skipped without a GPU."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest

from kernels.activation import silu_mul_scaled as twin_scaled
from kernels.gemm_skinny import gemm_skinny_norm as twin_norm

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402
from tests.kernels.test_gpu_kernels import K, check, host  # noqa: E402

pytestmark = pytest.mark.gpu
BF = ml_dtypes.bfloat16
EPS = 1e-6

# (N, K) of the o projection: Qwen2.5-0.5B, -1.5B, -7B, the tiny shape.
SHAPES = [(896, 896), (1536, 1536), (3584, 3584), (256, 256)]


def bf(x):
    """Round fp32 to bf16 (nearest even) and back, as from_f32<bf16> does."""
    return np.asarray(x, np.float32).astype(BF).astype(np.float32)


def case(M, N, Kin, seed=0):
    rng = np.random.default_rng(seed + M + N)
    x = rounded(rng.standard_normal((M, Kin)), "bfloat16")
    w = rounded(0.05 * rng.standard_normal((N, Kin)), "bfloat16")
    r0 = rounded(3.0 * rng.standard_normal((M, N)), "bfloat16")
    nw = rounded(1 + 0.1 * rng.standard_normal(N), "bfloat16")
    return x, w, r0, nw


def run_norm(k, x, w, r0, nw, split=None):
    M, N = r0.shape
    res, xo = dev(r0, "bfloat16"), dev(np.zeros((M, N)), "bfloat16")
    parts = cp.full(N // 16 * M, np.nan, cp.float32)
    k.gemm_skinny_norm(dev(x, "bfloat16"), dev(w, "bfloat16"), res, dev(nw, "bfloat16"), xo, parts, split=split)
    return host(res, "bfloat16"), host(xo, "bfloat16"), cp.asnumpy(parts).reshape(N // 16, M)


@pytest.mark.parametrize("M", [2, 5, 8, 17, 32])
@pytest.mark.parametrize("N, Kin", SHAPES)
def test_gemm_skinny_norm(M, N, Kin):
    k = K("bfloat16")
    x, w, r0, nw = case(M, N, Kin)
    res, xo, parts = run_norm(k, x, w, r0, nw)
    # The residual add_rmsnorm would write after gemm_skinny: T(float(r) + float(T(o))), bit for bit.
    o = dev(np.zeros((M, N)), "bfloat16")
    k.gemm_skinny(dev(x, "bfloat16"), dev(w, "bfloat16"), o)
    want_h = bf(r0 + host(o, "bfloat16"))
    np.testing.assert_array_equal(res, want_h)
    np.testing.assert_array_equal(xo, bf(want_h * nw))
    sq = (want_h * want_h).reshape(M, N // 16, 16)
    acc = sq[:, :, 0].copy()
    for j in range(1, 16):  # the kernel's order: a tile's 16 columns one after another, in fp32
        acc += sq[:, :, j]
    np.testing.assert_array_equal(parts, acc.T)
    # Against the CPU twin (fp32 projection: bf16 rounding apart).
    th, tx, tp = r0.copy(), np.empty((M, N), np.float32), np.empty((N // 16, M), np.float32)
    twin_norm(x, w, th, nw, tx, tp)
    check(f"gemm_skinny_norm h M={M} N={N}", res, th, "bfloat16")
    check(f"gemm_skinny_norm x M={M} N={N}", xo, tx, "bfloat16")
    np.testing.assert_allclose(parts, tp, rtol=2e-2)


@pytest.mark.parametrize("split", [(8, 4), (16, 2), (4, 1)])
def test_gemm_skinny_norm_split_k_and_repeats(split):
    """K cut into slices (the last block of a tile adds them, runs the epilogue and writes the tile's sums), and
    repeat launches give the same bits (the counters are left at zero)."""
    k = K("bfloat16")
    x, w, r0, nw = case(32, 1536, 1536, seed=3)
    first = run_norm(k, x, w, r0, nw, split)
    th, tx, tp = r0.copy(), np.empty_like(r0), np.empty((1536 // 16, 32), np.float32)
    twin_norm(x, w, th, nw, tx, tp)
    check(f"gemm_skinny_norm split={split}", first[0], th, "bfloat16")
    for _ in range(2):
        for a, b in zip(run_norm(k, x, w, r0, nw, split), first):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("T, I, tiles", [(1, 4864, 56), (5, 8960, 96), (32, 4864, 56), (32, 688, 16)])
def test_silu_mul_scaled(T, I, tiles):
    k = K("bfloat16")
    rng = np.random.default_rng(T + I)
    gu = rounded(20.0 * rng.standard_normal((T, 2 * I)), "bfloat16")
    parts = (np.abs(rng.standard_normal((tiles, T))) * 40.0).astype(np.float32)
    out = dev(np.zeros((T, I)), "bfloat16")
    k.silu_mul_scaled(dev(gu, "bfloat16"), cp.asarray(parts), EPS, out)
    got = host(out, "bfloat16")
    # NumPy with the kernel's roundings (the sum of the tiles in another fp32 order: 1 ulp of inv apart at most).
    inv = (1.0 / np.sqrt(parts.astype(np.float64).sum(0) / (16 * tiles) + EPS)).astype(np.float32)[:, None]
    g, u = bf(inv * gu[:, :I]), bf(inv * gu[:, I:])
    want = bf(bf(g / (1.0 + np.exp(-g))) * u)
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6)
    again = dev(np.zeros((T, I)), "bfloat16")
    k.silu_mul_scaled(dev(gu, "bfloat16"), cp.asarray(parts), EPS, again)
    np.testing.assert_array_equal(host(again, "bfloat16"), got)
    ref = np.empty((T, I), np.float32)
    twin_scaled(gu, parts, EPS, ref)
    check(f"silu_mul_scaled T={T} I={I}", got, ref, "bfloat16")


@pytest.fixture(scope="module")
def tiny_bf16():
    from toolkit.engine.build import build_engine

    return build_engine(shape="tiny", device="cuda", dtype="bfloat16", max_context=256, kv_cache_tokens=256 * 40)


@pytest.mark.parametrize("batch", [5, 24])
def test_engine_bf16_agreement(tiny_bf16, batch, monkeypatch):
    """The engine's own plans (o "skinny_norm" in decode steps of 2-32 rows: gemm_skinny_norm runs) against the same
    plans with o a plain gemm_skinny and gate_up's SwiGLU epilogue: graphs and eager steps give the same tokens
    either way, and against each other (other roundings) the tokens agree for > 80% before the first divergence.
    The own plans are those of a GPU without wgmma (or a shape past wg's one wave): on Hopper gate_up runs on wg at
    these rows, and o then stays plain."""
    import toolkit.model.plan
    from tests.engine.test_gpu_engine import plan_changes_no_token, prompts

    reqs = prompts(np.random.default_rng(95 + batch), tiny_bf16.cfg.vocab_size, batch)
    def edit(p):
        if p.o == "skinny_norm":
            return dataclasses.replace(p, o="skinny", swiglu="epilogue" if p.gate_up != "blas" else "silu_mul")
        return None

    with monkeypatch.context() as m:
        m.setattr(toolkit.model.plan, "WG_DECODE_ROWS", (0, -1))  # no row count is wg's
        plan_changes_no_token(tiny_bf16, reqs, edit, "gemm_skinny_norm", monkeypatch, exact=False)
    tiny_bf16.runner.model._plans.clear()  # (the shared engine's later steps plan, and capture, with wg again)
    tiny_bf16.runner.graphs.clear()
