"""One eager decode step of the Qwen2.5-0.5B shape (random bf16 weights) between cudaProfilerStart/Stop, for
`ncu --profile-from-start off`: which kernels a step launches and how long each takes. `--prefill N` profiles
one N-token prompt's prefill step instead (dense: the sparse prefill off), after one of the same length.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 dev/profile_decode.py --batch 1 > ncu.csv
    python3 dev/profile_decode.py --summarise ncu.csv
"""
import argparse
import collections
import csv
import io
import re

import numpy as np


def run(batch: int, shape: str, steps: int, prefill: int):
    import cupy as cp
    from toolkit.engine.build import build_engine
    from toolkit.engine.options import EngineOptions
    from toolkit.sampler.params import SamplingParams

    rng = np.random.default_rng(0)
    if prefill:  # no prefix caching: the second prompt must not reuse the first's blocks
        engine = build_engine(shape=shape, device="cuda", max_context=prefill + 64, max_num_batched_tokens=prefill,
                              options=EngineOptions(cuda_graphs=False, sparse_prefill=False, prefix_caching=False))
        engine.add_request(rng.integers(0, engine.cfg.vocab_size, prefill), SamplingParams(max_tokens=1))
        while engine.has_unfinished():
            engine.step()
        engine.add_request(rng.integers(0, engine.cfg.vocab_size, prefill), SamplingParams(max_tokens=1))
    else:
        engine = build_engine(shape=shape, device="cuda", max_context=1024, options=EngineOptions(cuda_graphs=False))
        for _ in range(batch):
            engine.add_request(rng.integers(0, engine.cfg.vocab_size, 16),
                               SamplingParams(max_tokens=200, ignore_eos=True))
        for _ in range(steps):
            engine.step()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    engine.step()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def summarise(path: str):
    text = open(path).read()
    text = text[text.index('"ID"'):]
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("Metric Name") == "gpu__time_duration.sum"]
    total = collections.defaultdict(float)
    count = collections.Counter()
    order = []
    for r in rows:
        name = re.sub(r"\(.*", "", r["Kernel Name"])[:60]
        unit = r["Metric Unit"]
        v = float(r["Metric Value"].replace(",", ""))
        us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[unit] * v
        if name not in total:
            order.append(name)
        total[name] += us
        count[name] += 1
    all_us = sum(total.values())
    print(f"{len(rows)} kernels, {all_us:.1f} us of kernel time")
    for name in sorted(order, key=lambda n: -total[n]):
        print(f"  {name:60s} x{count[name]:4d} {total[name]:9.1f} us  {total[name] / count[name]:7.2f} us each")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=0, help="profile an N-token prefill step instead")
    ap.add_argument("--summarise")
    a = ap.parse_args()
    if a.summarise:
        summarise(a.summarise)
    else:
        run(a.batch, a.shape, a.steps, a.prefill)
