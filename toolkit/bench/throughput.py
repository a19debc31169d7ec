"""`bench throughput`: nano-vllm's offline workload, through the engine's public API.

N requests (256 by default) of random token ids, prompt and output lengths
drawn uniformly from [100, 1024] with seed 0 (nano-vllm's bench.py), all added
at once, then `engine.step()` until every one finishes, ignoring EOS so every
request produces exactly its output length. Lengths are capped at half the
engine's context each, so prompt + output always fits.

Output tok/s counts generated tokens over the wall time from the first
`add_request` to the last token; total tok/s adds the prompt tokens. Time to
first token comes from each request's `RequestStats`; inter-token latency is
the gap between successive tokens of one request as the host sees them
arrive from `step()`, pooled over all requests. A repeat draws its workload
with seed + repeat index: the same prompts again would hit the prefix cache.

Device s sums the steps' own device times (each step's clock, `StepTiming.gpu_ms`, over the steps that emitted
an output): wall s minus device s is the time the GPU waited for the host (scheduling, staging, building
outputs). At batch 256 on the H200 that was half the wall before the host work was cut (experiments/NOTEBOOK.md,
"Where does a throughput run's wall time go").
"""
import time

import numpy as np

from ..engine.sequence import SamplingParams
from .sweep import mean_std, percentile


def workload(n: int, lo: int, hi: int, context: int, vocab: int, seed: int) -> tuple[list, list, str | None]:
    """(prompts, output lengths, a note when the lengths had to be capped to fit the context)."""
    cap = max(1, context // 2)
    note = None
    if hi > cap:
        note = f"lengths capped at {cap} (half the {context}-token context), asked [{lo}, {hi}]"
        hi, lo = cap, min(lo, cap)
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(lo, hi + 1, n)
    output_lens = rng.integers(lo, hi + 1, n)
    prompts = [rng.integers(0, vocab, p) for p in prompt_lens]
    return prompts, [int(x) for x in output_lens], note


def serve(engine, prompts, output_lens) -> dict:
    """Run one workload to completion; the raw measurements of `summarize`."""
    t0 = time.perf_counter()
    for p, n in zip(prompts, output_lens):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
    arrivals, finals, errors, n_steps, options, device_ms = {}, [], [], 0, None, {}
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        n_steps += 1
        for out in outs:
            if out.error:
                errors.append(out.error)
            if out.step is not None:
                options = out.step.options
                device_ms[out.step.index] = out.step.gpu_ms
            if out.token is not None:
                arrivals.setdefault(out.request_id, []).append(now)
            if out.finish_reason is not None:
                finals.append(out.stats)
    wall = time.perf_counter() - t0
    itl = [(b - a) * 1e3 for times in arrivals.values() for a, b in zip(times, times[1:])]
    return {"wall_s": wall, "device_s": sum(device_ms.values()) / 1e3, "steps": n_steps, "errors": errors,
            "itl_ms": itl,
            "ttft_ms": [s.ttft_ms for s in finals if s.ttft_ms is not None],
            "prompt_tokens": sum(s.prompt_tokens for s in finals),
            "output_tokens": sum(s.generated_tokens for s in finals),
            "cached_tokens": sum(s.cached_tokens for s in finals),
            "preemptions": sum(s.preemptions for s in finals), "options": options}


def summarize(runs: list[dict], scheduler, n_requests: int) -> dict:
    out_tps = mean_std(r["output_tokens"] / r["wall_s"] for r in runs)
    tot_tps = mean_std((r["output_tokens"] + r["prompt_tokens"]) / r["wall_s"] for r in runs)
    ttft = [x for r in runs for x in r["ttft_ms"]]
    itl = [x for r in runs for x in r["itl_ms"]]
    options = runs[-1]["options"]  # as the steps ran them; None only if every request failed
    return {"test": "throughput", "scheduler": scheduler, "switches": options.as_dict() if options else None,
            "requests": n_requests, "repeats": len(runs), "errors": sum(len(r["errors"]) for r in runs),
            "prompt_tokens": runs[0]["prompt_tokens"], "output_tokens": runs[0]["output_tokens"],
            "cached_tokens": sum(r["cached_tokens"] for r in runs),
            "wall_s": mean_std(r["wall_s"] for r in runs)[0], "device_s": mean_std(r["device_s"] for r in runs)[0],
            "output_tok_per_s": out_tps[0], "output_tok_per_s_std": out_tps[1],
            "total_tok_per_s": tot_tps[0], "total_tok_per_s_std": tot_tps[1],
            "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
            "itl_ms_p50": percentile(itl, 50), "itl_ms_p99": percentile(itl, 99),
            "steps": runs[0]["steps"], "preemptions": sum(r["preemptions"] for r in runs),
            "first_error": next((e for r in runs for e in r["errors"]), None)}


def run_throughput(engine, n, lo, hi, seed, repeats, scheduler) -> tuple[dict, list[str]]:
    notes = []
    # One short untimed request first, as nano-vllm does: the first steps of a fresh engine pay one-off costs.
    serve(engine, [np.zeros(8, dtype=np.int64)], [4])
    runs = []
    for i in range(repeats):
        prompts, outs, note = workload(n, lo, hi, engine.max_context, engine.cfg.vocab_size, seed + i)
        if note and note not in notes:
            notes.append(note)
        runs.append(serve(engine, prompts, outs))
    return summarize(runs, scheduler, n), notes
