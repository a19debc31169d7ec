"""Where sparse prefill starts to pay: one fresh prompt of each length, prefilled in one eager step with the
sparse path forced (sparse_max_keep_pct=100) and with dense attention, Qwen2.5-0.5B shape, random bf16 weights.
Prints the median device time of each over the repeats and the share of causal keys the selection keeps
(toolkit.model.sparse.kept_keys), the number the engine's sparse_max_keep_pct compares against.
Run from the repo root on the GPU: `PYTHONPATH=. python3 experiments/sparse_crossover.py [lengths] [repeats]`."""
import statistics
import sys

import numpy as np

from toolkit.engine.build import build_engine
from toolkit.bench.env import environment
from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions
from toolkit.model.sparse import kept_keys

lengths = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "3072,4096,6144,8192,12288,16384").split(",")]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
top = max(lengths)
e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=top + 64, kv_cache_tokens=top + 1024,
                 max_num_seqs=1, max_num_batched_tokens=top, options=EngineOptions(cuda_graphs=False))
print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
rng = np.random.default_rng(0)
base = EngineOptions(cuda_graphs=False, prefix_caching=False)
print("| tokens | kept keys | dense ms | sparse ms | sparse / dense |")
print("|---:|---:|---:|---:|---:|")
for T in lengths:
    ms = {}
    for name, opts in (("dense", base.with_(sparse_prefill=False)), ("sparse", base.with_(sparse_max_keep_pct=100))):
        e.set_options(opts)
        runs = []
        for rep in range(repeats + 1):  # the first run warms up the workspaces and cuBLAS
            outs = list(e.generate(rng.integers(0, 1000, T).tolist(), SamplingParams(max_tokens=1, ignore_eos=True)))
            runs.append(outs[0].step.gpu_ms)
            path = outs[0].step.prefill_path
        ms[name] = statistics.median(runs[1:])
        assert path == ("dense" if name == "dense" else "sparse-approx"), (T, name, path)
    kept, causal = kept_keys(((T, T),), base)
    d, sp = ms["dense"], ms["sparse"]
    print(f"| {T:,} | {kept / causal:.1%} | {d:.2f} | {sp:.2f} | {sp / d:.2f} |", flush=True)
