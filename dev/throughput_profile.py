"""Where `bench throughput`'s wall time goes: device time against host time, per kind of step, then the host's
hottest functions. The same workload and engine as `python -m toolkit bench throughput` (256 requests, prompt and
output lengths uniform in [100, 1024], seed 0, ignore_eos).

    PYTHONPATH=. python3 dev/throughput_profile.py [shape] [scheduler] [--sections] [--profile]

($REQUESTS changes the number of requests, $DEVICE=cpu runs it on the CPU backend: a smoke test of the script.)

A step's `gpu_ms` is its device time between events around the launch; `wall_ms` is the host's time from
scheduling (or, for a step queued before the last one's tokens were back, from those tokens) to its own tokens. The serve loop's own time
between steps is the wall clock minus the steps' walls. --sections runs a pass with the step's parts wrapped in
timers (and the garbage collector's pauses counted); with --profile a pass runs under cProfile (both slow the host,
so their walls are not the first pass's)."""
import cProfile
import os
import collections
import pstats
import sys
import time

import numpy as np

from toolkit.bench.throughput import workload
from toolkit.engine.build import build_engine
from toolkit.engine.sequence import SamplingParams

args = [a for a in sys.argv[1:] if not a.startswith("--")]
shape = args[0] if args else "qwen2.5-0.5b"
policy = args[1] if len(args) > 1 else None
extra = {"scheduler_policy": policy} if policy else {}
engine = build_engine(shape=shape, device=os.environ.get("DEVICE", "cuda"), max_context=2048, warmup=True,
                      **extra)
# QUEUE_AHEAD=0: one step at a time (the engine otherwise queues a decode step before the last one's tokens are back).
engine.queue_ahead = engine.queue_ahead and os.environ.get("QUEUE_AHEAD", "1") != "0"
# BUCKETS=1,2,...: the decode graph buckets (a variant to try: finer buckets above 128 rows pad less).
if os.environ.get("BUCKETS"):
    engine.runner.buckets = [int(b) for b in os.environ["BUCKETS"].split(",")]
print(f"queue_ahead {engine.queue_ahead}, graph buckets {engine.runner.buckets}")
print(f"{shape}: max_num_seqs {engine.max_num_seqs}, max_num_batched_tokens {engine.max_num_batched_tokens}, "
      f"kv_cache_tokens {engine.kv_cache_tokens}, policy {engine.scheduler.policy}")


def serve(seed: int) -> tuple:
    n_requests = int(os.environ.get("REQUESTS", 256))
    prompts, outs, _ = workload(n_requests, 100, 1024, engine.max_context, engine.cfg.vocab_size, seed)
    t0 = time.perf_counter()
    for p, n in zip(prompts, outs):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
    steps, n_out = [], 0
    while engine.has_unfinished():
        outs = engine.step()
        timing = next((o.step for o in outs if o.step is not None), None)
        if timing is not None:
            steps.append(timing)
        n_out += sum(1 for o in outs if o.token is not None and o.finish_reason != "stop")
    return time.perf_counter() - t0, steps, n_out


serve(100)  # warm: every graph a run reaches is captured here, as bench's untimed first request does part of it
wall, steps, n_out = serve(0)
print(f"wall {wall:.3f} s, {n_out} output tokens: {n_out / wall:,.0f} output tok/s, {len(steps)} steps")
by = collections.defaultdict(list)
for s in steps:
    by[s.kind].append(s)
print("| kind | steps | wall s | device s | detok s | other host s | graph | mean rows | mean tokens |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for kind, ss in sorted(by.items()):
    print(f"| {kind} | {len(ss)} | {sum(s.wall_ms for s in ss) / 1e3:.3f} | {sum(s.gpu_ms for s in ss) / 1e3:.3f} "
          f"| {sum(s.detokenize_ms for s in ss) / 1e3:.3f} | {sum(s.other_ms for s in ss) / 1e3:.3f} "
          f"| {sum(s.graph for s in ss)} | {np.mean([s.n_seqs for s in ss]):.1f} "
          f"| {np.mean([s.n_tokens for s in ss]):.1f} |")
print(f"serve loop outside step(): {wall - sum(s.wall_ms for s in steps) / 1e3:.3f} s")
dec = [s for s in steps if s.kind == "decode"]
if dec:
    print("decode steps by rows: | rows | steps | mean device ms | mean wall ms | mean context bucket |")
    rows = collections.defaultdict(list)
    for s in dec:
        rows[1 << (s.n_seqs - 1).bit_length()].append(s)
    for b, ss in sorted(rows.items()):
        print(f"| <= {b} | {len(ss)} | {np.mean([s.gpu_ms for s in ss]):.3f} | {np.mean([s.wall_ms for s in ss]):.3f}"
              f" | {np.mean([s.context_bucket for s in ss]):.0f} |")
pre = [s for s in steps if s.kind != "decode"]
if pre:
    toks = sum(s.n_tokens for s in pre)
    print(f"prefill: {toks} tokens in {sum(s.gpu_ms for s in pre) / 1e3:.3f} device s "
          f"({toks / (sum(s.gpu_ms for s in pre) / 1e3):,.0f} tok/s)")
if "--sections" in sys.argv:  # host time of the step's parts, by wrapping them (nested parts count in both)
    import gc

    r = engine.runner
    parts = {"schedule": (engine.scheduler, "schedule"), "prepare": (r, "prepare"),
             "prepare_next": (r, "prepare_next"), "launch": (r, "launch"), "collect": (r, "collect"),
             "sampler.prepare": (r.sampler, "prepare"), "stager.stage": (r.stager, "stage"),
             "sampler.stage": (r.sampler, "stage"), "model.plan": (r.model, "plan"), "runner._graph": (r, "_graph"),
             "be.replay": (r.be, "replay"), "be.download": (r.be, "download"), "be.fence": (r.be, "fence"),
             "engine._launch_next": (engine, "_launch_next"), "engine._collect": (engine, "_collect"),
             "engine._append": (engine, "_append"), "engine._output": (engine, "_output"),
             "engine.step": (engine, "step")}
    spent = collections.Counter()

    def timed(name, fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return call

    for name, (obj, attr) in parts.items():
        setattr(obj, attr, timed(name, getattr(obj, attr)))
    gc_s = [0.0, 0]

    def on_gc(phase, info):
        if phase == "start":
            gc_s.append(time.perf_counter())
        else:
            gc_s[0] += time.perf_counter() - gc_s.pop()
            gc_s[1] += 1
    gc.callbacks.append(on_gc)
    wall, steps, n_out = serve(2)
    gc.callbacks.remove(on_gc)
    print(f"with wrappers: wall {wall:.3f} s, {len(steps)} steps, device {sum(s.gpu_ms for s in steps) / 1e3:.3f} s, "
          f"gc {gc_s[0]:.3f} s in {gc_s[1]} collections")
    for name, t in spent.most_common():
        print(f"  {name:20s} {t:.3f} s  ({t / len(steps) * 1e3:.3f} ms a step)")
if "--profile" in sys.argv:
    prof = cProfile.Profile()
    prof.enable()
    wall, steps, n_out = serve(1)
    prof.disable()
    print(f"under cProfile: wall {wall:.3f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
