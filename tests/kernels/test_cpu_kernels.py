"""CPU twins (kernels/*.py) vs plain float64 NumPy references written the obvious way.

The twins are the reference for every CUDA kernel, so they are checked here against formulas that share no code
with them: attention gathers each sequence's keys through its block table and takes an explicit softmax over a
masked [q_len, seq_len] score matrix, RoPE is HF's rotate_half form, etc. The paged caches are NaN everywhere a
kernel must not read or write, and block tables are shuffled, so a wrong slot shows. Shapes cover ragged batches,
block sizes 1, 16 and 32, GQA ratios 1 and 7, D = 64 and 8, cached prefixes (seq_len > q_len), q_len 1, padding
rows, a query_start_loc that starts past row 0, and lengths that are not multiples of the attention tiles
(BK = 64 keys). test_tests_can_fail shows the data tell the likely bugs apart.
"""
import numpy as np
import pytest
from tests.paged_cache import paged_cache
from tests.tolerance import (U32, assert_within, attention_bound_for, gemm_bound, rmsnorm_bound, rope_bound,
                             silu_mul_bound, sum_bound)
from hypothesis import given, settings, strategies as st

import kernels.prefill_attention as prefill_mod
from kernels.activation import silu_mul
from kernels.decode_attention import decode_attention
from kernels.decode_attention_tc import decode_attention_tc, split_chunk as tc_split_chunk
from kernels.embedding import embedding
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm, add_rmsnorm_partials
from kernels.rope import rope_qkv

EPS = 1e-6
I32 = np.int32


