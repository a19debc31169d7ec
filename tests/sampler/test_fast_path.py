"""The fast path's CPU twin (kernels/sampler.py filter_sample) against the FP32 path, token for token, on random
and adversarial rows for every setting; the threshold rule against a sort-based reference; and χ² goodness of fit
of the fast path's draws against filtered_probs."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels import sampler as S
from tests.sampler.fast_cases import CHI2, assert_follows, chi2_case, draw, logits_rows, states_for, top_tokens
from toolkit.backends.cpu import CpuBackend
from toolkit.sampler.params import SamplingParams
from toolkit.sampler.state import RequestSampling

BE = CpuBackend()
KINDS = ["llm", "flat", "ints", "equal", "huge", "neginf", "nan"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("V", [17, 300, 4099])
def test_fast_twin_equals_fp32_twin(kind, V):
    rng = np.random.default_rng(V + 7 * KINDS.index(kind))
    B = 26  # every setting twice
    x = logits_rows(rng, kind, B, V)
    before = x.copy()
    states = states_for(rng, B, V, top_tokens(x))
    for pos in (0, 1000):
        fast, slow = draw(BE, x, states, True, pos), draw(BE, x, states, False, pos)
        np.testing.assert_array_equal(fast, slow)
    if kind == "nan":
        assert fast[0] == -1
    assert np.array_equal(x, before, equal_nan=True)  # the fast path only reads the logits


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), V=st.integers(2, 200), k=st.integers(0, 60),
       p=st.floats(0.0078125, 1.0, width=32), mp=st.sampled_from([0.0, 0.0, 0.02, 0.3]),
       t=st.sampled_from([0.3, 0.8, 1.0, 1.7]), rep=st.sampled_from([1.0, 1.1, 2.0]),
       ints=st.booleans())
def test_fast_twin_equals_fp32_twin_property(seed, V, k, p, mp, t, rep, ints):
    """Penalised tokens all around the top-k boundary, integer logits for ties, any top-k / top-p / min-p."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-3, 3, (4, V)) if ints else rng.standard_normal((4, V)) * 2).astype(np.float32)
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=mp, repetition_penalty=rep, seed=seed)
    states = []
    for b in range(4):
        order = np.argsort(-x[b], kind="stable")
        around = order[max(0, k - 3):k + 3] if k else order[:6]
        states.append(RequestSampling(params, around.tolist(), V, seed + b))
    np.testing.assert_array_equal(draw(BE, x, states, True), draw(BE, x, states, False))


def reference_keep(z, k, p):
    """The rule (kernels/sampler.py) by sorting, in Python integers: the kept mask of a row of z values."""
    V = z.size
    keep = np.ones(V, bool)
    if 0 < k < V:
        keep = z >= np.sort(z)[::-1][k - 1]
    if p < 1:
        M = z.max()
        W = [0 if not keep[i] else 2 ** 32 if z[i] == M else 0 if z[i] - M < -25
             else int(np.rint(np.float64(np.float32(np.exp(z[i] - M))) * 2.0 ** 32)) for i in range(V)]
        S_ = sum(W)
        for i in range(V):
            above = sum(W[j] for j in range(V) if z[j] > z[i])
            keep[i] &= float(above) < float(np.float32(p)) * float(S_)
    return keep


def test_threshold_rule_against_sort_reference():
    rng = np.random.default_rng(5)
    for trial in range(80):
        V = int(rng.choice([5, 40, 300]))
        z = (rng.integers(-6, 6, V) if trial % 2 else rng.standard_normal(V) * 3).astype(np.float32)
        k = int(rng.choice([0, 1, 3, V - 1]))
        p = float(rng.choice([1.0, 0.9, 0.5, 0.05]))
        x = z[None].copy()
        S.top_k_top_p(x, np.int32([k]), np.float32([p]))
        np.testing.assert_array_equal(x[0] > -np.inf, reference_keep(z, k, p), err_msg=f"k={k} p={p}")


def test_top_p_sums_are_fixed_point():
    """A top-p boundary that float32 sums in different orders would place differently: the rule's integer sum
    keeps exactly the set the sorted reference does, whatever the vocabulary order."""
    z = np.log(np.float32([0.25, 0.25, 0.25, 0.125, 0.125])).astype(np.float32)
    for perm in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [3, 0, 4, 1, 2]):
        x = z[perm][None].copy()
        S.top_k_top_p(x, np.int32([0]), np.float32([0.75]))
        assert (x[0] > -np.inf).tolist() == reference_keep(z[perm], 0, 0.75).tolist() == [v < 3 for v in perm]


@pytest.mark.parametrize("case", list(CHI2))
def test_chi2_fast_path_against_filtered_probs(case):
    """Draws at many positions (independent noise) on the fast path follow filtered_probs (the FP32 path's ops)."""
    rng = np.random.default_rng(len(case))
    V, N = 60, 20000
    row = (rng.standard_normal(V) * 1.5).astype(np.float32)
    want, state = chi2_case(row, CHI2[case])
    logits = np.repeat(row[None], 1000, axis=0)
    counts = np.zeros(V)
    for start in range(0, N, 1000):
        counts += np.bincount(draw(BE, logits, [state] * 1000, True, start), minlength=V)
    assert_follows(counts, want)
