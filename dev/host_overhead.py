"""The engine's host time alone: `bench throughput`'s workload with the device work taken out.

On the H200 a throughput run's decode steps spend about as long in the host (scheduling, staging, outputs) as in
the GPU, one after the other (dev/throughput_profile.py). This runs the same 256 requests through the real
scheduler, block manager, runner (prepare, sampler gate, staging) and output path on the CPU backend, with the
model's forward and the sampling kernel replaced by nothing and every sampled id 0, so what is timed is the host's
share of a step. Runs anywhere, no GPU:

    OMP_WAIT_POLICY=passive PYTHONPATH=. python dev/host_overhead.py [requests] [--profile] [--device-model]
        [--one-at-a-time]

With --device-model each step also waits for a modelled device time (below); then read the wall (and the time to
first token), not the CPU time.
"""
import cProfile
import pstats
import sys
import time

import numpy as np

from toolkit.bench.throughput import workload
from toolkit.engine.build import build_engine
from toolkit.engine.sequence import SamplingParams

args = [a for a in sys.argv[1:] if not a.startswith("--")]
n_requests = int(args[0]) if args else 256
# The 0.5B engine's sizes on the H200 (max_num_seqs 256, 8,192 tokens a step, a 2,048-token context). The model is
# the tiny shape: no per-request host state is vocabulary-sized, and no logits are computed.
engine = build_engine(shape="tiny", device="cpu", max_context=2048, max_num_seqs=256, max_num_batched_tokens=8192,
                      kv_cache_tokens=524304)
r = engine.runner
r.sampler.sample = lambda *a, **k: None
# --device-model: a stand-in device that takes the H200's measured time for each step (dev/throughput_profile.py,
# 0.5B shape: decode by graph bucket, prefill 1.8 us a token) and runs it while the host goes on, so the wall
# shows how much host work waits for the device and how much hides behind it. A model, not a measurement.
DECODE_MS = {1: 0.73, 2: 0.77, 4: 0.79, 8: 0.83, 16: 0.90, 32: 1.03, 64: 1.40, 128: 1.70, 256: 2.16}
device = {"busy_until": 0.0}


def forward(step, *a, **k):
    if "--device-model" in sys.argv:
        ms = DECODE_MS[1 << (step.num_seqs - 1).bit_length()] if step.num_decodes == step.num_seqs \
            else 0.0018 * step.num_tokens
        device["busy_until"] = max(time.perf_counter(), device["busy_until"]) + ms / 1e3


class Download:
    """The step's sampled ids, back once the modelled device has run everything queued before them."""

    def __init__(self, n):
        self.until, self.n = device["busy_until"], n

    def wait(self):
        while time.perf_counter() < self.until:  # the synchronisation: wait for the device
            pass
        return np.zeros(self.n, np.int32)


r.model.forward = forward
r.be.download = lambda dev, host, n: Download(n)
# The engine queues a decode step ahead where the backend is asynchronous, as the modelled device is; --one-at-a-time
# runs the steps as on a synchronous backend.
engine.queue_ahead = "--one-at-a-time" not in sys.argv


def serve(seed: int) -> tuple:
    prompts, outs, _ = workload(n_requests, 100, 1024, engine.max_context, engine.cfg.vocab_size, seed)
    t0, c0 = time.perf_counter(), time.thread_time()
    for p, n in zip(prompts, outs):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
    steps, n_out, ttft = 0, 0, []
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        n_out += len(outs)
        ttft += [o.stats.ttft_ms for o in outs if o.finish_reason is not None and o.stats.ttft_ms is not None]
    return time.thread_time() - c0, time.perf_counter() - t0, steps, n_out, ttft


def cold(seed: int) -> tuple:
    """serve() with the prefix cache emptied first: every run does the same work."""
    engine.block_manager.cached.clear()
    return serve(seed)


cold(0)
runs = [cold(0) for _ in range(5)]
cpu, wall, steps, n_out, ttft = min(runs)  # the thread's CPU time: other tenants of a shared machine inflate the wall
print(f"{n_requests} requests: host CPU {cpu:.3f} s for {steps} steps ({cpu / steps * 1e3:.3f} ms a step), "
      f"{n_out} outputs ({cpu / n_out * 1e6:.2f} us an output); best of 5, CPU s "
      f"{', '.join(f'{c:.3f}' for c, *_ in runs)}; wall s {', '.join(f'{w:.3f}' for _, w, *_ in runs)}; "
      f"time to first token p50/p99 {np.percentile(ttft, 50):.0f}/{np.percentile(ttft, 99):.0f} ms (that run)")
if "--profile" in sys.argv:
    prof = cProfile.Profile()
    prof.enable()
    cold(0)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
