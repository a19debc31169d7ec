"""Property tests: every CPU kernel twin against a float64 NumPy reference on random shapes and values.

(The attention twins have their own property test in test_cpu_kernels.py.) Values span several orders of
magnitude so the norm's eps, large activations and ties all come up; shapes include 1-row and odd widths.
"""
import numpy as np
from hypothesis import given, settings, strategies as st
from tests.kernels.test_cpu_kernels import EPS, assert_close, ref_rmsnorm, ref_rope, rope_tables
from tests.tolerance import U32, gemm_bound, rmsnorm_bound, rope_bound, silu_mul_bound

from kernels.activation import silu_mul
from kernels.embedding import embedding
from kernels.gemv import gemv
from kernels.rmsnorm import add_rmsnorm
from kernels.rope import rope_qkv

SEED = st.integers(0, 2 ** 32 - 1)
SCALE = st.sampled_from([1e-3, 1.0, 30.0])
FAST = settings(max_examples=25, deadline=None)


def rand(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


@FAST
@given(seed=SEED, T=st.integers(1, 9), H=st.integers(1, 300), scale=SCALE, with_x=st.booleans())
def test_add_rmsnorm(seed, T, H, scale, with_x):
    rng = np.random.default_rng(seed)
    x, res, w = rand(rng, (T, H), scale), rand(rng, (T, H), scale), rand(rng, H)
    want_res = res.astype(np.float64) + (x if with_x else 0.0)
    out = np.empty_like(res)
    add_rmsnorm(x if with_x else None, res, w, EPS, out)
    dr = U32 * np.abs(want_res) * with_x  # the float32 residual add rounds once
    assert_close(res, want_res, dr)
    assert_close(out, ref_rmsnorm(want_res, w), rmsnorm_bound(want_res, w, EPS, dr))


@FAST
@given(seed=SEED, T=st.integers(1, 7), inter=st.integers(1, 200), scale=st.sampled_from([0.1, 1.0, 50.0]))
def test_silu_mul(seed, T, inter, scale):
    rng = np.random.default_rng(seed)
    gu = rand(rng, (T, 2 * inter), scale)
    out = np.empty((T, inter), np.float32)
    silu_mul(gu, out)
    g, u = gu[:, :inter].astype(np.float64), gu[:, inter:].astype(np.float64)
    assert_close(out, g / (1 + np.exp(-g)) * u, silu_mul_bound(g, u))  # exact inputs: exp, add, divide, multiply


@FAST
@given(seed=SEED, T=st.integers(1, 20), V=st.integers(1, 50), H=st.integers(1, 40))
def test_embedding(seed, T, V, H):
    rng = np.random.default_rng(seed)
    table, ids = rand(rng, (V, H)), rng.integers(0, V, T).astype(np.int32)
    out = np.empty((T, H), np.float32)
    embedding(ids, table, out)
    np.testing.assert_array_equal(out, table[ids])


@FAST
@given(seed=SEED, M=st.integers(1, 4), N=st.integers(1, 100), K=st.integers(1, 300), scale=SCALE)
def test_gemv(seed, M, N, K, scale):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, (M, K), scale), rand(rng, (N, K))
    out = np.empty((M, N), np.float32)
    gemv(x, w, out)
    assert_close(out, x.astype(np.float64) @ w.T.astype(np.float64), gemm_bound(x, w))  # K products summed in float32


@FAST
@given(seed=SEED, T=st.integers(1, 6), Hkv=st.integers(1, 3), group=st.integers(1, 3),
       half=st.integers(1, 40), with_bias=st.booleans())
def test_rope_qkv(seed, T, Hkv, group, half, with_bias):
    rng = np.random.default_rng(seed)
    D, Hq = 2 * half, Hkv * group
    S = T + 8
    cos, sin = rope_tables(S, D)
    positions = rng.permutation(S)[:T].astype(np.int32)
    slots = rng.permutation(S)[:T].astype(np.int32)
    qkv = rand(rng, (T, (Hq + 2 * Hkv) * D))
    bias = rand(rng, qkv.shape[1]) if with_bias else None
    q_out = np.empty((T, Hq, D), np.float32)
    k_cache, v_cache = np.zeros((S, Hkv, D), np.float32), np.zeros((S, Hkv, D), np.float32)
    rope_qkv(qkv, bias, None, None, EPS, cos, sin, positions, slots, Hq, Hkv, q_out, k_cache, v_cache)
    x = qkv.astype(np.float64) + (bias if with_bias else 0.0)
    q = x[:, :Hq * D].reshape(T, Hq, D)
    k = x[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D)
    dx = U32 * np.abs(x) * with_bias  # the float32 bias add rounds once
    c, s = cos[positions][:, None], sin[positions][:, None]
    assert_close(q_out, ref_rope(q, positions, cos, sin), rope_bound(q, dx[:, :Hq * D].reshape(T, Hq, D), c, s))
    assert_close(k_cache[slots], ref_rope(k, positions, cos, sin),
                 rope_bound(k, dx[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D), c, s))
    assert_close(v_cache[slots], x[:, (Hq + Hkv) * D:].reshape(T, Hkv, D), dx[:, (Hq + Hkv) * D:].reshape(T, Hkv, D))
