"""The PDL hand-off into cuBLAS (EngineOptions.pdl_handoff): is it sound, and what does it buy?

cuBLAS's kernels do not wait for their inputs (benchmarks/cublas_pdl.py), so a programmatic edge into one is
sound only if the kernel before it lets dependents launch after its writes. This script

1. probes that: a graph of a producer that spins ~100 us, writes a GEMM's input, fences, and only then lets its
   dependents launch (kernels/pdl.cuh's pdl_exit with late = 1), followed by the cuBLAS GEMM behind a programmatic
   edge. The GEMM must compute from the written input. The same producer triggering at its top (late = 0, the
   control) must not: that shows the probe can tell;
2. captures the decode step (Qwen2.5-0.5B shape, random bf16 weights, default options) with the hand-off off and
   on, checks both give the same logits bit for bit, counts the edges made programmatic, and replays the two
   alternately: median µs a step over 7 rounds of 200 replays.

    PYTHONPATH=. python3 benchmarks/pdl_handoff.py [batches, default 8,16,32,64] [contexts, default 1,65]

It needs the hand-off's code (EngineOptions.pdl_handoff, PdlLauncher.hand_off, the kernels' `late` argument),
which is in commit 070f098 only: it measured no gain at batch 8-32 and was removed after it
(benchmarks/results/pdl_handoff.log; README, "Five more leads").
"""
import statistics
import sys

import cupy as cp
import numpy as np

import cublas_pdl
from cublas_pdl import edges
from toolkit.engine.step import StepBatch

PROBE = cp.RawModule(code=r'''
extern "C" __global__ void slow_write(unsigned short* x, int n, long long spin, int late) {
    if (!late) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = 0x3f80;  // 1.0
    if (late) {
        __threadfence();
        __syncthreads();
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
}''')


def probe(be, label, x, run, out, late: int) -> bool:
    """Does the GEMM run() launches see slow_write's x behind a programmatic edge (cublas_pdl.probe)?"""
    slow = PROBE.get_function("slow_write")
    same, changed = cublas_pdl.probe(
        be, f"{label} late={late}", x, run, out,
        lambda x, n: slow((4,), (256,), (x, n, np.int64(200_000), np.int32(late)), stream=be.stream))
    return same and bool(changed)


def programmatic_edges(graph) -> int:
    return sum(1 for fr, to, ed in edges(graph.graph if hasattr(graph, "graph") else graph) if ed.type == 1)


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "8,16,32,64").split(",")]
    lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,65").split(",")]
    e = cublas_pdl.engine(max(batches))
    r, be, c = e.runner, e.runner.be, e.cfg
    opts = e.effective_options()
    L = r.model.w.layers[0]
    H, I = c.hidden_size, c.intermediate_size
    sound = True
    for M in (8, 32):
        x = be.empty((M, H))
        gu = be.empty((M, 2 * I))
        xa = be.empty((M, I))
        parts = be.empty((be.down_slices(M, H, I), M, H), np.float32)
        for late in (0, 1):
            ok_gu = probe(be, f"gate_up@{M}", x, lambda: be.linear(x, L.gate_up, gu), gu, late)
            ok_dn = probe(be, f"down@{M}", xa, lambda: be.linear_partials(xa, L.down, parts), parts, late)
            sound &= (ok_gu and ok_dn) == bool(late)
    print(f"probe: {'late trigger sound, early trigger caught' if sound else 'FAILED'}")
    if not sound:
        return 1
    print("| context | batch | hand-off off µs | on µs | on / off | edges made programmatic | same logits |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for length in lengths:
        for B in batches:
            bs = r.kv.block_size
            nb = -(-length // bs)
            tables = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
            batch = StepBatch(np.zeros(B, np.int32), np.full(B, length - 1, np.int32),
                              (tables[:, (length - 1) // bs] * bs + (length - 1) % bs).astype(np.int32),
                              np.arange(B + 1, dtype=np.int32), np.full(B, length, np.int32), tables, B,
                              r.context_bucket(length))
            sb = r.sampler.prepare([None] * B, batch.seq_lens, np.ones(B, bool), B, True)
            step = r.stager.stage(batch)
            r.sampler.stage(sb)
            graphs, outs, n_prog = [], [], []
            for on in (False, True):
                body = r.graph_body(step, sb, opts.with_(pdl_handoff=on))
                body()
                g = be.capture(body)
                graphs.append(g)
                n_prog.append(programmatic_edges(g))
            for g in graphs:
                be.replay(g)
                be.stream.synchronize()
                outs.append(r.logits[:B].copy())
            same = bool((outs[0] == outs[1]).all())
            times = [[], []]
            start, end = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(7):
                for i, g in enumerate(graphs):
                    for _ in range(20):
                        be.replay(g)
                    start.record(be.stream)
                    for _ in range(200):
                        be.replay(g)
                    end.record(be.stream)
                    end.synchronize()
                    times[i].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
            off, on = statistics.median(times[0]), statistics.median(times[1])
            print(f"| {length} | {B} | {off:.1f} | {on:.1f} | {on / off:.3f} | {n_prog[1] - n_prog[0]} | {same} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