def randn(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def assert_close(got, want, bound):
    """|got - want| <= bound elementwise; bound (scalar or elementwise) derived from the op's arithmetic with
    tests/tolerance.py, never a fixed number."""
    assert_within(got, want, bound)


def attention_atol(q, k, v, seq_lens, scale):
    """Attention against the float64 reference (tests/tolerance.py attention_bound: D-term scores, L-key sums)."""
    return attention_bound_for(q, k, v, seq_lens, scale)


def rope_tables(S, D, theta=10000.0):
    inv_freq = theta ** (-np.arange(0, D, 2) / D)
    angles = np.outer(np.arange(S), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def cdiv(a, b):
    return -(-a // b)


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


def seq_slots(table, L, bs):
    """Cache slots of keys 0..L-1 of one sequence."""
    j = np.arange(L)
    return table[j // bs].astype(np.int64) * bs + j % bs


def ref_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, bs, scale, out, causal=True, kv_head=None):
    """Returns a float64 copy of `out` with the rows of every sequence replaced by its attention: keys gathered
    through the block table, then a softmax over the full masked score matrix."""
    Hq = q.shape[1]
    group = Hq // k_cache.shape[1]
    kv_head = kv_head or (lambda h: h // group)
    res = out.astype(np.float64)
    for b, L in enumerate(seq_lens):
        rows = np.arange(qsl[b], qsl[b + 1])
        pos = L - len(rows) + np.arange(len(rows))
        if L == 0:
            res[rows] = 0.0
            continue
        slots = seq_slots(block_tables[b], L, bs)
        for h in range(Hq):
            K = k_cache[slots, kv_head(h)].astype(np.float64)
            V = v_cache[slots, kv_head(h)].astype(np.float64)
            scores = scale * q[rows, h].astype(np.float64) @ K.T
            if causal:
                scores[np.arange(L)[None, :] > pos[:, None]] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            res[rows, h] = (p / p.sum(axis=1, keepdims=True)) @ V
    return res


def make_cache(rng, seq_lens, Hkv, D, bs, spare=3):
    """paged_cache() with -1 past each sequence's blocks, as the engine may leave its tables."""
    return paged_cache(rng, list(seq_lens), Hkv, D, bs, spare, values=lambda shape: randn(rng, *shape), past_end="-1")


def make_batch(rng, seq_lens, q_lens, Hq, Hkv, D, bs, lead=0, trail=0):
    """A prefill batch: flat q with `lead` rows before and `trail` rows after the batch's own rows, out pre-filled
    with a sentinel so untouched rows can be checked."""
    k, v, tables = make_cache(rng, seq_lens, Hkv, D, bs)
    qsl = (lead + np.concatenate([[0], np.cumsum(q_lens)])).astype(I32)
    N = int(qsl[-1]) + trail
    q = randn(rng, N, Hq, D, scale=2.0)  # peaky-ish softmax, so a wrong mask or head shows clearly
    out = np.full_like(q, 7.0)
    return q, k, v, tables, qsl, np.array(seq_lens, I32), out


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
    assert_close(out, ref_rmsnorm(expect_r, w), rmsnorm_bound(expect_r, w, EPS))  # same residual: 3 roundings


@pytest.mark.parametrize("S,T,H", [(1, 3, 24), (4, 5, 384), (8, 2, 64)])
def test_add_rmsnorm_partials(rng, S, T, H):
    """split_down's norm: the partials added in slice order (fp32), then add_rmsnorm exactly."""
    parts, r0, w = np.stack([randn(rng, T, H) for _ in range(S)]), randn(rng, T, H, scale=3.0), randn(rng, H)
    x = parts[0].copy()
    for p in parts[1:]:
        x += p
    want_r, want = r0.copy(), np.empty((T, H), np.float32)
    add_rmsnorm(x, want_r, w, EPS, want)
    residual, out = r0.copy(), np.empty((T, H), np.float32)
    add_rmsnorm_partials(parts, residual, w, EPS, out)
    np.testing.assert_array_equal(residual, want_r)
    np.testing.assert_array_equal(out, want)
    r = r0 + parts.astype(np.float64).sum(0)
    # the residual: S float32 adds of r0 and the S partials (gamma_S of their magnitudes), then the norm's rounding
    assert_close(out, ref_rmsnorm(r, w), rmsnorm_bound(r, w, EPS, sum_bound(np.abs(r0) + np.abs(parts).sum(0), S)))
    with pytest.raises(ValueError):
        add_rmsnorm_partials(parts[:, :1], residual, w, EPS, out)


def test_cpu_backend_linear_partials(rng):
    """The CPU backend's linear_partials: slice s of K's product; the slices add up to the whole product."""
    from toolkit.backends.cpu import CpuBackend

    x, w = randn(rng, 3, 64), randn(rng, 24, 64)
    parts = np.empty((4, 3, 24), np.float32)
    CpuBackend().linear_partials(x, w, parts)
    # two float32 products of the same 16-term slice (the backend's and NumPy's, maybe ordered differently)
    assert_within(parts[2], x[:, 32:48] @ w[:, 32:48].T, gemm_bound(x[:, 32:48], w[:, 32:48], orders=2))
    # each side sums the 64 products in some order (slices of 16, then 3 adds: 19 roundings a term <= 64)
    assert_within(parts.sum(0), x @ w.T, gemm_bound(x, w, orders=2))


def test_add_rmsnorm_out_may_alias_x(rng):
    x, r0, w = randn(rng, 4, 32), randn(rng, 4, 32), randn(rng, 32)
    residual, out = r0.copy(), x.copy()
    add_rmsnorm(out, residual, w, EPS, out)
    r = r0.astype(np.float64) + x
    assert_close(out, ref_rmsnorm(r, w), rmsnorm_bound(r, w, EPS, U32 * np.abs(r)))  # the residual add rounds once


@pytest.mark.parametrize("Hq,Hkv,D,bs", [(6, 6, 64, 16), (7, 1, 8, 1), (14, 2, 64, 32)])
@pytest.mark.parametrize("with_bias,with_norm", [(False, False), (True, False), (False, True), (True, True)])
def test_rope_qkv(rng, Hq, Hkv, D, bs, with_bias, with_norm):
    # Three sequences in one flat step: a decode token deep into its sequence, a chunk past a cached prefix, a fresh
    # prompt; then a padding row (slot -1).
    starts, lens = [37, 5, 0], [1, 13, 4]
    positions = np.concatenate([s + np.arange(n) for s, n in zip(starts, lens)] + [[0]]).astype(I32)
    T = len(positions)
    num_slots = 3 * 64
    slot_mapping = rng.permutation(num_slots)[:T].astype(I32)  # any distinct slots: block layout is not rope's concern
    slot_mapping[-1] = -1
    cos, sin = rope_tables(64, D)
    qkv = randn(rng, T, (Hq + 2 * Hkv) * D)
    qkv[-2] *= 1e-3  # heads with mean square ~1e-6, where the norm's eps matters (unless a bias dominates)
    bias = randn(rng, qkv.shape[1]) if with_bias else None
    q_norm, k_norm = (randn(rng, D), randn(rng, D)) if with_norm else (None, None)
    q_out = np.empty((T, Hq, D), np.float32)
    k_cache = np.full((num_slots, Hkv, D), np.nan, np.float32)
    v_cache = np.full_like(k_cache, np.nan)
    rope_qkv(qkv, bias, q_norm, k_norm, EPS, cos, sin, positions, slot_mapping, Hq, Hkv, q_out, k_cache, v_cache)

    x = qkv.astype(np.float64) + (bias if with_bias else 0.0)
    q = x[:, :Hq * D].reshape(T, Hq, D)
    k = x[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D)
    v = x[:, (Hq + Hkv) * D:].reshape(T, Hkv, D)
    dq, dk, dv = (U32 * np.abs(a) * with_bias for a in (q, k, v))  # the float32 bias add rounds once
    if with_norm:  # the per-head norm over D (rmsnorm_bound), fed the rounded sums
        dq, dk = rmsnorm_bound(q, q_norm, EPS, dq), rmsnorm_bound(k, k_norm, EPS, dk)
        q, k = ref_rmsnorm(q, q_norm), ref_rmsnorm(k, k_norm)
    c, s = cos[positions][:, None], sin[positions][:, None]
    assert_close(q_out, ref_rope(q, positions, cos, sin), rope_bound(q, dq, c, s))  # the padding row's q too
    written = slot_mapping[:-1]
    assert_close(k_cache[written], ref_rope(k, positions, cos, sin)[:-1], rope_bound(k, dk, c, s)[:-1])
    assert_close(v_cache[written], v[:-1], dv[:-1])
    # Only the real tokens' slots are written.
    rest = np.setdiff1d(np.arange(num_slots), written)
    assert np.isnan(k_cache[rest]).all() and np.isnan(v_cache[rest]).all()


@pytest.mark.parametrize("op, M", [("gemm_skinny_rope", 5), ("gemv_rope", 4)])
def test_rope_projection_twins(rng, op, M):
    """The twins of the qkv projections with rope_qkv as their epilogue (gemm_skinny_rope, gemv_rope) against
    NumPy: x W^T + bias, rotated; K/V at the rows' slots, a padding row (slot -1) writing q only."""
    import kernels.gemm_skinny
    import kernels.gemv

    twin = getattr(kernels.gemm_skinny if op.startswith("gemm") else kernels.gemv, op)
    Hq, Hkv, D, Kin, num_slots = 4, 2, 16, 24, 40
    x, w, bias = randn(rng, M, Kin), randn(rng, (Hq + 2 * Hkv) * D, Kin), randn(rng, (Hq + 2 * Hkv) * D)
    positions = np.array([3, 0, 17, 9, 30], I32)[-M:]
    slots = np.array([7, 2, 31, -1, 11], I32)[-M:]
    cos, sin = rope_tables(32, D)
    q_out = np.empty((M, Hq, D), np.float32)
    k_cache = np.full((num_slots, Hkv, D), np.nan, np.float32)
    v_cache = k_cache.copy()
    twin(x, w, bias, cos, sin, positions, slots, Hq, Hkv, q_out, k_cache, v_cache)
    y = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    dy = gemm_bound(x, w) + U32 * np.abs(y)  # the K-term product, then the bias add
    q, k, v = (y[:, a * D:b * D].reshape(M, -1, D) for a, b in ((0, Hq), (Hq, Hq + Hkv), (Hq + Hkv, Hq + 2 * Hkv)))
    dq, dk, dv = (dy[:, a * D:b * D].reshape(M, -1, D) for a, b in ((0, Hq), (Hq, Hq + Hkv), (Hq + Hkv, Hq + 2 * Hkv)))
    c, s = cos[positions][:, None], sin[positions][:, None]
    assert_close(q_out, ref_rope(q, positions, cos, sin), rope_bound(q, dq, c, s))
    real = slots >= 0
    assert_close(k_cache[slots[real]], ref_rope(k, positions, cos, sin)[real], rope_bound(k, dk, c, s)[real])
    assert_close(v_cache[slots[real]], v[real], dv[real])
    assert np.isnan(np.delete(k_cache, slots[real], axis=0)).all()


@pytest.mark.parametrize("T,I", [(1, 1000), (9, 5)])
def test_silu_mul(rng, T, I):
    gate_up = randn(rng, T, 2 * I, scale=3.0)
    gate_up[0, :3] = [-100.0, 100.0, 0.0]  # exp overflow must give silu -> -0, not NaN
    out = np.empty((T, I), np.float32)
    silu_mul(gate_up, out)
    g, u = gate_up[:, :I].astype(np.float64), gate_up[:, I:].astype(np.float64)
    assert_close(out, g / (1.0 + np.exp(-g)) * u, silu_mul_bound(g, u))  # exact inputs: its own 4 roundings
    assert np.isfinite(out).all()


@pytest.mark.parametrize("seq_lens,q_lens,Hq,Hkv,D,bs,lead,trail", [
    ([37], [37], 7, 1, 64, 16, 0, 0),          # one prompt, GQA 7, keys < one tile
    # Ragged: a prefix of 29 (179 keys = 2 tiles + a partial one), a q_len 1 row at position 0, a chunk whose
    # every query crosses tile boundaries at a different key, a padding sequence; rows before and after the batch.
    ([179, 1, 120, 0], [150, 1, 20, 0], 6, 6, 8, 16, 3, 2),
    ([70, 33], [1, 33], 14, 2, 64, 1, 5, 0),   # block size 1; a single query deep into its sequence
    ([130, 65], [66, 65], 4, 2, 64, 32, 0, 4),  # block size 32
])
def test_prefill_attention(rng, driver, seq_lens, q_lens, Hq, Hkv, D, bs, lead, trail):
    q, k, v, tables, qsl, lens, out = make_batch(rng, seq_lens, q_lens, Hq, Hkv, D, bs, lead, trail)
    prefill_attention(q, k, v, tables, qsl, lens, bs, D ** -0.5, out)
    want = ref_attention(q, k, v, tables, qsl, lens, bs, D ** -0.5, out)
    assert_close(out, want, attention_atol(q, k, v, lens, D ** -0.5))
    assert (out[:lead] == 7.0).all() and (out[qsl[-1]:] == 7.0).all()  # rows outside the batch are untouched


@pytest.mark.parametrize("seq_lens,Hq,Hkv,D,bs", [
    ([1], 7, 1, 64, 16),
    ([1000, 0, 3, 129], 6, 6, 8, 16),  # a padding row (seq_len 0) among ragged lengths
    ([77, 64, 65], 14, 2, 64, 1),
    ([129, 0, 200], 6, 2, 64, 32),
])
def test_decode_attention(rng, driver, seq_lens, Hq, Hkv, D, bs):
    k, v, tables = make_cache(rng, seq_lens, Hkv, D, bs)
    B = len(seq_lens)
    q, out, lens = randn(rng, B, Hq, D, scale=2.0), np.full((B, Hq, D), 7.0, np.float32), np.array(seq_lens, I32)
    decode_attention(q, k, v, tables, lens, bs, D ** -0.5, out)
    assert_close(out, ref_attention(q, k, v, tables, np.arange(B + 1), lens, bs, D ** -0.5, out),
                 attention_atol(q, k, v, lens, D ** -0.5))
    assert (out[lens == 0] == 0.0).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lens=st.lists(st.integers(0, 700), min_size=1, max_size=4),
       n_splits=st.integers(1, 9), group=st.sampled_from([1, 7, 16]), bs=st.sampled_from([1, 16, 32]),
       pair_pass=st.booleans())
def test_decode_attention_tc_route(seed, lens, n_splits, group, bs, pair_pass):
    """The tensor-core kernels' route (splits, 64-key tiles, 16-key warp slices, or, in decode_attention_tc but not
    its _stream form, one 128-key pass of 32-key slices for a split of 2 tiles; each with its own online softmax,
    then the warps and the splits merged) covers every key once and gives the softmax of the reference."""
    rng = np.random.default_rng(seed)
    Hkv, D = 2, 16
    k, v, tables = make_cache(rng, lens, Hkv, D, bs)
    B, Hq = len(lens), Hkv * group
    q, out, seq = randn(rng, B, Hq, D, scale=2.0), np.full((B, Hq, D), 7.0, np.float32), np.array(lens, I32)
    decode_attention_tc(q, k, v, tables, seq, bs, D ** -0.5, out, n_splits, pair_pass)
    assert_close(out, ref_attention(q, k, v, tables, np.arange(B + 1), seq, bs, D ** -0.5, out),
                 attention_atol(q, k, v, seq, D ** -0.5))
    assert (out[seq == 0] == 0.0).all()
    chunk = tc_split_chunk(max(lens), n_splits)
    assert chunk % 64 == 0 and (max(lens) <= 256 or -(-max(lens) // chunk) <= n_splits)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 4), bs=st.sampled_from([1, 5, 16, 32]),
       Hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]), D=st.sampled_from([8, 16]),
       lead=st.integers(0, 3), parallel=st.booleans())
def test_attention_property(seed, B, bs, Hkv, group, D, lead, parallel):
    """Random ragged batches: prefill of (prefix, q_len) pairs and decode over the same caches match the reference."""
    rng = np.random.default_rng(seed)
    q_lens = rng.integers(0, 40, B)
    seq_lens = [int(n + rng.integers(0, 80)) if n else int(rng.integers(0, 2) * rng.integers(0, 80)) for n in q_lens]
    Hq = Hkv * group
    q, k, v, tables, qsl, lens, out = make_batch(rng, seq_lens, q_lens, Hq, Hkv, D, bs, lead, trail=2)
    old = prefill_mod.PARALLEL_MIN_MACS
    prefill_mod.PARALLEL_MIN_MACS = 0 if parallel else 1 << 62
    try:
        prefill_attention(q, k, v, tables, qsl, lens, bs, D ** -0.5, out)
        dq, dout = randn(rng, B, Hq, D), np.empty((B, Hq, D), np.float32)
        decode_attention(dq, k, v, tables, lens, bs, D ** -0.5, dout)
    finally:
        prefill_mod.PARALLEL_MIN_MACS = old
    assert_close(out, ref_attention(q, k, v, tables, qsl, lens, bs, D ** -0.5, out),
                 attention_atol(q, k, v, lens, D ** -0.5))
    assert (out[:lead] == 7.0).all() and (out[qsl[-1]:] == 7.0).all()
    assert_close(dout, ref_attention(dq, k, v, tables, np.arange(B + 1), lens, bs, D ** -0.5, dout),
                 attention_atol(dq, k, v, lens, D ** -0.5))


def test_whole_prefill_equals_chunked_equals_decode(rng):
    """Two sequences through rope_qkv + attention three ways, each into fresh NaN caches: whole prompts in one
    batched call, chunked prefill (later chunks attend the cached earlier ones), and one decode step per token
    (with a finished sequence kept as a padding row). All three must agree with each other and the reference."""
    Hq, Hkv, D, bs, L = 6, 2, 16, 16, [70, 45]
    width = (Hq + 2 * Hkv) * D
    cos, sin = rope_tables(128, D)
    qkv = [randn(rng, n, width) for n in L]
    tables = np.full((2, 6), -1, I32)
    tables[0, :5], tables[1, :3] = [7, 2, 9, 0, 4], [5, 1, 8]
    num_slots = 10 * bs

    def fresh():
        return np.full((num_slots, Hkv, D), np.nan, np.float32), np.full((num_slots, Hkv, D), np.nan, np.float32)

    def prefill(kc, vc, parts):
        """One batched step; parts: (sequence, first token, last token + 1). Returns q and the out rows per part."""
        x = np.concatenate([qkv[b][a:e] for b, a, e in parts])
        pos = np.concatenate([np.arange(a, e) for b, a, e in parts]).astype(I32)
        slots = np.concatenate([seq_slots(tables[b], e, bs)[a:] for b, a, e in parts]).astype(I32)
        q = np.empty((len(x), Hq, D), np.float32)
        rope_qkv(x, None, None, None, EPS, cos, sin, pos, slots, Hq, Hkv, q, kc, vc)
        qsl = np.concatenate([[0], np.cumsum([e - a for b, a, e in parts])]).astype(I32)
        out = np.empty_like(q)
        lens = np.array([e for b, a, e in parts], I32)
        prefill_attention(q, kc, vc, tables[[b for b, a, e in parts]], qsl, lens, bs, D ** -0.5, out)
        return q, np.split(out, qsl[1:-1])

    kc, vc = fresh()
    q_all, outs = prefill(kc, vc, [(0, 0, 70), (1, 0, 45)])
    whole = np.concatenate(outs)
    want = ref_attention(q_all, kc, vc, tables, np.array([0, 70, 115]), np.array(L), bs, D ** -0.5, whole)
    tol = attention_atol(q_all, kc, vc, L, D ** -0.5)  # every run rotates the same tokens: the same q, k, v bits
    assert_close(whole, want, tol)

    kc, vc = fresh()
    got = {0: [], 1: []}
    for parts in ([(0, 0, 30), (1, 0, 20)], [(0, 30, 31), (1, 20, 45)], [(0, 31, 70)]):
        for (b, _, _), o in zip(parts, prefill(kc, vc, parts)[1]):
            got[b].append(o)
    assert_close(np.concatenate(got[0] + got[1]), want, tol)

    kc, vc = fresh()
    got = {0: [], 1: []}
    for p in range(70):
        live = [True, p < L[1]]  # once sequence 1 is done it stays in the batch as a padding row
        x = np.stack([qkv[b][p] if live[b] else np.zeros(width, np.float32) for b in range(2)])
        pos = np.array([p if live[b] else 0 for b in range(2)], I32)
        slots = np.array([seq_slots(tables[b], p + 1, bs)[p] if live[b] else -1 for b in range(2)], I32)
        q = np.empty((2, Hq, D), np.float32)
        rope_qkv(x, None, None, None, EPS, cos, sin, pos, slots, Hq, Hkv, q, kc, vc)
        lens = np.array([p + 1 if live[b] else 0 for b in range(2)], I32)
        out = np.full_like(q, 7.0)
        decode_attention(q, kc, vc, tables, lens, bs, D ** -0.5, out)
        for b in range(2):
            if live[b]:
                got[b].append(out[b:b + 1])
            else:
                assert (out[b] == 0.0).all()
    assert_close(np.concatenate(got[0] + got[1]), want, tol)


def test_wrappers_reject_bad_inputs(rng):
    # Numba does not bounds-check, so these checks are all that stops a read or write past the cache.
    q, k, v, tables, qsl, lens, out = make_batch(rng, [20, 5], [4, 5], 2, 1, 8, 16)

    def prefill(**kw):
        a = dict(q=q, k_cache=k, v_cache=v, block_tables=tables, query_start_loc=qsl, seq_lens=lens, block_size=16,
                 scale=1.0, out=out)
        prefill_attention(**{**a, **kw})

    def decode(**kw):
        a = dict(q=q[:2], k_cache=k, v_cache=v, block_tables=tables, seq_lens=lens, block_size=16, scale=1.0,
                 out=out[:2])
        decode_attention(**{**a, **kw})

    prefill(), decode()  # the valid call works
    bad_table = tables.copy()
    bad_table[0, 1] = len(k) // 16  # one block past the cache
    for kw in (dict(seq_lens=np.array([20, 40], I32)),  # more keys than the table row holds
               dict(seq_lens=np.array([3, 5], I32)),    # q_len 4 > seq_len 3
               dict(block_tables=bad_table), dict(query_start_loc=np.array([0, 4, 10], I32)),
               dict(query_start_loc=qsl.astype(np.int64)), dict(seq_lens=lens[:1]), dict(out=out[:-1]),
               dict(block_size=0)):
        with pytest.raises(ValueError):
            prefill(**kw)
    for kw in (dict(block_tables=bad_table), dict(seq_lens=np.array([20, -1], I32)), dict(q=q[:3]),
               dict(seq_lens=lens.astype(np.int64)), dict(k_cache=k.astype(np.float64))):
        with pytest.raises(ValueError):
            decode(**kw)
    cos, sin = rope_tables(4, 8)
    qkv, q_out = randn(rng, 2, 32), np.empty((2, 2, 8), np.float32)
    kc, vc = np.full((8, 1, 8), np.nan, np.float32), np.full((8, 1, 8), np.nan, np.float32)
    for pos, slots in (([0, 4], [0, 1]), ([0, 1], [0, 8]), ([0, -1], [0, 1])):
        with pytest.raises(ValueError):
            rope_qkv(qkv, None, None, None, EPS, cos, sin, np.array(pos, I32), np.array(slots, I32), 2, 1,
                     q_out, kc, vc)
    assert np.isnan(kc).all()  # a rejected call writes nothing


def test_tests_can_fail(rng):
    """The test data tell apart the mistakes these kernels are prone to: each wrong variant misses the tolerance."""
    # GQA 7 over 2 kv heads, so a wrong mapping shows; a prefix, so queries see keys of earlier steps.
    q, k, v, tables, qsl, lens, out = make_batch(rng, [26, 9], [20, 9], 14, 2, 8, 4)
    prefill_attention(q, k, v, tables, qsl, lens, 4, 8 ** -0.5, out)
    ref = lambda **kw: ref_attention(q, k, v, tables, qsl, lens, 4, 8 ** -0.5, out, **kw)
    tol = attention_atol(q, k, v, lens, 8 ** -0.5)
    with pytest.raises(AssertionError):  # missing causal mask (keys beyond the query are finite here)
        assert_close(out, ref(causal=False), tol)
    with pytest.raises(AssertionError):  # GQA heads interleaved (h % Hkv) instead of grouped (h // group)
        assert_close(out, ref(kv_head=lambda h: h % 2), tol)
    with pytest.raises(AssertionError):  # queries placed at positions 0.. instead of after the cached prefix
        assert_close(out, ref_attention(q, k, v, tables, qsl, np.array([20, 9], I32), 4, 8 ** -0.5, out), tol)
    with pytest.raises(AssertionError):  # the two sequences' block tables swapped
        assert_close(out, ref_attention(q, k, v, tables[[1, 0]], qsl, lens, 4, 8 ** -0.5, out), tol)

    T, D = 3, 8
    cos, sin = rope_tables(8, D)
    qkv, pos = randn(rng, T, 3 * D), np.array([4, 5, 6], I32)
    q_out, kc, vc = np.empty((T, 1, D), np.float32), np.zeros((8, 1, D), np.float32), np.zeros((8, 1, D), np.float32)
    rope_qkv(qkv, None, None, None, EPS, cos, sin, pos, np.array([2, 0, 7], I32), 1, 1, q_out, kc, vc)
    x = qkv[:, None, :D].astype(np.float64)
    tol = rope_bound(x, 0.0, cos[pos][:, None], sin[pos][:, None])  # exact inputs: the rotation's own rounding
    gptj = x.copy()  # interleaved pairs (2i, 2i+1) instead of rotate_half's (i, i + D/2)
    gptj[..., 0::2] = x[..., 0::2] * cos[pos][:, None] - x[..., 1::2] * sin[pos][:, None]
    gptj[..., 1::2] = x[..., 1::2] * cos[pos][:, None] + x[..., 0::2] * sin[pos][:, None]
    with pytest.raises(AssertionError):
        assert_close(q_out, gptj, tol)
    with pytest.raises(AssertionError):  # rotated at the row index t instead of positions[t]
        assert_close(q_out, ref_rope(x, np.arange(T), cos, sin), tol)


# The small-batch projection twins: (module, projection, its SwiGLU form, most rows its kernel takes).
PROJECTION_TWINS = [("gemv", "gemv", "gemv_swiglu", 4), ("gemm_skinny", "gemm_skinny", "gemm_skinny_swiglu", 32)]


@pytest.mark.parametrize("mod, proj, _, max_rows", PROJECTION_TWINS)
def test_projection_twin(rng, mod, proj, _, max_rows):
    import importlib

    fn = getattr(importlib.import_module(f"kernels.{mod}"), proj)
    x, w = randn(rng, 3, 40), randn(rng, 24, 40)
    out = np.empty((3, 24), np.float32)
    fn(x, w, out)
    assert_within(out, x.astype(np.float64) @ w.T.astype(np.float64), gemm_bound(x, w))  # K = 40 terms, float32
    with pytest.raises(ValueError, match=proj):  # more rows than the CUDA kernel handles
        fn(randn(rng, max_rows + 1, 40), w, np.empty((max_rows + 1, 24), np.float32))


# The SwiGLU forms: the small-batch ones, and gemm_wg's (a decode step's rows: any count).
SWIGLU_TWINS = ([(mod, swiglu, M) for mod, _, swiglu, _ in PROJECTION_TWINS for M in (1, 4)]
                + [("gemm_wg", "gemm_wg_swiglu", M) for M in (1, 300)])


@pytest.mark.parametrize("mod, swiglu, M", SWIGLU_TWINS)
def test_projection_swiglu_twin(rng, mod, swiglu, M):
    """gate_up projection with SwiGLU as its epilogue, against its NumPy definition: silu(x Wg^T) * (x Wu^T)."""
    import importlib

    fn = getattr(importlib.import_module(f"kernels.{mod}"), swiglu)
    K, I = 40, 12
    x, w = randn(rng, M, K), randn(rng, 2 * I, K)
    out = np.empty((M, I), np.float32)
    fn(x, w, out)
    g, u = x.astype(np.float64) @ w[:I].T, x.astype(np.float64) @ w[I:].T
    tol = silu_mul_bound(g, u, gemm_bound(x, w[:I]), gemm_bound(x, w[I:]))  # K = 40 products, then silu_mul
    assert_within(out, g / (1 + np.exp(-g)) * u, tol)
    with pytest.raises(AssertionError):  # gate and up swapped
        assert_within(out, u / (1 + np.exp(-u)) * g, tol)
    with pytest.raises(ValueError, match=swiglu):
        fn(x, w, np.empty((M, 2 * I), np.float32))  # out sized like gate_up
