"""`python -m toolkit bench sampler`: the sampler step alone, fast path against slow path.

For each batch size and sampling mode it times the sampler's device work on random bf16 logits
[B, V] shaped like a language model's (N(0, 2) plus 40 tokens raised by 4..14: a few likely tokens; the
Gumbel kernel skips the noise of tokens that cannot win, so the shape matters), and T = 1 also on
N(0, 3) logits, where every token is a contender (the worst case). Two timings:
  * graph: CUDA events around one replay of a CUDA graph holding `steps` sampler steps, divided by
    `steps`, so launch overhead does not hide the kernels (on the GPU; the engine's decode graph
    holds the sampler the same way, with every processing stage captured);
  * eager: events around `steps` eager sampler calls (what an eager step pays, launches included).
It also reports the host time of the gate and the staging, the FP32 bytes materialised per step, and
the least HBM bytes each path's step moves against the roofline (4.8 TB/s): the fast path reads the bf16
logits once; the slow path also writes its FP32 copy and reads it back. Modes with penalties give every
request a 256-token history (its prompt), as a chat turn has. Medians of `repeats` runs. With PyTorch present, the reference operations are timed in the
same process for the ratio: the bf16 -> fp32 copy, bf16 argmax, fp32 softmax + multinomial, sort.
"""
import statistics
import time

import numpy as np

from ..sampler.params import SamplingParams
from ..sampler.sampler import ALL_STAGES, Sampler
from ..sampler.state import RequestSampling
from toolkit.engine.timings import NullTimer

DEFAULT = dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1)  # the default model's settings
PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3)
# (name, params of every row, prompt tokens of each request): each runs with the fast path on, then off; T=1 also
# with it on N(0,3) logits (where every token is a contender)
CASES = (("greedy", dict(temperature=0.0), 1), ("T=1", dict(temperature=1.0), 1),
         ("T=0.7 top-k 50 top-p 0.9", dict(temperature=0.7, top_k=50, top_p=0.9), 1),
         ("default model's settings, 256-token histories", DEFAULT, 256),
         ("top-p 0.95", dict(temperature=1.0, top_p=0.95), 1),
         ("top-p 0.95 + penalties, 256-token histories", dict(temperature=1.0, top_p=0.95, **PENALTIES), 256))
MODES = {}  # name -> (params of every row, fast path switch, logits shape, prompt tokens of each request)
for _name, _params, _history in CASES:
    MODES[f"{_name}, fast path"] = (_params, True, "llm", _history)
    if _name == "T=1":
        MODES["T=1, fast path, N(0,3) logits"] = (_params, True, "flat", _history)
    MODES[f"{_name}, fast path off"] = (_params, False, "llm", _history)
HBM_BYTES_PER_S = 4.8e12  # the H200's nominal HBM bandwidth: the roofline the bytes below are set against


def make_logits(rng, B: int, V: int, shape: str) -> np.ndarray:
    if shape == "flat":
        return (rng.standard_normal((B, V)) * 3).astype(np.float32)
    x = rng.standard_normal((B, V)).astype(np.float32) * 2
    for b in range(B):  # a few likely tokens, as a language model's next-token logits have
        x[b, rng.choice(V, 40, replace=False)] += rng.uniform(4, 14, 40)
    return x


def _timed(be, fn, steps: int) -> float:
    """Device µs per call of fn, over `steps` calls between two events (or host time on the CPU)."""
    if be.name != "cuda":
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t) / steps * 1e6
    cp = be.cp
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(be.stream)
    for _ in range(steps):
        fn()
    b.record(be.stream)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / steps


