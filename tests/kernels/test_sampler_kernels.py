"""The sampler's CPU twin (kernels/sampler.py): Philox known answers, Gumbel-max sampling (batch invariance,
greedy ties, NaN and -inf rows, vocab edge sizes), hand-computed goldens for every processing op, top-k/top-p
against a full-sort reference, logprobs, and chi-squared goodness of fit of the sampled tokens."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tests.tolerance import U32, assert_within, log_softmax_bound

from kernels import sampler as S
from tests.kernels import sampler_reference as R

INF = np.float32(np.inf)


# ---- Philox -----------------------------------------------------------------------------------------------------
KAT = [  # Random123 kat_vectors, philox4x32_10: counter, key -> output
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(ctr, key, want):
    got = R.philox4x32_10(np.array(ctr, np.uint64), np.array(key, np.uint64))
    assert tuple(int(w) for w in got) == want


def test_numba_philox_matches_numpy():
    rng = np.random.default_rng(0)
    for _ in range(50):
        c0, c1, k0, k1 = (int(v) for v in rng.integers(0, 2 ** 32, 4, dtype=np.uint64))
        c2 = _ & 1
        ref = R.philox4x32_10(np.array([c0, c1, c2, 0], np.uint64), np.array([k0, k1], np.uint64))
        got = S._philox(np.uint64(c0), np.uint64(c1), np.uint64(c2), np.uint64(k0), np.uint64(k1))
        assert tuple(int(w) for w in got) == tuple(int(w) for w in ref)


def test_uniform_is_exact_and_inside_the_open_interval():
    u = R.uniform_from_word(np.array([0, 511, 512, 0xffffffff], np.uint32))
    # (w >> 9) + 0.5 needs at most 24 significant bits: exact in fp32
    assert list(u.astype(np.float64)) == [0.5 * 2 ** -23, 0.5 * 2 ** -23, 1.5 * 2 ** -23, 1 - 2 ** -24]
    g = R.gumbel_from_uniform(u)
    assert np.all(np.isfinite(g)) and g.max() < S.G_MAX and g.min() > S.G_MIN


def group_word_bound(thr) -> int:
    """sampler.cu's bound on the Philox words of a group (step 3 of gumbel_sample), in NumPy: from
    t1 = fminf(thr, 1 - 2^-23) + 1 (fp32, rounded to nearest), W = (mantissa(t1) << 9) | 511."""
    f32 = np.float32
    t1 = np.fmin(f32(thr), f32(0.99999988)) + f32(1.0)  # fmin: NaN -> the other operand, as CUDA's fminf
    return ((int(np.array(t1, f32).view(np.uint32)) & 0x7FFFFF) << 9) | 511


@settings(max_examples=300, deadline=None)
@given(thr=st.floats(0, 4, width=32) | st.just(float("nan")),
       words=st.lists(st.integers(0, 2 ** 32 - 1), min_size=1, max_size=16))
def test_group_word_bound_never_drops_a_candidate(thr, words):
    """A Philox word whose uniform u is <= thr (the kernel's per-token candidate test) is <= the group bound W,
    so testing the 4 words of a group against W first can only skip groups with no candidate (exactness)."""
    W = group_word_bound(thr)
    k = int(min(thr, 1.0) * 2 ** 23) if thr == thr else 2 ** 23 - 1  # the words around u = thr as well
    near = [min(max(k + d, 0), 2 ** 23 - 1) << 9 | low for d in (-1, 0, 1) for low in (0, 511)]
    w = np.array(words + near, np.uint32)
    cand = (R.uniform_from_word(w) <= np.float32(thr)) | (thr != thr)  # NaN threshold (L = inf): every word
    assert (w[cand] <= W).all()


def coarse_group_may_pass(cw: int, W: int) -> bool:
    """sampler.cu's coarse test of a group of 4 tokens (step 3): one of the 4 bytes of its coarse word is
    <= W >> 24, by the bit trick for n = (W >> 24) + 1 <= 128, and always when n > 128."""
    n = (W >> 24) + 1
    return n > 128 or ((cw - n * 0x01010101) & 0xFFFFFFFF & ~cw & 0x80808080) != 0


@settings(max_examples=500, deadline=None)
@given(thr=st.floats(0, 1, width=32), cw=st.integers(0, 2 ** 32 - 1), fine=st.integers(0, 2 ** 32 - 1),
       at=st.integers(0, 3), byte=st.integers(0, 255))
def test_coarse_test_never_drops_a_candidate(thr, cw, fine, at, byte):
    """A group whose coarse bytes all exceed W >> 24 has every word > W, so skipping it before its fine call is
    exact; and the bit trick flags exactly the groups with such a byte (checked per byte, including a planted one)."""
    cw = (cw & ~(0xFF << 8 * at)) | (byte << 8 * at)
    W = group_word_bound(thr)
    low = [(cw >> 8 * b) & 0xFF for b in range(4)]
    assert coarse_group_may_pass(cw, W) == (any(b <= W >> 24 for b in low) or (W >> 24) >= 128)
    words = [(b << 24) | (fine >> 8) for b in low]
    if not coarse_group_may_pass(cw, W):
        assert all(w > W for w in words)


def test_noise_words_layout():
    """Token v's word: its coarse byte (call (v >> 4, pos, 1, 0)) on top of its fine word (call (v >> 2, pos, 0, 0));
    the vectorised reference and the Numba scalar agree, and 16 tokens share one coarse call."""
    seed, pos = 2 ** 40 + 9, 321
    v = np.arange(64)
    words = R.noise_words(seed, pos, v)
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint64)
    coarse = R.philox4x32_10(np.array([1, pos, 1, 0], np.uint64), key)  # tokens 16..31
    fine = R.philox4x32_10(np.array([5, pos, 0, 0], np.uint64), key)    # tokens 20..23
    for t in range(20, 24):
        assert int(words[t]) == ((int(coarse[1]) >> 8 * (t & 3) & 0xFF) << 24) | (int(fine[t & 3]) >> 8)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    assert [int(S._noise(int(t), np.uint64(pos), k0, k1)) for t in v] == [int(w) for w in words]


# ---- gumbel_sample ------------------------------------------------------------------------------------------------
def seed_words(seed):
    return np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)


def reference_sample(x, t, seed, pos):
    """Full-vocabulary reference: argmax(x / T + g) with g for every token (NumPy Philox)."""
    if t == 0:
        return int(np.argmax(x)) if not np.isnan(x).any() else -1
    a = x / np.float32(t) if t != 1 else x
    if np.isnan(a).any():
        return -1
    return int(np.argmax(a + R.gumbel_noise(seed, pos, np.arange(x.size))))


def sample(x, temps, seeds, positions):
    x = np.atleast_2d(np.asarray(x, np.float32))
    R = x.shape[0]
    out = np.full(R, -7, np.int32)
    S.gumbel_sample(x, np.asarray(temps, np.float32).reshape(R), np.asarray(seeds, np.uint32).reshape(R, 2),
                    np.asarray(positions, np.int32).reshape(R), out)
    return out


@pytest.mark.parametrize("V", [1, 999, 1024, 4097, 151936])
def test_sample_matches_full_reference(V):
    rng = np.random.default_rng(V)
    rows = 4
    x = (rng.standard_normal((rows, V)) * 2).astype(np.float32)
    temps = [0.0, 1.0, 0.7, 1.3]
    seeds = [2 ** 64 - 1 - V, 12345, 2 ** 40 + 7, 0]
    pos = [0, 5, 2 ** 31 - 1, 77]
    out = sample(x, temps, [seed_words(s) for s in seeds], pos)
    for r in range(rows):
        assert out[r] == reference_sample(x[r], temps[r], seeds[r], pos[r])
        assert 0 <= out[r] < V


def test_batch_invariance():
    rng = np.random.default_rng(1)
    V = 5000
    x = (rng.standard_normal((16, V)) * 3).astype(np.float32)
    temps = rng.choice([0.0, 1.0, 0.5], 16).astype(np.float32)
    temps[7] = 0.9
    seeds = np.stack([seed_words(int(s)) for s in rng.integers(0, 2 ** 63, 16)])
    pos = rng.integers(0, 10000, 16).astype(np.int32)
    batch = sample(x, temps, seeds, pos)
    alone = sample(x[7:8], temps[7:8], seeds[7:8], pos[7:8])
    assert batch[7] == alone[0]
    # and the noise depends on (seed, pos, v) only: a different position gives a different draw stream
    draws = {int(sample(x[7:8], [5.0], seeds[7:8], [p])[0]) for p in range(20)}
    assert len(draws) > 1


def test_greedy_ties_lowest_index_and_nan_rows():
    x = np.array([[1, 5, 3, 5, 5], [0, 0, 0, 0, 0], [1, np.nan, 9, 2, 3], [np.nan] * 5], np.float32)
    out = sample(x, [0, 0, 0, 1.0], [seed_words(1)] * 4, [0] * 4)
    assert list(out) == [1, 0, -1, -1]
    assert sample(x[2:3], [0.8], [seed_words(3)], [4])[0] == -1  # a NaN in a random row too


@pytest.mark.parametrize("t", [0.0, 1.0, 0.3, 2.5])
def test_all_neg_inf_but_one(t):
    for V, hot in [(1, 0), (999, 998), (4097, 4096), (151936, 77777)]:
        x = np.full((1, V), -INF)
        x[0, hot] = -50.0
        for p in range(5):
            assert sample(x, [t], [seed_words(9)], [p])[0] == hot
    assert sample(np.full((1, 10), -INF), [t], [seed_words(9)], [0])[0] == 0  # all -inf: in range


# ---- goldens for the processing ops -----------------------------------------------------------------------------
def rows(*r):
    return np.array(r, np.float32)


def test_temperature_golden():
    x = rows([1.0, 2.0, -4.0], [1.0, 2.0, -4.0], [1.0, 2.0, -4.0])
    S.temperature_min_p(x, np.array([2.0, 1.0, 0.0], np.float32), np.zeros(3, np.float32))
    # row 0: [1, 2, -4] / 2 = [0.5, 1, -2]; T = 1 and T = 0 (greedy) rows are untouched
    assert x.tolist() == [[0.5, 1.0, -2.0], [1.0, 2.0, -4.0], [1.0, 2.0, -4.0]]


def test_min_p_golden():
    x = rows([0.0, -1.0, -3.0], [0.0, -1.0, -3.0], [0.0, -1.0, -3.0])
    S.temperature_min_p(x, np.array([1.0, 0.5, 0.0], np.float32), np.full(3, 0.2, np.float32))
    # p / p_max = exp(x - max): row 0 [1, 0.368, 0.0498]: >= 0.2 keeps tokens 0, 1 (threshold log 0.2 = -1.609)
    # row 1 tempered first: [0, -2, -6] -> exp = [1, 0.135, 0.0025]: keeps token 0 only
    # row 2 is greedy: min_p does not apply
    assert x.tolist() == [[0.0, -1.0, -INF], [0.0, -INF, -INF], [0.0, -1.0, -3.0]]


def topkp(x, k, p):
    x = np.atleast_2d(np.array(x, np.float32))
    S.top_k_top_p(x, np.array(k, np.int32).reshape(-1), np.array(p, np.float32).reshape(-1))
    return x


def kept(x):
    return [int(i) for i in np.flatnonzero(x[0] > -INF)]


def test_top_k_golden_with_tie():
    x = [[3.0, 1.0, 2.0, 2.0, 0.0]]
    # sorted: 3, 2, 2, 1, 0. k = 3: 3rd largest 2 -> keep {3, 2, 2}; k = 2: 2nd largest is 2, its tie is kept too
    assert kept(topkp(x, 3, 1.0)) == [0, 2, 3]
    assert kept(topkp(x, 2, 1.0)) == [0, 2, 3]
    assert kept(topkp(x, 1, 1.0)) == [0]
    assert topkp(x, 4, 1.0).tolist() == [[3.0, 1.0, 2.0, 2.0, -INF]]  # survivors keep their values
    assert kept(topkp(x, 0, 1.0)) == kept(topkp(x, 5, 1.0)) == kept(topkp(x, -1, 1.0)) == [0, 1, 2, 3, 4]


def test_top_p_golden_boundary_kept():
    x = [np.log([0.5, 0.3, 0.15, 0.05])]
    # mass strictly above each token: 0, 0.5, 0.8, 0.95 -> kept iff < top_p
    assert kept(topkp(x, 0, 0.7)) == [0, 1]        # token 1 crosses 0.7 (0.5 -> 0.8): the boundary token is kept
    assert kept(topkp(x, 0, 0.85)) == [0, 1, 2]
    assert kept(topkp(x, 0, 0.45)) == [0]          # the max is always kept
    assert kept(topkp(x, 0, 0.999)) == [0, 1, 2, 3]


def test_top_p_golden_tie_at_boundary():
    x = [np.log([0.4, 0.2, 0.2, 0.1, 0.1])]
    # above: 0, 0.4, 0.4, 0.8, 0.8. top_p 0.5: the boundary value 0.2 is kept with its tie
    assert kept(topkp(x, 0, 0.5)) == [0, 1, 2]
    assert kept(topkp(x, 0, 0.3)) == [0]
    assert kept(topkp(x, 0, 0.85)) == [0, 1, 2, 3, 4]


def test_top_k_then_top_p_renormalises():
    x = [np.log([0.4, 0.3, 0.2, 0.1])]
    # top_p 0.75 alone: above = 0, 0.4, 0.7, 0.9 -> keeps {0, 1, 2}
    assert kept(topkp(x, 0, 0.75)) == [0, 1, 2]
    # top-k 3 first: survivors .4 .3 .2 renormalised by 0.9 -> above = 0, 0.444, 0.778 -> keeps {0, 1}
    assert kept(topkp(x, 3, 0.75)) == [0, 1]


def test_penalties_golden():
    base = [2.0, -2.0, 1.0, 0.5]
    # tokens 0, 1 occur in the prompt only (count 0), token 3 twice in the output; token 2 nowhere
    off, tok, cnt = np.array([0, 3], np.int32), np.array([0, 1, 3], np.int32), np.array([0, 0, 2], np.int32)

    def run(rep, freq, pres):
        x = rows(base)
        S.apply_penalties(x, off, tok, cnt, np.float32([rep]), np.float32([freq]), np.float32([pres]))
        return x[0]

    # repetition 2: positive / 2, negative * 2: [2/2, -2*2, 1 (untouched), 0.5/2]
    assert run(2.0, 0.0, 0.0).tolist() == [1.0, -4.0, 1.0, 0.25]
    # frequency 0.1: token 3 -= 0.1 * 2 -> 0.3; prompt-only tokens untouched
    # float32 0.1 (u * 0.1 * 2 after the exact * 2), then 0.5 - 0.2 rounded (u * 0.3); the rest exact
    assert_within(run(1.0, 0.1, 0.0), [2.0, -2.0, 1.0, 0.3], U32 * np.array([0, 0, 0, 0.2 + 0.3]))
    # presence 0.5: token 3 -= 0.5 once -> 0.0
    assert run(1.0, 0.0, 0.5).tolist() == [2.0, -2.0, 1.0, 0.0]
    # all three, in vLLM's order: 0.5 / 2 = 0.25, - 0.2 = 0.05, - 0.5 = -0.45
    # 0.5 / 2 and 2 * 2 exact; float32 0.1 (u * 0.2), the two subtractions rounded (u * 0.05, u * 0.45)
    assert_within(run(2.0, 0.1, 0.5), [1.0, -4.0, 1.0, -0.45], U32 * np.array([0, 0, 0, 0.2 + 0.05 + 0.45]))


def test_logit_bias_and_bans_golden():
    x = np.zeros((3, 4), np.float32)
    # row 0: bias {1: +2.5, 3: -1}; row 1: no entries; row 2: ban token 2 (-inf) and bias token 0 by +1
    off = np.array([0, 2, 2, 4], np.int32)
    tok = np.array([1, 3, 2, 0, 99], np.int32)  # capacity beyond offsets[-1] is ignored
    val = np.array([2.5, -1.0, -np.inf, 1.0, 5.0], np.float32)
    S.add_entries(x, off, tok, val)
    assert x.tolist() == [[0.0, 2.5, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, -INF, 0.0]]


# ---- top_k_top_p against a full-sort reference ----------------------------------------------------------------
def reference_top_k_top_p(row, k, p):
    V = row.size
    keep = np.ones(V, bool)
    if 0 < k < V:
        keep = row >= np.sort(row)[::-1][k - 1]
    if p < 1:
        m = row.max()
        w = np.where(keep, np.exp((row - m).astype(np.float64)), 0.0)
        w /= w.sum()
        vals = row[keep]
        for v in np.unique(vals):
            if w[row > v].sum() >= p:
                keep &= row != v
    return np.where(keep, row, -np.inf).astype(np.float32)


def test_top_k_top_p_matches_sort_reference():
    rng = np.random.default_rng(5)
    for trial in range(60):
        V = int(rng.choice([7, 100, 1000, 5000]))
        ints = trial % 2 == 0  # integer logits make ties
        row = (rng.integers(-6, 6, V) if ints else rng.standard_normal(V) * 3).astype(np.float32)
        k = int(rng.choice([0, -1, 1, 2, 5, 50, V - 1, V]))
        p = float(rng.choice([1.0, 0.9, 0.5, 0.1, np.float32(rng.uniform(0.01, 0.99))]))
        got = topkp(row[None], k, p)[0]
        np.testing.assert_array_equal(got, reference_top_k_top_p(row, k, np.float32(p)), err_msg=f"k={k} p={p}")


# ---- logprobs ---------------------------------------------------------------------------------------------------
def test_logprobs_against_reference():
    rng = np.random.default_rng(3)
    x = (rng.integers(-5, 5, (4, 300))).astype(np.float32)  # many ties
    x[2] = rng.standard_normal(300).astype(np.float32) * 4
    sampled = np.array([0, 17, 299, -1], np.int32)
    n = 6
    ids, lp = np.zeros((4, n), np.int32), np.zeros((4, n), np.float32)
    slp, rank = np.zeros(4, np.float32), np.zeros(4, np.int32)
    S.logprobs(x, sampled, n, ids, lp, slp, rank)
    for r in range(3):
        ref = x[r].astype(np.float64) - np.log(np.exp(x[r].astype(np.float64)).sum())
        order = sorted(range(300), key=lambda i: (-x[r, i], i))[:n]
        assert ids[r].tolist() == order
        tol = log_softmax_bound(x[r])  # float32 x - max, exp, log(float64 sum) to float32, two subtractions
        assert_within(lp[r], ref[order], tol)
        assert_within(slp[r], ref[sampled[r]], tol)
        assert rank[r] == np.count_nonzero(x[r] >= x[r, sampled[r]])
    # n = 0 and n > V
    S.logprobs(x[:, :3], sampled.clip(0, 2), 0, np.zeros((4, 0), np.int32), np.zeros((4, 0), np.float32), slp, rank)
    ids5, lp5 = np.zeros((1, 5), np.int32), np.zeros((1, 5), np.float32)
    S.logprobs(rows([1.0, 3.0]), np.array([1], np.int32), 5, ids5, lp5, slp[:1], rank[:1])
    assert ids5.tolist() == [[1, 0, -1, -1, -1]] and rank[0] == 1


# ---- chi-squared goodness of fit --------------------------------------------------------------------------------
def chi2_critical(df, z=3.719):
    """Upper p = 1e-4 point of chi-squared(df), Wilson-Hilferty: df * (1 - 2/(9 df) + z sqrt(2/(9 df)))^3 with
    z = 3.719 the standard normal's 1 - 1e-4 quantile."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def chi2_check(tokens, probs):
    """tokens drawn from probs: no token of probability 0, and chi-squared over bins of expected count >= 5
    (the rest pooled) below the p = 1e-4 critical value."""
    n = tokens.size
    counts = np.bincount(tokens, minlength=probs.size)
    assert counts[probs == 0].sum() == 0, "a masked token was drawn"
    exp = probs * n
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if exp[~big].sum() > 0:
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_b, exp_b = np.array(obs_b, float), np.array(exp_b, float)
    stat = ((obs_b - exp_b) ** 2 / exp_b).sum()
    df = obs_b.size - 1
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} >= critical {chi2_critical(df):.1f} (df {df})"


