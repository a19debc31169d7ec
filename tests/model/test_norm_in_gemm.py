"""norm_in_gemm on the CPU: the twins of gemm_skinny_norm (the o projection with add_rmsnorm's add and the norm
weight as its epilogue) and silu_mul_scaled (the norm's per-row scale after the gate_up GEMM) against NumPy, the
identity that lets the norm be split (the two together equal add_rmsnorm, gate_up, silu_mul), and Model.forward's
branch on the fixtures against the plain path and transformers."""
import numpy as np
import pytest
from tests.model.test_model_fixtures import score_forced

from kernels.activation import silu_mul, silu_mul_scaled
from kernels.gemm_skinny import gemm_skinny_norm
from kernels.rmsnorm import add_rmsnorm

EPS = 1e-6


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize("M,N,K", [(1, 16, 32), (5, 64, 96), (32, 896, 64)])
def test_gemm_skinny_norm_twin(M, N, K):
    """residual += x W^T; x_out = residual * w; parts[q, m] = sum of residual[m, 16q:16q+16]^2 (NumPy, float64)."""
    rng = np.random.default_rng(M + N)
    x, w, r0, nw = randn(rng, M, K), randn(rng, N, K, scale=0.1), randn(rng, M, N, scale=3.0), randn(rng, N)
    residual, x_out = r0.copy(), np.empty((M, N), np.float32)
    parts = np.full((N // 16 + 1, M + 2), np.nan, np.float32)  # larger than needed: the rest stays untouched
    gemm_skinny_norm(x, w, residual, nw, x_out, parts)
    h = r0.astype(np.float64) + x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(residual, h, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(x_out, residual.astype(np.float64) * nw, rtol=1e-6, atol=1e-6)
    want = (h * h).reshape(M, N // 16, 16).sum(-1).T
    np.testing.assert_allclose(parts[:N // 16, :M], want, rtol=1e-5)
    assert np.isnan(parts[N // 16:]).all() and np.isnan(parts[:, M:]).all()
    with pytest.raises(ValueError):
        gemm_skinny_norm(x, w[:N - 8], residual[:, :N - 8], nw[:N - 8], x_out[:, :N - 8], parts)


@pytest.mark.parametrize("T,I,tiles", [(1, 40, 1), (7, 100, 56)])
def test_silu_mul_scaled_twin(T, I, tiles):
    """out = silu(inv g) * (inv u), inv = rsqrt(sum of the row's tile sums / (16 tiles) + eps)."""
    rng = np.random.default_rng(T * I)
    gate_up = randn(rng, T, 2 * I, scale=30.0)
    parts = np.abs(randn(rng, tiles, T, scale=50.0))
    out = np.empty((T, I), np.float32)
    silu_mul_scaled(gate_up, parts, EPS, out)
    inv = 1.0 / np.sqrt(parts.astype(np.float64).sum(0) / (16 * tiles) + EPS)
    g, u = gate_up[:, :I] * inv[:, None], gate_up[:, I:] * inv[:, None]
    np.testing.assert_allclose(out, g / (1.0 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        silu_mul_scaled(gate_up, parts[:, :T - 1] if T > 1 else parts[:, :0], EPS, out)


def test_split_norm_equals_add_rmsnorm_then_swiglu():
    """The identity the GPU path stands on: gemm_skinny_norm, the gate_up GEMM on its x_out, silu_mul_scaled give
    add_rmsnorm, the gate_up GEMM, silu_mul (fp32: the same values up to rounding), and the same residual."""
    rng = np.random.default_rng(7)
    M, H, Q, I = 6, 64, 48, 80
    attn, wo, r0 = randn(rng, M, Q), randn(rng, H, Q, scale=0.2), randn(rng, M, H, scale=2.0)
    nw, wgu = randn(rng, H), randn(rng, 2 * I, H, scale=0.2)
    # plain: attn_out = attn Wo^T; add_rmsnorm; gate_up; silu_mul
    h1, x1, act1 = r0.copy(), np.empty((M, H), np.float32), np.empty((M, I), np.float32)
    add_rmsnorm(attn @ wo.T, h1, nw, EPS, x1)
    silu_mul(x1 @ wgu.T, act1)
    # split
    h2, x2, act2 = r0.copy(), np.empty((M, H), np.float32), np.empty((M, I), np.float32)
    parts = np.empty((H // 16, M), np.float32)
    gemm_skinny_norm(attn, wo, h2, nw, x2, parts)
    silu_mul_scaled(x2 @ wgu.T, parts, EPS, act2)
    np.testing.assert_allclose(h2, h1, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(act2, act1, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_norm_in_gemm_path(name, monkeypatch):
    """Decode steps with norm_in_gemm (and skinny_gemm, which it rides on) take Model.forward's split-norm branch,
    run on the CPU twins: linear_norm and silu_mul_scaled in every layer of every decode step, logits within 1e-5
    of the plain path and 1e-4 of transformers."""
    def patch(be, calls):
        monkeypatch.setattr(be, "linear_norm", lambda *a: (calls.append(1), type(be).linear_norm(be, *a)))

    ref, plain, prompt, decode, calls, layers = score_forced(name, monkeypatch, patch, skinny_gemm=True,
                                                             norm_in_gemm=True)
    assert len(calls) == layers * len(decode)  # decode steps only: prompt tokens are prefill rows
    np.testing.assert_allclose(np.concatenate([prompt, decode]), plain, rtol=0, atol=1e-5)
    assert np.abs(decode - ref["decode_logits"]).max() <= 1e-4
