"""A decode step of B rows as two concurrent half steps of B/2 rows (two streams forked and joined inside one CUDA
graph), against the one B-row step: does a second latency-bound chain of kernels fill the gaps of the first?

Each lane has its own backend (stream, kernels with their own plans and workspaces, cuBLAS handle), model scratch
and staged step; the weights and the KV cache are shared (the lanes' rows use disjoint blocks). Forward only (no
sampling), Qwen2.5-0.5B shape, random bf16 weights, context 1, default options. "same logits": the two lanes'
graph against the two halves run one after the other (the B-row step's differ in bf16 rounding: its kernels depend
on the row count). Replays alternate between the graphs, 7 rounds of 200, medians.

    PYTHONPATH=. python3 experiments/two_lanes.py [batches, default 16,32,64]
"""
import statistics
import sys

import cupy as cp
import numpy as np

from toolkit.engine.build import build_engine
from toolkit.backends.cuda import CudaBackend
from toolkit.bench.env import environment
from toolkit.model.decoder import Model
from toolkit.engine.step import StepBatch, StepStager
from toolkit.engine.timings import NullTimer


def batch_of(rows, bs, bucket):
    B = len(rows)
    tables = np.asarray(rows, np.int32).reshape(B, 1)
    return StepBatch(np.zeros(B, np.int32), np.zeros(B, np.int32), (tables[:, 0] * bs).astype(np.int32),
                     np.arange(B + 1, dtype=np.int32), np.ones(B, np.int32), tables, B, bucket)


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "16,32,64").split(",")]
    top = max(batches)
    e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=1024, max_num_seqs=top)
    r, be, c = e.runner, e.runner.be, e.cfg
    opts = e.effective_options()
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    be2 = CudaBackend(be.dtype)
    m2 = Model(c, r.model.w, be2, r.model.max_context, top, top)
    st2 = StepStager(be2, top, top, r.max_blocks)
    bs, bucket = r.kv.block_size, r.context_bucket(1)
    print("| batch | one step µs | two lanes of batch/2 µs | one lane of batch/2 µs | same logits |")
    print("|---:|---:|---:|---:|---|")
    for B in batches:
        h = B // 2
        be.bind_thread()
        whole = r.stager.stage(batch_of(range(B), bs, bucket))

        def one():
            r.model.forward(whole, r.kv, r.logits, r.model.plan(whole, opts), NullTimer())

        one()
        g1 = be.capture(one)

        # the lanes' steps are staged after the whole one's graph is captured: the stager's buffers are reused
        # (so the whole step's graph replays the lanes' rows: only its time is read)
        sa = r.stager.stage(batch_of(range(h), bs, bucket))
        be2.bind_thread()
        sb = st2.stage(batch_of(range(h, B), bs, bucket))
        be.bind_thread()

        def two():
            fork = cp.cuda.Event(disable_timing=True)
            fork.record(be.stream)
            be2.stream.wait_event(fork)
            r.model.forward(sa, r.kv, r.logits[:h], r.model.plan(sa, opts), NullTimer())
            be2.stream.use()
            m2.forward(sb, r.kv, r.logits[h:B], m2.plan(sb, opts), NullTimer())
            join = cp.cuda.Event(disable_timing=True)
            join.record(be2.stream)
            be.stream.use()
            be.stream.wait_event(join)

        def half():
            r.model.forward(sa, r.kv, r.logits[:h], r.model.plan(sa, opts), NullTimer())

        # the reference: the two halves one after the other (the rows' kernels depend on the row count, so the
        # whole step's logits differ in bf16 rounding; the lanes' must not change by running them concurrently)
        r.model.forward(sa, r.kv, r.logits[:h], r.model.plan(sa, opts), NullTimer())
        be.stream.synchronize()
        be2.bind_thread()
        m2.forward(sb, r.kv, r.logits[h:B], m2.plan(sb, opts), NullTimer())
        be2.stream.synchronize()
        be.bind_thread()
        ref = r.logits[:B].copy()
        g2 = be.capture(two)
        gh = be.capture(half)
        r.logits[:B].fill(0)
        g2.launch(be.stream)
        be.stream.synchronize()
        same = bool((r.logits[:B] == ref).all())
        times = {0: [], 1: [], 2: []}
        start, end = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(7):
            for i, g in enumerate((g1, g2, gh)):
                for _ in range(20):
                    g.launch(be.stream)
                start.record(be.stream)
                for _ in range(200):
                    g.launch(be.stream)
                end.record(be.stream)
                end.synchronize()
                times[i].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
        t = [statistics.median(times[i]) for i in range(3)]
        print(f"| {B} | {t[0]:.1f} | {t[1]:.1f} | {t[2]:.1f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