def test_chi2_critical_value():
    # chi-squared(100) upper 1e-4 point is 161.3 (tables); Wilson-Hilferty gives it to ~0.3
    assert abs(chi2_critical(100) - 161.3) < 0.5


@pytest.mark.parametrize("case", ["temperature", "top_k", "top_p", "min_p"])
def test_chi2_sampling(case):
    rng = np.random.default_rng(11)
    V, N = 1000, 20000
    x = (rng.standard_normal(V) * 1.5).astype(np.float32)[None]
    t = 0.7
    if case == "temperature":
        probs = R.softmax_rows(x / np.float32(t))[0]
        logits, temp = x, t
    else:
        proc = x.copy()
        S.temperature_min_p(proc, np.float32([t]), np.float32([0.1 if case == "min_p" else 0.0]))
        if case != "min_p":
            S.top_k_top_p(proc, np.int32([50 if case == "top_k" else 0]), np.float32([0.8 if case == "top_p" else 1]))
        probs = R.softmax_rows(proc)[0]
        assert (probs == 0).sum() > 100  # the filter masked something
        logits, temp = proc, 1.0
    tokens = sample(np.broadcast_to(logits, (N, V)), np.full(N, temp), np.broadcast_to(seed_words(2024), (N, 2)),
                    np.arange(N))
    chi2_check(tokens, probs)


def test_cpu_backend_exposes_the_ops():
    from toolkit.backends.cpu import CpuBackend

    be = CpuBackend()
    x = rows([0.0, 1.0, 2.0])
    y = np.empty_like(x)
    be.to_fp32(x, y)
    be.top_k_top_p(y, np.int32([1]), np.float32([1.0]))
    out = np.zeros(1, np.int32)
    be.gumbel_sample(y, np.float32([1.0]), seed_words(5)[None], np.int32([0]), out)
    assert out[0] == 2 and y.tolist() == [[-INF, -INF, 2.0]]
