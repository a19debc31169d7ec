"""The sampler's CUDA kernels (kernels/sampler.cu via toolkit/backends/cuda_sampler.py) against their CPU twin
(kernels/sampler.py) at realistic shapes: B in {1, 32, 128}, V = 151,936 and small V, bf16 / fp16 / fp32 logits.

Inputs are rounded to the device dtype first, so the fp32 twin sees exactly the values the GPU sees. Sampled
tokens must be equal except where the two best keys are within 1e-5 relative (logf/log1pf vs the CPU's rounding:
such float-rounding ties are counted and must stay < 0.1%); greedy rows always equal. Processing ops: allclose
(rtol 1e-6) with identical -inf masks; top_k_top_p: identical masks except at exact float-sum boundaries of top-p.
Also: a CUDA-graph capture of the whole launch sequence replayed on new data, chi-squared with 100k draws, and
the fast path (bf16 read directly) giving the same tokens as the FP32 copy.
"""
import functools

import ml_dtypes
import numpy as np
import pytest

from kernels import sampler as S
from tests.kernels import sampler_reference as R

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402

pytestmark = pytest.mark.gpu

V_BIG = 151936
DTYPES = ["bfloat16", "float16", "float32"]
NEG_INF = np.float32(-np.inf)


@functools.lru_cache(maxsize=None)
def K(dtype):
    from toolkit.backends.cuda_sampler import CudaSamplerKernels

    return CudaSamplerKernels(dtype)


def llm_like(rng, B, V, spread=2.0):
    """A broad bulk plus a few dozen clearly preferred tokens, like a language model's logits."""
    x = rng.standard_normal((B, V)).astype(np.float32) * spread
    top = rng.integers(0, V, (B, min(V, 40)))
    np.put_along_axis(x, top, np.take_along_axis(x, top, 1) + rng.uniform(4, 14, top.shape).astype(np.float32), 1)
    return x


def params(rng, B):
    temps = rng.choice(np.float32([0.0, 1.0, 0.7, 1.5]), B)
    seeds = rng.integers(0, 2 ** 32, (B, 2), dtype=np.uint64).astype(np.uint32)
    pos = rng.integers(0, 2 ** 31 - 1, B).astype(np.int32)
    return temps, seeds, pos


def gpu_sample(x_dev, temps, seeds, pos, dtype):
    out = cp.full(x_dev.shape[0], -7, cp.int32)
    K(dtype).gumbel_sample(x_dev, cp.asarray(temps), cp.asarray(seeds), cp.asarray(pos), out)
    return cp.asnumpy(out)


def cpu_sample(x, temps, seeds, pos):
    out = np.full(x.shape[0], -7, np.int32)
    S.gumbel_sample(x, temps, seeds, pos, out)
    return out


def near_tie(x, t, seeds, pos, a, b):
    """Are tokens a and b's keys within 1e-5 relative (a float-rounding tie)?"""
    seed = int(seeds[0]) | (int(seeds[1]) << 32)
    g = R.gumbel_noise(seed, int(pos), np.array([a, b]))
    xa = x[[a, b]] / np.float32(t) if t != 1 else x[[a, b]]
    ka, kb = (xa + g).astype(np.float64)
    return abs(ka - kb) <= 1e-5 * max(1.0, abs(ka), abs(kb))


