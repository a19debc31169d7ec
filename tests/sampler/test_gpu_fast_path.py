"""The fast path on the GPU (kernels/sampler.cu filter_sample, reading bf16/fp16 logits in place): token for token
the GPU FP32 path's (one threshold rule, fixed-point top-p masses, the same Philox noise), and the CPU twin's on
the same values (up to float-rounding ties of logf/expf between the devices); a χ² test of its draws."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402
from tests.sampler.fast_cases import (CHI2, assert_follows, chi2_case, draw, logits_rows, states_for,  # noqa: E402
                                      top_tokens)
from tests.sampler.test_fast_path import KINDS  # noqa: E402
from toolkit.backends.cpu import CpuBackend  # noqa: E402

pytestmark = pytest.mark.gpu
V_BIG = 151936


def backend(dtype):
    from toolkit.backends.cuda import CudaBackend

    return CudaBackend(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("B,V", [(128, V_BIG), (32, V_BIG), (1, V_BIG), (26, 4099), (13, 17)])
def test_gpu_fast_equals_gpu_fp32(dtype, kind, B, V):
    rng = np.random.default_rng(V + B + KINDS.index(kind))
    x = rounded(logits_rows(rng, kind, B, V), dtype)
    states = states_for(rng, B, V, top_tokens(x))
    be, logits = backend(dtype), dev(x, dtype)
    before = logits.copy()
    for pos in (0, 12345):
        np.testing.assert_array_equal(draw(be, logits, states, True, pos), draw(be, logits, states, False, pos))
    assert bool((logits.view('uint16') == before.view('uint16')).all())  # only reads the logits (bits: NaN != NaN)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_long_history_stays_exact(dtype):
    """Rows whose history is longer than filter_sample's shared memory holds (HIST_CAP entries) keep it in the
    global workspace, at their CSR starts' sum: still the FP32 path's tokens, beside rows that fit."""
    from kernels.sampler import HIST_CAP
    from toolkit.engine import SamplingParams
    from toolkit.sampler.state import RequestSampling

    rng = np.random.default_rng(11)
    B, V = 6, V_BIG
    x = rounded(logits_rows(rng, "llm", B, V), dtype)
    states = []
    for b in range(B):
        p = SamplingParams(temperature=0.8, top_k=40 if b % 3 else 0, top_p=0.95, repetition_penalty=1.1,
                           frequency_penalty=0.2, logit_bias={int(top_tokens(x)[b][0]): -3.0},
                           seed=int(rng.integers(0, 2 ** 63)))
        n = HIST_CAP + 700 if b % 2 == 0 else 40  # long rows, each in a different place of the CSR arrays
        prompt = np.concatenate([top_tokens(x)[b], rng.choice(V, n, replace=False)])[:n].tolist()
        states.append(RequestSampling(p, prompt, V, p.seed, p.stop_token_ids, []))
    be, logits = backend(dtype), dev(x, dtype)
    for pos in (0, 777):
        np.testing.assert_array_equal(draw(be, logits, states, True, pos, max_context=4096),
                                      draw(be, logits, states, False, pos, max_context=4096))


@pytest.mark.parametrize("B,V", [(128, V_BIG), (26, 4099)])
def test_gpu_fast_matches_cpu_twin(B, V):
    """Same values, same rule: the GPU and the CPU twin agree except where expf / logf round differently at a
    boundary or between two keys (rare: under 1% of rows)."""
    rng = np.random.default_rng(3)
    x = rounded(logits_rows(rng, "llm", B, V), "bfloat16")
    states = states_for(rng, B, V, top_tokens(x))
    gpu = draw(backend("bfloat16"), dev(x, "bfloat16"), states, True)
    cpu = draw(CpuBackend(), x, states, True)
    greedy = np.array([s.greedy for s in states])
    np.testing.assert_array_equal(gpu[greedy], cpu[greedy])
    assert (gpu != cpu).mean() <= 0.01, (gpu != cpu).sum()


@pytest.mark.parametrize("case", list(CHI2))
def test_chi2_gpu_fast_path(case):
    rng = np.random.default_rng(len(case))
    V, N, B = 60, 50000, 1000
    row = rounded((rng.standard_normal(V) * 1.5).astype(np.float32), "bfloat16")
    want, state = chi2_case(row, CHI2[case])
    be, logits = backend("bfloat16"), dev(np.repeat(row[None], B, axis=0), "bfloat16")
    counts = np.zeros(V)
    for start in range(0, N, B):
        counts += np.bincount(draw(be, logits, [state] * B, True, start), minlength=V)
    assert_follows(counts, want)