def torch_us(torch, fn, steps: int) -> float:
    """Device µs per call of fn over `steps` calls between two torch CUDA events (on torch's current stream)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / steps


def bench_case(be, V: int, B: int, params: dict, fast_on: bool, shape: str, steps: int, repeats: int,
               history: int = 1, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    sampler = Sampler(be, V, B, max(16, history))
    states = [RequestSampling(SamplingParams(**params), rng.choice(V, history, replace=False), V, seed + i)
              for i in range(B)]
    logits = be.from_host(make_logits(rng, B, V, shape))
    be.bind_thread()
    positions = np.arange(B, dtype=np.int32) + 7
    due = np.ones(B, bool)
    t = time.perf_counter()
    for _ in range(steps):
        sb = sampler.prepare(states, positions, due, B, fast_on)
        sampler.stage(sb)
    be.synchronize()
    host_us = (time.perf_counter() - t) / steps * 1e6
    sampler.sample(logits, sb, NullTimer())  # untimed: compiles (NVRTC, Numba) and loads the kernels
    eager = [_timed(be, lambda: sampler.sample(logits, sb, NullTimer()), steps) for _ in range(repeats)]
    row = {"batch": B, "vocab": V, "path": "fast" if sb.fast else "slow", "bytes": sampler.materialised_bytes(sb),
           # the least HBM traffic of the logits: the fast path reads them once (later passes hit L2); the slow
           # path also writes the FP32 copy and reads it back at least once
           "hbm_bytes": B * V * ((2 if be.name == "cuda" else 4) + (0 if sb.fast else 8)),
           "eager_us": statistics.median(eager), "host_us": host_us, "graph_us": None}
    if be.name == "cuda" and getattr(be, "graphs_supported", True):
        stages = None if sb.fast else ALL_STAGES
        sampler.sample(logits, sb, NullTimer(), stages=stages)  # compile and load outside the capture
        g = be.capture(lambda: [sampler.sample(logits, sb, NullTimer(), stages=stages) for _ in range(steps)])
        row["graph_us"] = statistics.median(_timed(be, lambda: be.replay(g), 1) / steps for _ in range(repeats))
    return row


def torch_reference(B: int, V: int, repeats: int, steps: int = 20) -> dict:
    """PyTorch's own ops on the same shape, µs each (median), or {} without PyTorch/GPU."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    x = torch.randn(B, V, device="cuda", dtype=torch.bfloat16) * 3
    ops = {"torch: bf16 -> fp32 copy": lambda: torch.empty_like(x, dtype=torch.float32).copy_(x),
           "torch: bf16 argmax": lambda: x.argmax(-1),
           "torch: fp32 softmax + multinomial": lambda: torch.multinomial(torch.softmax(x.float(), -1), 1),
           "torch: sort rows": lambda: torch.sort(x, dim=-1)}
    out = {}
    for name, fn in ops.items():
        fn()
        out[name] = statistics.median(torch_us(torch, fn, steps) for _ in range(repeats))
    return out


def run_sampler_bench(be, V: int, batches, steps: int, repeats: int) -> tuple[list, dict]:
    rows, refs = [], {}
    for B in batches:
        for mode, (params, fast_on, shape, history) in MODES.items():
            rows.append({"mode": mode, **bench_case(be, V, B, params, fast_on, shape, steps, repeats, history)})
        if be.name == "cuda":
            refs[B] = torch_reference(B, V, repeats)
    return rows, refs


def markdown(env: dict, rows: list, refs: dict) -> str:
    lines = [f"- {k}: {v}" for k, v in env.items()] + [""]
    lines += ["| B | mode | path | FP32 bytes/step | HBM bytes/step (least) | roofline µs | graph µs/step | "
              "eager µs/step | host gate+stage µs |", "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = f"{r['graph_us']:.1f}" if r["graph_us"] is not None else "-"
        lines.append(f"| {r['batch']} | {r['mode']} | {r['path']} | {r['bytes'] / 2**20:.1f} MiB | "
                     f"{r['hbm_bytes'] / 2**20:.1f} MiB | {r['hbm_bytes'] / HBM_BYTES_PER_S * 1e6:.1f} | {g} | "
                     f"{r['eager_us']:.1f} | {r['host_us']:.1f} |")
    if refs:
        lines += ["", "| B | PyTorch reference (same process) | µs |", "|---:|---|---:|"]
        for B, ops in refs.items():
            lines += [f"| {B} | {name} | {us:.1f} |" for name, us in ops.items()]
    return "\n".join(lines)