MISMATCH = {"rows": 0, "ties": 0}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,V", [(1, V_BIG), (32, V_BIG), (128, V_BIG), (64, 999), (16, 4097), (8, 1)])
@pytest.mark.parametrize("kind", ["llm", "dense"])
def test_gumbel_sample_matches_twin(dtype, B, V, kind):
    rng = np.random.default_rng(B * 7 + V)
    x = llm_like(rng, B, V) if kind == "llm" else rng.standard_normal((B, V)).astype(np.float32)
    if B >= 32:  # edge rows: a NaN row, all -inf but one, all -inf; all equal and one +inf (every group of 4
        x[3, V // 2] = np.nan  # passes the bound)
        x[4] = NEG_INF
        x[4, V - 1] = 1.0
        x[5] = NEG_INF
        x[6] = 0.0
        x[7, V // 3] = np.inf
        x[8, 5] = np.nan  # a NaN among the first loads of a row's first block: no key may come from it
    xr = rounded(x, dtype)
    temps, seeds, pos = params(rng, B)
    if B >= 32:
        temps[[3, 8]] = 1.0  # the NaN rows sample (a greedy row finds a NaN another way)
    got = gpu_sample(dev(x, dtype), temps, seeds, pos, dtype)
    want = cpu_sample(xr, temps, seeds, pos)
    assert ((got >= -1) & (got < V)).all()
    greedy = temps == 0
    np.testing.assert_array_equal(got[greedy], want[greedy])
    bad = np.flatnonzero(got != want)
    for r in bad:
        assert want[r] >= 0 and got[r] >= 0, f"row {r}: NaN handling differs ({got[r]} vs {want[r]})"
        assert near_tie(xr[r], temps[r], seeds[r], pos[r], got[r], want[r]), \
            f"row {r} (T={temps[r]}): GPU {got[r]} vs CPU {want[r]} and not a rounding tie"
    MISMATCH["rows"] += int((~greedy).sum())
    MISMATCH["ties"] += bad.size
    assert MISMATCH["ties"] <= max(1, MISMATCH["rows"] // 1000), MISMATCH
    if B >= 32:
        assert got[3] == -1 and got[8] == -1 and got[4] == V - 1 and 0 <= got[5] < V and got[7] == V // 3


@pytest.mark.parametrize("B", [1, 32, 128])
def test_gumbel_sample_bound_does_not_outlive_its_launch(B):
    """The best key a row's blocks share (row_L) is reset by the row's last block: a launch on logits 100 higher
    first must leave no bound behind that would skip every token of the next launch's rows."""
    rng = np.random.default_rng(B)
    x = llm_like(rng, B, V_BIG)
    temps = np.ones(B, np.float32)
    _, seeds, pos = params(rng, B)
    gpu_sample(dev(x + 50, "bfloat16"), temps, seeds, pos, "bfloat16")
    got = gpu_sample(dev(x - 50, "bfloat16"), temps, seeds, pos, "bfloat16")
    xr = rounded(x - 50, "bfloat16")
    want = cpu_sample(xr, temps, seeds, pos)
    for r in np.flatnonzero(got != want):
        assert near_tie(xr[r], 1.0, seeds[r], pos[r], got[r], want[r]), f"row {r}: GPU {got[r]} vs CPU {want[r]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fast_path_equals_fp32_copy(dtype):
    """Sampling the 16-bit logits directly gives the very tokens of sampling their FP32 copy (T in {0, 1})."""
    rng = np.random.default_rng(2)
    B = 128
    xd = dev(llm_like(rng, B, V_BIG), dtype)
    temps = np.where(np.arange(B) % 2 == 0, 0.0, 1.0).astype(np.float32)
    _, seeds, pos = params(rng, B)
    x32 = cp.empty((B, V_BIG), cp.float32)
    before = int(cp.asnumpy(xd.view(cp.uint16).astype(cp.uint64).sum()))
    K(dtype).to_fp32(xd, x32)
    host = cp.asnumpy(xd)
    np.testing.assert_array_equal(cp.asnumpy(x32), bf16_bits_to_f32(host) if dtype == "bfloat16"
                                  else host.astype(np.float32))
    np.testing.assert_array_equal(gpu_sample(xd, temps, seeds, pos, dtype), gpu_sample(x32, temps, seeds, pos, dtype))
    assert int(cp.asnumpy(xd.view(cp.uint16).astype(cp.uint64).sum())) == before  # input untouched


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def csr(rng, B, V, max_per_row, values):
    counts = rng.integers(0, max_per_row + 1, B)
    counts[0] = 0
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tok = np.concatenate([rng.choice(V, c, replace=False) for c in counts] + [np.zeros(0, int)]).astype(np.int32)
    return off, tok, values(off[-1])


@pytest.mark.parametrize("B,V", [(1, V_BIG), (32, V_BIG), (128, V_BIG), (7, 1001)])
def test_processing_ops_match_twin(B, V):
    rng = np.random.default_rng(B + V)
    for dtype in DTYPES:
        x = rounded(llm_like(rng, B, V), dtype)
        xg = cp.empty((B, V), cp.float32)
        K(dtype).to_fp32(dev(x, dtype), xg)
        np.testing.assert_array_equal(cp.asnumpy(xg), x)
    k = K("bfloat16")
    off, tok, val = csr(rng, B, V, 40, lambda n: np.where(rng.random(n) < 0.3, -np.inf,
                                                          rng.normal(0, 3, n)).astype(np.float32))
    poff, ptok, pcnt = csr(rng, B, V, 300, lambda n: rng.integers(0, 5, n).astype(np.int32))
    rep = rng.choice(np.float32([1.0, 1.1, 0.8, 2.0]), B)
    freq = rng.choice(np.float32([0.0, 0.3, -0.2]), B)
    pres = rng.choice(np.float32([0.0, 0.5]), B)
    temp = rng.choice(np.float32([0.0, 1.0, 0.7, 1.9]), B)
    minp = rng.choice(np.float32([0.0, 0.05, 0.3]), B)
    steps = [("add_entries", (off, tok, val)), ("apply_penalties", (poff, ptok, pcnt, rep, freq, pres)),
             ("temperature_min_p", (temp, minp))]
    for name, args in steps:
        getattr(S, name)(x, *args)
        getattr(k, name)(xg, *(cp.asarray(a) for a in args))
        got = cp.asnumpy(xg)
        inf_diff = np.count_nonzero(np.isneginf(got) != np.isneginf(x))
        assert inf_diff <= (2 if name == "temperature_min_p" else 0), f"{name}: {inf_diff} -inf masks differ"
        both = np.isfinite(got) & np.isfinite(x)
        np.testing.assert_allclose(got[both], x[both], rtol=1e-6, err_msg=name)
        xg = cp.asarray(x)  # continue from the twin's values, so one op's rounding does not leak into the next


def topkp_cases(rng, B, V):
    k = rng.choice(np.int32([0, -1, 1, 20, 50, 1000, 5000, V]), B)
    p = rng.choice(np.float32([1.0, 0.9, 0.5, 0.95, 0.2]), B)
    # the last two take the fp32 route's general route at V = 151,936: top-k beyond the list, and a top-p mass the
    # list's 14,336 tokens fall short of
    n = min(B, 6)
    k[:n], p[:n] = [50, 0, 50, 5000, 20000, 0][:n], [0.9, 0.9, 1.0, 0.8, 1.0, 0.999][:n]
    return k.astype(np.int32), p.astype(np.float32)


def boundary_ok(row, k, p, v):
    """Token v's keep/drop differs: is it at a float-sum boundary of top-p (mass above it within 1e-4 of p)?"""
    keep = row >= np.sort(row)[::-1][k - 1] if 0 < k < row.size else np.ones(row.size, bool)
    w = np.where(keep, np.exp(row.astype(np.float64) - row.max()), 0)
    return abs(w[row > row[v]].sum() / w.sum() - p) < 1e-4


@pytest.mark.parametrize("B,V,ints", [(1, V_BIG, False), (32, V_BIG, False), (128, V_BIG, False), (32, V_BIG, True),
                                      (64, 1000, False), (64, 1000, True), (16, 3, True)])
def test_top_k_top_p_matches_twin(B, V, ints):
    rng = np.random.default_rng(B * 3 + V + ints)
    x = (rng.integers(-8, 8, (B, V)).astype(np.float32) if ints else llm_like(rng, B, V))
    x[B // 2, : V // 3] = NEG_INF  # some already-masked tokens
    k, p = topkp_cases(rng, B, V)
    xg = cp.asarray(x)
    K("float32").top_k_top_p(xg, cp.asarray(k), cp.asarray(p))
    S.top_k_top_p(x_ref := x.copy(), k, p)
    got = cp.asnumpy(xg)
    for r in np.flatnonzero((np.isneginf(got) != np.isneginf(x_ref)).any(axis=1)):
        assert p[r] < 1, f"row {r}: top-k alone (k={k[r]}) must match exactly"
        for v in np.flatnonzero(np.isneginf(got[r]) != np.isneginf(x_ref[r])):
            assert boundary_ok(x[r], k[r], p[r], v), f"row {r} token {v} (k={k[r]}, p={p[r]}) not a boundary"
    both = np.isfinite(got)
    np.testing.assert_array_equal(got[both], x[both])  # survivors keep their values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,V,n", [(1, V_BIG, 5), (32, V_BIG, 20), (128, V_BIG, 5), (16, 999, 0), (4, 7, 20)])
def test_logprobs_match_twin(dtype, B, V, n):
    rng = np.random.default_rng(B + V + n)
    x = rounded(llm_like(rng, B, V), dtype)
    x[0, :10] = x[0, 5]  # ties
    sampled = rng.integers(0, V, B).astype(np.int32)
    outs_c = [np.zeros((B, n), np.int32), np.zeros((B, n), np.float32), np.zeros(B, np.float32),
              np.zeros(B, np.int32)]
    S.logprobs(x, sampled, n, *outs_c)
    outs_g = [cp.asarray(o) for o in outs_c]
    K(dtype).logprobs(dev(x, dtype), cp.asarray(sampled), n, *outs_g)
    ids, lp, slp, rank = (cp.asnumpy(o) for o in outs_g)
    np.testing.assert_array_equal(ids, outs_c[0])
    np.testing.assert_allclose(lp, outs_c[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(slp, outs_c[2], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(rank, outs_c[3])


def test_graph_capture_replays_with_new_data():
    rng = np.random.default_rng(9)
    B, V = 32, V_BIG
    k = K("bfloat16")
    stream = cp.cuda.Stream(non_blocking=True)

    def inputs():
        x = llm_like(rng, B, V)
        off, tok, val = csr(rng, B, V, 20, lambda n: rng.normal(0, 2, n).astype(np.float32))
        poff, ptok, pcnt = csr(rng, B, V, 100, lambda n: rng.integers(0, 4, n).astype(np.int32))
        pad = lambda a, n: np.concatenate([a, np.zeros(n - a.size, a.dtype)])  # noqa: E731 (fixed capacity)
        temps, seeds, pos = params(rng, B)
        return dict(x=x.astype(ml_dtypes.bfloat16).view(np.uint16), off=off, tok=pad(tok, 2000), val=pad(val, 2000),
                    poff=poff, ptok=pad(ptok, 4000), pcnt=pad(pcnt, 4000),
                    rep=rng.choice(np.float32([1.0, 1.2]), B), freq=rng.choice(np.float32([0.0, 0.4]), B),
                    pres=rng.choice(np.float32([0.0, 0.3]), B), temp=rng.choice(np.float32([0.0, 1.0, 0.6]), B),
                    minp=rng.choice(np.float32([0.0, 0.1]), B), topk=rng.choice(np.int32([0, 50, 5000]), B),
                    topp=rng.choice(np.float32([1.0, 0.9]), B), stemp=(temps > 0).astype(np.float32),
                    seeds=seeds, pos=pos)

    with stream:
        d = {name: cp.asarray(a) for name, a in inputs().items()}
        x32 = cp.empty((B, V), cp.float32)
        out = cp.zeros(B, cp.int32)

        def run():
            k.to_fp32(d["x"], x32)
            k.add_entries(x32, d["off"], d["tok"], d["val"])
            k.apply_penalties(x32, d["poff"], d["ptok"], d["pcnt"], d["rep"], d["freq"], d["pres"])
            k.temperature_min_p(x32, d["temp"], d["minp"])
            k.top_k_top_p(x32, d["topk"], d["topp"])
            k.gumbel_sample(x32, d["stemp"], d["seeds"], d["pos"], out)

        run()
        stream.synchronize()
        stream.begin_capture()
        run()
        graph = stream.end_capture()
        for _ in range(2):
            for name, a in inputs().items():  # new data, same buffers
                d[name][...] = cp.asarray(a)
            graph.launch(stream)
            stream.synchronize()
            replay_out, replay_x = cp.asnumpy(out), cp.asnumpy(x32)
            run()
            stream.synchronize()
            np.testing.assert_array_equal(replay_out, cp.asnumpy(out))
            np.testing.assert_array_equal(replay_x, cp.asnumpy(x32))


def chi2_ok(tokens, probs):
    from tests.kernels.test_sampler_kernels import chi2_check

    chi2_check(tokens, probs)


@pytest.mark.parametrize("case", ["temperature", "top_k", "top_p", "min_p"])
def test_chi2_gpu(case):
    rng = np.random.default_rng(17)
    V, N = 1000, 100_000
    x = (rng.standard_normal(V) * 1.5).astype(np.float32)[None]
    k = K("float32")
    if case == "temperature":
        logits, temp, probs = x, 0.7, R.softmax_rows(x / np.float32(0.7))[0]
    else:
        xg = cp.asarray(x)
        f32, i32 = (lambda v: cp.asarray(np.float32([v]))), (lambda v: cp.asarray(np.int32([v])))  # noqa: E731
        k.temperature_min_p(xg, f32(0.7), f32(0.1 if case == "min_p" else 0.0))
        if case != "min_p":
            k.top_k_top_p(xg, i32(50 if case == "top_k" else 0), f32(0.8 if case == "top_p" else 1))
        logits, temp = cp.asnumpy(xg), 1.0
        probs = R.softmax_rows(logits)[0]
        assert (probs == 0).sum() > 100
    xs = cp.tile(cp.asarray(logits), (N, 1))
    seeds = np.broadcast_to(np.uint32([2024, 7]), (N, 2)).copy()
    tokens = gpu_sample(xs, np.full(N, temp, np.float32), seeds, np.arange(N, dtype=np.int32), "float32")
    chi2_ok(tokens, probs)
