"""Where the host time of an eager 4,096-token prefill goes (Qwen2.5-0.5B shape, random bf16 weights, GPU).

    PYTHONPATH=. python3 dev/profile_prefill_host.py [--tokens 4096] [--repeats 5]

Prints the step's device time (events around the step) and wall time for the sparse default and the dense path,
then cProfile's top functions by own time over the sparse runs: a device time close to the wall time with the
GPU's kernels summing to much less means the step waits for Python's launches.
"""
import argparse
import cProfile
import pstats
import statistics

import numpy as np

from toolkit.engine.build import build_engine
from toolkit.bench.speed import Test, measure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    engine = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=args.tokens + 64,
                          max_num_batched_tokens=args.tokens)
    t, rng = Test("prefill", length=args.tokens), np.random.default_rng(0)
    for sparse in (True, False):
        engine.set_options(engine.options.with_(sparse_prefill=sparse))
        measure(engine, t, rng)  # warm-up: kernels, workspaces
        runs = [measure(engine, t, rng)[:2] for _ in range(args.repeats)]
        print(f"prefill {args.tokens}, sparse_prefill={sparse}: device "
              f"{statistics.median(r[0] for r in runs):.3f} ms, wall {statistics.median(r[1] for r in runs):.3f} ms")
    engine.set_options(engine.options.with_(sparse_prefill=True))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.repeats):
        measure(engine, t, rng)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
