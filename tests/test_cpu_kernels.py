"""CPU twins (kernels/*.py) vs plain float64 NumPy references written the obvious way.

The twins are the reference for every CUDA kernel, so they are checked here against formulas that share no code
with them: attention as an explicit softmax over a masked [T, keys] score matrix, RoPE in HF's rotate_half form, etc.
Shapes cover GQA ratios 1 and 7, D = 64 and 8, start_pos > 0, T = 1, and lengths that are not multiples of the
attention tiles (BQ = 16 queries, BK = 64 keys). test_tests_can_fail shows the data tell the likely bugs apart.
"""
import numpy as np
import pytest

import kernels.prefill_attention as prefill_mod
from kernels.activation import silu_mul
from kernels.argmax import argmax
from kernels.decode_attention import decode_attention
from kernels.embedding import embedding
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm
from kernels.rope import rope_qkv

EPS = 1e-6


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def assert_close(got, want, rtol=1e-5):
    """Max error relative to the reference's largest magnitude (elementwise rtol means nothing near zero)."""
    err = np.max(np.abs(got.astype(np.float64) - want))
    assert err <= rtol * np.max(np.abs(want)), f"max abs error {err:.3g}, reference max {np.max(np.abs(want)):.3g}"


def rope_tables(S, D, theta=10000.0):
    inv_freq = theta ** (-np.arange(0, D, 2) / D)
    angles = np.outer(np.arange(S), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# ---- references (float64) ----

def ref_rmsnorm(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def ref_rope(x, pos, cos, sin):
    """HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, with cos/sin tables repeated over both halves."""
    half = x.shape[-1] // 2
    c = np.concatenate([cos[pos], cos[pos]], -1)[:, None, :]
    s = np.concatenate([sin[pos], sin[pos]], -1)[:, None, :]
    rotate_half = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * c + rotate_half * s


def ref_attention(q, k, v, start_pos, scale, causal=True, kv_head=None):
    """q [T, Hq, D] at positions start_pos.. ; k, v [Hkv, S, D]. Materialises the full masked score matrix."""
    T, Hq, _ = q.shape
    group = Hq // k.shape[0]
    kv_head = kv_head or (lambda h: h // group)
    n = start_pos + T
    pos = start_pos + np.arange(T)
    out = np.zeros(q.shape)
    for h in range(Hq):
        K = k[kv_head(h), :n].astype(np.float64)
        V = v[kv_head(h), :n].astype(np.float64)
        scores = scale * q[:, h].astype(np.float64) @ K.T
        if causal:
            scores[np.arange(n)[None, :] > pos[:, None]] = -np.inf
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ V
    return out


def make_attention(rng, T, Hq, Hkv, D, start_pos, S):
    """q and a cache whose rows past the attended keys are NaN: reading any of them would poison the output."""
    q = randn(rng, T, Hq, D, scale=2.0)  # peaky-ish softmax, so a wrong mask or head shows clearly
    k = np.full((Hkv, S, D), np.nan, np.float32)
    v = np.full((Hkv, S, D), np.nan, np.float32)
    k[:, :start_pos + T] = randn(rng, Hkv, start_pos + T, D)
    v[:, :start_pos + T] = randn(rng, Hkv, start_pos + T, D)
    return q, k, v


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(params=["serial", "parallel"])
def driver(request, monkeypatch):
    """Runs attention tests through both the serial and the prange driver, whatever the problem size."""
    monkeypatch.setattr(prefill_mod, "PARALLEL_MIN_MACS", 0 if request.param == "parallel" else 1 << 62)


# ---- tests ----

def test_embedding(rng):
    table = randn(rng, 50, 24)
    ids = np.array([3, 0, 49, 3, 17], np.int32)
    out = np.empty((5, 24), np.float32)
    embedding(ids, table, out)
    np.testing.assert_array_equal(out, table[[3, 0, 49, 3, 17]])
    with pytest.raises(IndexError):
        embedding(np.array([-1], np.int32), table, out[:1])


@pytest.mark.parametrize("T,H,with_x", [(1, 384, True), (7, 24, True), (3, 384, False)])
def test_add_rmsnorm(rng, T, H, with_x):
    x, r0, w = randn(rng, T, H), randn(rng, T, H, scale=3.0), randn(rng, H)
    if not with_x:
        r0[-1] *= 1e-3  # mean square ~1e-5: eps = 1e-6 matters here
    residual, out = r0.copy(), np.empty((T, H), np.float32)
    add_rmsnorm(x if with_x else None, residual, w, EPS, out)
    expect_r = r0 + x if with_x else r0  # fp32 add, exactly as the kernel and HF do it
    np.testing.assert_array_equal(residual, expect_r)  # the residual stream is written back
    assert_close(out, ref_rmsnorm(expect_r, w))


def test_add_rmsnorm_out_may_alias_x(rng):
    x, r0, w = randn(rng, 4, 32), randn(rng, 4, 32), randn(rng, 32)
    residual, out = r0.copy(), x.copy()
    add_rmsnorm(out, residual, w, EPS, out)
    assert_close(out, ref_rmsnorm(r0 + x, w))


@pytest.mark.parametrize("T,Hq,Hkv,D,start_pos", [(1, 6, 6, 64, 37), (13, 7, 1, 8, 5), (5, 14, 2, 64, 0)])
@pytest.mark.parametrize("with_bias,with_norm", [(False, False), (True, False), (False, True), (True, True)])
def test_rope_qkv(rng, T, Hq, Hkv, D, start_pos, with_bias, with_norm):
    S = start_pos + T + 3
    cos, sin = rope_tables(S, D)
    qkv = randn(rng, T, (Hq + 2 * Hkv) * D)
    qkv[-1] *= 1e-3  # heads with mean square ~1e-6, where the norm's eps matters (unless a bias dominates)
    bias = randn(rng, qkv.shape[1]) if with_bias else None
    q_norm, k_norm = (randn(rng, D), randn(rng, D)) if with_norm else (None, None)
    q_out = np.empty((T, Hq, D), np.float32)
    k_cache = np.full((Hkv, S, D), np.nan, np.float32)
    v_cache = np.full((Hkv, S, D), np.nan, np.float32)
    rope_qkv(qkv, bias, q_norm, k_norm, EPS, cos, sin, start_pos, Hq, Hkv, q_out, k_cache, v_cache)

    x = qkv.astype(np.float64) + (bias if with_bias else 0.0)
    q = x[:, :Hq * D].reshape(T, Hq, D)
    k = x[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D)
    v = x[:, (Hq + Hkv) * D:].reshape(T, Hkv, D)
    if with_norm:
        q, k = ref_rmsnorm(q, q_norm), ref_rmsnorm(k, k_norm)
    pos = start_pos + np.arange(T)
    rows = slice(start_pos, start_pos + T)
    assert_close(q_out, ref_rope(q, pos, cos, sin))
    assert_close(k_cache[:, rows], ref_rope(k, pos, cos, sin).transpose(1, 0, 2))
    assert_close(v_cache[:, rows], v.transpose(1, 0, 2))
    # Only this chunk's cache rows are written.
    assert np.isnan(k_cache[:, :start_pos]).all() and np.isnan(k_cache[:, start_pos + T:]).all()
    assert np.isnan(v_cache[:, :start_pos]).all() and np.isnan(v_cache[:, start_pos + T:]).all()


@pytest.mark.parametrize("T,I", [(1, 1000), (9, 5)])
def test_silu_mul(rng, T, I):
    gate_up = randn(rng, T, 2 * I, scale=3.0)
    gate_up[0, :3] = [-100.0, 100.0, 0.0]  # exp overflow must give silu -> -0, not NaN
    out = np.empty((T, I), np.float32)
    silu_mul(gate_up, out)
    g, u = gate_up[:, :I].astype(np.float64), gate_up[:, I:].astype(np.float64)
    assert_close(out, g / (1.0 + np.exp(-g)) * u)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("T,Hq,Hkv,D,start_pos", [
    (37, 7, 1, 64, 0),     # GQA 7, three query blocks (the last partial), keys < one tile
    (150, 6, 6, 8, 29),    # GQA 1, D 8, start_pos > 0, 179 keys = 2 tiles + a partial one
    (1, 14, 2, 64, 70),    # a single query deep into the cache
    (20, 4, 2, 64, 100),   # chunked prefill: every query crosses tile boundaries at a different key
])
def test_prefill_attention(rng, driver, T, Hq, Hkv, D, start_pos):
    q, k, v = make_attention(rng, T, Hq, Hkv, D, start_pos, S=start_pos + T + 5)
    out = np.empty_like(q)
    prefill_attention(q, k, v, start_pos, D ** -0.5, out)
    assert_close(out, ref_attention(q, k, v, start_pos, D ** -0.5))


@pytest.mark.parametrize("Hq,Hkv,D,length", [(7, 1, 64, 1), (6, 6, 8, 1000), (14, 2, 64, 77), (6, 2, 64, 129)])
def test_decode_attention(rng, driver, Hq, Hkv, D, length):
    q, k, v = make_attention(rng, 1, Hq, Hkv, D, length - 1, S=length + 7)
    out = np.empty((Hq, D), np.float32)
    decode_attention(q[0], k, v, length, D ** -0.5, out)
    assert_close(out, ref_attention(q, k, v, length - 1, D ** -0.5)[0])


def test_argmax(rng):
    logits = randn(rng, 1000)
    logits[[417, 800]] = 50.0  # a tie: the lowest index wins, as on the GPU
    assert argmax(logits) == 417 and type(argmax(logits)) is int


def test_wrappers_reject_out_of_range_positions(rng):
    # Numba does not bounds-check, so these checks are all that stops a write past the cache.
    q, k, v = make_attention(rng, 4, 2, 1, 8, 0, S=4)
    with pytest.raises(ValueError):
        prefill_attention(q, k, v, 1, 1.0, np.empty_like(q))
    with pytest.raises(ValueError):
        decode_attention(q[0], k, v, 5, 1.0, np.empty_like(q[0]))
    cos, sin = rope_tables(4, 8)
    with pytest.raises(ValueError):
        rope_qkv(randn(rng, 2, 32), None, None, None, EPS, cos, sin, 3, 2, 1, np.empty((2, 2, 8), np.float32), k, v)


def test_tests_can_fail(rng):
    """The test data tell apart the mistakes these kernels are prone to: each wrong variant misses the tolerance."""
    q, k, v = make_attention(rng, 20, 14, 2, 8, 6, S=26)  # GQA 7 over 2 kv heads, so a wrong mapping shows
    out = np.empty_like(q)
    prefill_attention(q, k, v, 6, 8 ** -0.5, out)
    with pytest.raises(AssertionError):  # missing causal mask (keys beyond the query are finite here)
        assert_close(out, ref_attention(q, k, v, 6, 8 ** -0.5, causal=False))
    with pytest.raises(AssertionError):  # GQA heads interleaved (h % Hkv) instead of grouped (h // group)
        assert_close(out, ref_attention(q, k, v, 6, 8 ** -0.5, kv_head=lambda h: h % 2))

    T, D, start_pos = 3, 8, 4
    cos, sin = rope_tables(8, D)
    qkv = randn(rng, T, 3 * D)
    q_out, kc, vc = np.empty((T, 1, D), np.float32), np.zeros((1, 8, D), np.float32), np.zeros((1, 8, D), np.float32)
    rope_qkv(qkv, None, None, None, EPS, cos, sin, start_pos, 1, 1, q_out, kc, vc)
    x = qkv[:, None, :D].astype(np.float64)
    pos = start_pos + np.arange(T)
    gptj = x.copy()  # interleaved pairs (2i, 2i+1) instead of rotate_half's (i, i + D/2)
    gptj[..., 0::2] = x[..., 0::2] * cos[pos][:, None] - x[..., 1::2] * sin[pos][:, None]
    gptj[..., 1::2] = x[..., 1::2] * cos[pos][:, None] + x[..., 0::2] * sin[pos][:, None]
    with pytest.raises(AssertionError):
        assert_close(q_out, gptj)
    with pytest.raises(AssertionError):  # rotated at t instead of start_pos + t
        assert_close(q_out, ref_rope(x, np.arange(T), cos, sin))
