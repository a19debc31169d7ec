"""Seconds the engine's start-up spends measuring the "tuned" projections (Model.tune: every (shape, row bucket)
a step can reach, plan.py's tuned_calls), per bench shape, on engines built without the rest of the warm-up.

    PYTHONPATH=. python3 dev/tune_startup.py [--shapes qwen2.5-0.5b,...] [--max-context 4096]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from toolkit.engine.build import build_engine  # noqa: E402
from toolkit.model.shapes import NAMES  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(n for n in NAMES if n != "tiny"))
    ap.add_argument("--max-context", type=int, default=4096)
    args = ap.parse_args(argv)
    for shape in args.shapes.split(","):
        eng = build_engine(shape=shape, device="cuda", max_context=args.max_context, warmup=False)
        t = time.perf_counter()
        n = eng.runner.model.tune(eng.effective_options(), eng.runner.logits)
        eng.backend.synchronize()
        print(f"{shape}: {n} tuned calls at start-up in {time.perf_counter() - t:.2f} s", flush=True)
        del eng


if __name__ == "__main__":
    main()
