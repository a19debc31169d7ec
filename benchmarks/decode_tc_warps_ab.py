"""The decode step with the tensor-core decode attention at 4 against 8 warps a block (decode_tc_warps), same
process: the captured step (model.forward + sampling, as the runner captures it) at each context, once with every
plan at 4 warps and once at 8, replayed alternately (7 rounds of 200 replays, medians).

Qwen2.5-0.5B shape, random bf16 weights, default options. Run from the repo root on the GPU:
`PYTHONPATH=. python3 benchmarks/decode_tc_warps_ab.py [batches, default 32] [contexts, default 1,65,129,4096]`
(contexts: the length of every request, its new token included; each step's plan is its context bucket's).
"""
import statistics
import sys

import cupy as cp
import numpy as np

import toolkit.backends.cuda_kernels as ck
from toolkit.assembly import build_engine
from toolkit.bench.env import environment
from toolkit.step import StepBatch


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "32").split(",")]
    lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,65,129,4096").split(",")]
    e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=max(1024, max(lengths)),
                     max_num_seqs=max(batches))
    r, be = e.runner, e.runner.be
    opts = e.effective_options()
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    print("| batch | context | plan | step µs, 4 warps | step µs, 8 warps | 8 against 4 | the plan's choice |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for B in batches:
        for length in lengths:
            bs = r.kv.block_size
            nb = -(-length // bs)
            tables = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
            bucket = r.context_bucket(length)
            batch = StepBatch(np.zeros(B, np.int32), np.full(B, length - 1, np.int32),
                              (tables[:, (length - 1) // bs] * bs + (length - 1) % bs).astype(np.int32),
                              np.arange(B + 1, dtype=np.int32), np.full(B, length, np.int32), tables, B, bucket)
            be.bind_thread()
            sb = r.sampler.prepare([None] * B, batch.seq_lens, np.ones(B, bool), B, True)
            step = r.stager.stage(batch)
            r.sampler.stage(sb)
            body = r.graph_body(step, sb, opts)
            graphs = {}
            for w in (4, 8):
                ck.DECODE_TC_WARPS = w
                try:
                    body()  # eager first: the plan and cuBLAS's choices stay outside the capture
                    graphs[w] = be.capture(body)
                finally:
                    ck.DECODE_TC_WARPS = 0
            times = {4: [], 8: []}
            start, end = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(7):
                for w, g in graphs.items():
                    for _ in range(20):
                        be.replay(g)
                    start.record(be.stream)
                    for _ in range(200):
                        be.replay(g)
                    end.record(be.stream)
                    end.synchronize()
                    times[w].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
            t4, t8 = statistics.median(times[4]), statistics.median(times[8])
            c = e.cfg
            pick = ck.decode_tc_warps(B, c.num_kv_heads, be.kernels.num_sms, bucket)
            print(f"| {B} | {length} | {bucket} | {t4:.1f} | {t8:.1f} | {t8 / t4:.3f} | {pick} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
