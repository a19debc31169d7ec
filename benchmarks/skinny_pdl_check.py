"""The open question of skinny_gemm (README, "A tensor-core GEMM for 2-32 rows, second attempt"): with it on,
tests/test_gpu_engine.py::test_pdl_changes_no_token[5-False] decoded other tokens. This runs that test's
workload (the tiny bf16 model, random prompts, 8 greedy tokens) at several batch sizes with skinny_gemm on,
under each of PDL x CUDA graphs, and prints which runs differ from plain eager launches, and where.

    PYTHONPATH=. python3 benchmarks/skinny_pdl_check.py [batches] [device]   # e.g. 2,5,8,17,32 cuda
"""
import sys

import numpy as np

from toolkit.engine.build import build_engine
from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions


def run(engine, batch, n_tokens=8):
    rids = [engine.add_request(ids, SamplingParams(max_tokens=n_tokens, ignore_eos=True)) for ids in batch]
    got = {r: [] for r in rids}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id].append(o.token)
    return [got[r] for r in rids]


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "2,5,8,17,32").split(",")]
    device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    eng = build_engine(shape="tiny", device=device, dtype="bfloat16" if device == "cuda" else "float32",
                       max_context=256, kv_cache_tokens=256 * 80)
    for b in batches:
        rng = np.random.default_rng(30 + b)
        reqs = [rng.integers(1, eng.cfg.vocab_size, rng.integers(3, 40)).tolist() for _ in range(b)]
        runs = {}
        for pdl in (False, True):
            for graphs in (False, True):
                eng.runner.graphs.clear()
                eng.set_options(EngineOptions(skinny_gemm=True, pdl=pdl, cuda_graphs=graphs))
                runs[pdl, graphs] = run(eng, reqs)
        base = runs[False, False]
        for key, toks in runs.items():
            bad = [(i, next(j for j, (a, c) in enumerate(zip(t, base[i])) if a != c))
                   for i, t in enumerate(toks) if t != base[i]]
            print(f"batch {b:3d} pdl={key[0]!s:5} graphs={key[1]!s:5}: "
                  + ("same tokens" if not bad else f"{len(bad)} requests differ (request, first token): {bad[:6]}"),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
