"""The sampler inside the GPU engine: captured in the CUDA-graph decode step (graph and eager give the
same tokens for the same seeds, on both paths), the fast path bit-identical to the slow path on bf16
logits with no FP32 bytes, the model's logits buffer untouched, and the same seed drawing the same tokens
on the GPU as on the CPU twin. Skipped without a GPU."""
import numpy as np
import pytest

from toolkit.engine.build import build_engine
from toolkit.backends.cpu import CpuBackend
from toolkit.backends.cuda import CudaBackend
from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions
from toolkit.sampler.sampler import Sampler
from toolkit.sampler.state import RequestSampling
from toolkit.engine.timings import NullTimer

pytestmark = pytest.mark.gpu

MIXED = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=40, top_p=0.9),
         dict(temperature=0.9, min_p=0.05, repetition_penalty=1.2), dict(temperature=1.0, frequency_penalty=0.5,
                                                                          presence_penalty=0.3, logit_bias={7: 1.5})]


@pytest.fixture(scope="module")
def eng():
    return build_engine(shape="tiny", device="cuda", dtype="bfloat16", max_context=256, kv_cache_tokens=256 * 40)


def run(eng, reqs, options):
    eng.set_options(options)
    rids = [eng.add_request(ids, p) for ids, p in reqs]
    got, steps = {r: [] for r in rids}, []
    while eng.has_unfinished():
        outs = eng.step()
        for o in outs:
            got[o.request_id].append(o.token)
        if outs and outs[0].step is not None:
            steps.append(outs[0].step)
    eng.set_options(EngineOptions())
    return [got[r] for r in rids], steps


def requests(eng, n, kinds, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(1, eng.cfg.vocab_size, rng.integers(3, 30)).tolist(),
             SamplingParams(max_tokens=10, seed=100 + i, ignore_eos=True, **kinds[i % len(kinds)]))
            for i in range(n)]


@pytest.mark.parametrize("n", [1, 5, 33])
def test_graph_equals_eager_with_the_sampler_inside(eng, n):
    reqs = requests(eng, n, MIXED)
    graph, steps = run(eng, reqs, EngineOptions(cuda_graphs=True))
    assert any(s.graph for s in steps)
    eager, _ = run(eng, reqs, EngineOptions(cuda_graphs=False))
    assert graph == eager


@pytest.mark.parametrize("graphs", [True, False])
def test_fast_path_bit_identical_to_slow_on_bf16(eng, graphs):
    reqs = requests(eng, 24, [dict(temperature=0.0), dict(temperature=1.0)], seed=1)
    fast, fsteps = run(eng, reqs, EngineOptions(cuda_graphs=graphs))
    slow, ssteps = run(eng, reqs, EngineOptions(cuda_graphs=graphs, sampler_fast_path=False))
    assert fast == slow
    assert {s.sampler_bytes for s in fsteps} == {0}
    assert all(s.sampler_bytes > 0 for s in ssteps)


def test_model_logits_untouched_and_gpu_matches_cpu_twin():
    gpu, cpu = CudaBackend("bfloat16"), CpuBackend()
    B, V = 16, 151936
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    logits = gpu.from_host(host)  # bf16 on the device
    exact = gpu.to_host(logits)  # the same values in fp32, for the CPU twin
    before = logits.copy()
    outs = {}
    for name, be, x in (("gpu", gpu, logits), ("cpu", cpu, exact)):
        be.bind_thread()
        sampler = Sampler(be, V, B, 64)
        states = [RequestSampling(SamplingParams(seed=i, **MIXED[i % len(MIXED)]), [1, 2, 3], V, 1000 + i)
                  for i in range(B)]
        toks = []
        for fast_on in (True, False):
            sb = sampler.prepare(states, np.arange(B, dtype=np.int32) + 5, np.ones(B, bool), B, fast_on)
            sampler.stage(sb)
            sampler.sample(x, sb, NullTimer())
            toks.append(be.ids_to_host(sampler.sampled, B).tolist())
        outs[name] = toks
    gpu.synchronize()
    assert bool((logits == before).all())  # the sampler never wrote into the model's buffer
    # The same seeds draw the same tokens on the GPU and on the CPU twin (float-rounding ties aside).
    same = np.mean(np.array(outs["gpu"]) == np.array(outs["cpu"]))
    assert same >= 0.95, outs


def test_filtered_probs_gpu_equals_cpu():
    """tests.sampler.probs.filtered_probs on CuPy bf16 logits (the CUDA kernels) and on the same values in NumPy
    (the twins): the same distributions, every filter and penalty active somewhere."""
    import cupy as cp

    from tests.gpu_arrays import dev, rounded
    from tests.sampler.probs import filtered_probs

    rng = np.random.default_rng(5)
    V = 4097
    params = [SamplingParams(seed=1, **kw) for kw in MIXED] + [SamplingParams(temperature=0.8, min_tokens=3,
                                                                              stop_token_ids=(11,))]
    B = len(params)
    x = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    hist = [([1, 2, 3, 7], [7, 9, 9]) for _ in range(B)]
    got = filtered_probs(dev(x, "bfloat16"), params, hist)
    want = filtered_probs(rounded(x, "bfloat16"), params, hist)
    assert isinstance(dev(x, "bfloat16"), cp.ndarray)
    assert np.allclose(got, want, atol=1e-5)
    assert ((got == 0) == (want == 0)).mean() > 0.999  # the same tokens masked (float-sum boundaries aside)
