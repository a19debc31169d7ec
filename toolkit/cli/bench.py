"""`python -m toolkit bench`: prefill and decode speed, llama-bench style.

Random weights of a named shape (`--shape qwen2.5-0.5b`, no checkpoint) or a
real model folder. Each test runs `--warmup` times untimed, then `--repeats`
times; we report medians, because single runs on a shared GPU wander.
Tokenization and detokenization are excluded: random token ids go straight in.
"""
import argparse
import json
import platform
import statistics
import subprocess
import sys

import numpy as np

from ..backends import make_backend
from ..checkpoint import Checkpoint
from ..config import ModelConfig
from ..device import resolve_device
from ..engine import Engine
from ..errors import ToolkitError
from ..shapes import NAMES, shape_config
from ..timings import SECTIONS
from ..weights import random_checkpoint
from .common import add_model_args, positive_int, run


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit bench", description="Measure prefill and decode speed.")
    p.add_argument("--shape", choices=NAMES, help="random weights of this shape (no checkpoint needed)")
    add_model_args(p, model_required=False)
    p.add_argument("--prefill", default="512,4096", help="prompt lengths, comma-separated (default: 512,4096)")
    p.add_argument("--decode", type=positive_int, default=128, help="decode steps at batch 1 (default: 128)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--format", choices=("md", "json"), default="md")
    return p


def environment(backend_name: str) -> dict:
    env = {"python": platform.python_version(), "numpy": np.__version__, "backend": backend_name}
    if backend_name == "cuda":
        import cupy as cp

        rt = cp.cuda.runtime
        env["gpu"] = rt.getDeviceProperties(0)["name"].decode()
        env["cupy"] = cp.__version__
        env["cuda_runtime"] = rt.runtimeGetVersion()
        env["cuda_driver_api"] = rt.driverGetVersion()
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            env["driver"] = "unknown (no nvidia-smi)"
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def _median_sections(steps) -> dict:
    return {k: statistics.median(s.sections_ms.get(k, 0.0) for s in steps) for k in SECTIONS}


def bench(engine: Engine, prefill_lengths, decode_steps, repeats, warmup) -> list[dict]:
    rng = np.random.default_rng(0)
    vocab = engine.cfg.vocab_size
    results = []
    for P in prefill_lengths:
        ids = rng.integers(0, vocab, P)
        steps = []
        for i in range(warmup + repeats):
            step = next(engine.generate(ids, max_tokens=1, ignore_eos=True)).step
            if i >= warmup:
                steps.append(step)
        ms = statistics.median(s.total_ms for s in steps)
        results.append({"test": f"pp{P}", "ms": ms, "tok_per_s": P / ms * 1e3,
                        "sections_ms": _median_sections(steps)})
    ids = rng.integers(0, vocab, 16)
    runs = []
    for i in range(warmup + repeats):
        steps = [r.step for r in engine.generate(ids, max_tokens=decode_steps + 1, ignore_eos=True)][1:]
        if i >= warmup:
            runs.append(steps)
    per_run = [statistics.median(s.total_ms for s in steps) for steps in runs]
    ms = statistics.median(per_run)
    all_steps = [s for steps in runs for s in steps]
    results.append({"test": f"tg{decode_steps}", "ms": ms, "tok_per_s": 1e3 / ms,
                    "gb_per_s": engine.weight_bytes / (ms / 1e3) / 1e9,
                    "sections_ms": _median_sections(all_steps),
                    "other_ms": statistics.median(s.other_ms for s in all_steps)})
    return results


def _bench(args) -> int:
    backend_name, note = resolve_device(args.device)
    if args.shape:
        cfg = shape_config(args.shape)
        dtype = args.dtype or ("float32" if backend_name == "cpu" else "bfloat16")
        source, label = random_checkpoint(cfg, dtype), f"{args.shape} (random weights)"
    elif args.model:
        cfg = ModelConfig.from_dir(args.model)
        dtype = args.dtype or {"float16": "float16", "bfloat16": "bfloat16"}.get(cfg.torch_dtype, "float32")
        source, label = Checkpoint(args.model), args.model
    else:
        raise ToolkitError("bench: give --shape NAME or --model DIR")
    lengths = [int(x) for x in args.prefill.split(",") if x.strip()]
    context = args.max_context or min(cfg.max_position_embeddings, max(lengths + [16]) + args.decode + 8)
    backend = make_backend(backend_name, dtype)
    engine = Engine(cfg, source, backend, max_context=context, max_chunk=max(lengths + [16]))
    env = environment(backend_name)
    env.update(model=label, dtype=backend.dtype, weights_gb=round(engine.weight_bytes / 1e9, 3))
    results = bench(engine, lengths, args.decode, args.repeats, args.warmup)
    if args.format == "json":
        print(json.dumps({"environment": env, "results": results}, indent=2))
        return 0
    print(note, file=sys.stderr)
    for k, v in env.items():
        print(f"{k}: {v}")
    print("\n| test | ms (median) | tok/s | " + " | ".join(f"{s} ms" for s in SECTIONS) + " |")
    print("|---|---|---|" + "---|" * len(SECTIONS))
    for r in results:
        sec = " | ".join(f"{r['sections_ms'][s]:.3f}" for s in SECTIONS)
        print(f"| {r['test']} | {r['ms']:.3f} | {r['tok_per_s']:.1f} | {sec} |")
    dec = results[-1]
    print(f"\ndecode: {dec['tok_per_s']:.1f} tok/s, {dec['ms']:.3f} ms/step, {dec['gb_per_s']:.1f} GB/s of weights, "
          f"host time outside the sections {dec['other_ms']:.3f} ms/step")
    return 0


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    return run(lambda _: _bench(args), argv, args.debug)
