"""The post-attention RMSNorm split over its neighbours, on the CPU: the twins of gemm_skinny_norm (the o projection
with add_rmsnorm's add and the norm weight as its epilogue) and silu_mul_scaled (the norm's per-row scale after the
gate_up GEMM) against NumPy, and the identity that lets the norm be split (the two together equal add_rmsnorm,
gate_up, silu_mul). The plan that runs them on the fixtures: tests/model/test_model_fixtures.py."""
import numpy as np
import pytest
from tests.tolerance import U32, assert_within, gamma, gemm_bound, rmsnorm_bound, silu_mul_bound

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
    dr = gemm_bound(x, w) + U32 * np.abs(h)  # the K-term product, then the residual add's rounding
    assert_within(residual, h, dr)
    xw = residual.astype(np.float64) * nw
    assert_within(x_out, xw, U32 * np.abs(xw))  # one float32 product
    want = (h * h).reshape(M, N // 16, 16).sum(-1).T
    # 16 squares of the rounded residual (2|h| dr each), squared and summed in float32: gamma_16 of the tile's sum
    tile_bound = (2 * np.abs(h) * dr).reshape(M, N // 16, 16).sum(-1).T + gamma(16) * want
    assert_within(parts[:N // 16, :M], want, tile_bound)
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
    # inv rounded to float32 (float64 sum: exact enough), then gate_up * inv in float32: 2u on g and on u
    assert_within(out, g / (1.0 + np.exp(-g)) * u, silu_mul_bound(g, u, 2 * U32 * np.abs(g), 2 * U32 * np.abs(u)))
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
    # Each path against the exact float64 chain; the two paths differ by at most the sum of their bounds.
    f64 = lambda a: a.astype(np.float64)
    h = f64(r0) + f64(attn) @ f64(wo).T
    dr = gemm_bound(attn, wo) + U32 * np.abs(h)  # either path's residual: the K = Q product, the add's rounding
    assert_within(h2, h1, 2 * dr)
    inv = 1.0 / np.sqrt(np.mean(h * h, -1, keepdims=True) + EPS)
    xn, hw = h * inv * nw, h * nw  # the normalised input of gate_up (plain), the weighted residual (split)
    gu = xn @ f64(wgu).T
    # plain: add_rmsnorm (rmsnorm_bound), gate_up over K = H (gemm_bound), silu_mul
    dgu1 = rmsnorm_bound(h, nw, EPS, dr) @ np.abs(f64(wgu)).T + gemm_bound(xn, wgu)
    # split: x2 = h2 * nw (one product), gate_up over K = H, the squares' sum (2|h| dr each, gamma_16 in a tile;
    # the tiles in float64) -> inv to float32 (d ss / 2 relative + u), then gate_up * inv in float32 (u)
    dgu2 = (np.abs(nw) * dr + U32 * np.abs(hw)) @ np.abs(f64(wgu)).T + gemm_bound(hw, wgu)
    ss = np.sum(h * h, -1, keepdims=True)
    dinv = 0.5 * (np.sum(2 * np.abs(h) * dr, -1, keepdims=True) + gamma(16) * ss) / (ss + H * EPS) + U32
    dgu2 = inv * dgu2 + np.abs(gu) * (dinv + U32)
    bound = sum(silu_mul_bound(gu[:, :I], gu[:, I:], d[:, :I], d[:, I:]) for d in (dgu1, dgu2))
    assert_within(act2, act1, bound)
