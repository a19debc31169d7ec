"""Programmatic edges into cuBLAS's kernels in the decode graph: do they wait, and what do they buy?

Our decode kernels launch with PDL (cuda_launch.py): the graph's edge into each of them is programmatic, so it is
launched while its predecessor still runs and waits for its inputs with `griddepcontrol.wait`. cuBLAS launches its
own kernels, so the capture gives the edge into each of them (gate_up, the sliced down, the lm_head) the default
type: the kernel is launched only after its predecessor has completed. This script

1. probes whether each of those cuBLAS kernels waits: a graph of a producer that lets its dependents launch at once
   (`griddepcontrol.launch_dependents`), spins ~100 us and only then writes the GEMM's input, followed by the GEMM,
   its edge made programmatic after the capture. A kernel that waits computes from the written input; one that
   does not, from the zeros there before. A copy kernel of ours without a wait is the control (it must see zeros);
2. times the captured decode step (Qwen2.5-0.5B shape, random bf16 weights, context 1) as captured, and with every
   edge into a kernel that passed the probe made programmatic, replayed alternately, and checks both give the
   same logits bit for bit. (Only where some kernel passed: on the H200 of 2026-12-02, driver 580.159.04, none did;
   experiments/logs/cublas_pdl.log.)

    PYTHONPATH=. python3 experiments/cublas_pdl.py [batches, default 8,32]
"""
import ctypes
import statistics
import sys

import cupy as cp
import numpy as np
from cupy_backends.cuda.api import runtime as rt

from toolkit.engine.build import build_engine
from toolkit.bench.env import environment
from toolkit.engine.step import StepBatch
from toolkit.model.plan import DOWN_SLICES

cu = ctypes.CDLL("libcuda.so.1")
VP = ctypes.c_void_p
KERNEL_NODE = 0      # CU_GRAPH_NODE_TYPE_KERNEL
PORT_PROGRAMMATIC = 1  # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
TYPE_PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


class EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


def check(err, what):
    if err:
        raise RuntimeError(f"{what}: CUresult {err}")


def edges(g):
    n = ctypes.c_size_t(0)
    check(cu.cuGraphGetEdges_v2(VP(g), None, None, None, ctypes.byref(n)), "cuGraphGetEdges_v2")
    fr, to, ed = (VP * n.value)(), (VP * n.value)(), (EdgeData * n.value)()
    check(cu.cuGraphGetEdges_v2(VP(g), fr, to, ed, ctypes.byref(n)), "cuGraphGetEdges_v2")
    return [(fr[i], to[i], ed[i]) for i in range(n.value)]


def kernel_name(node):
    """The kernel's name, or None for a node that is not a kernel."""
    t = ctypes.c_int()
    check(cu.cuGraphNodeGetType(VP(node), ctypes.byref(t)), "cuGraphNodeGetType")
    name = None
    if t.value == KERNEL_NODE:
        buf = (ctypes.c_ubyte * 256)()  # CUDA_KERNEL_NODE_PARAMS_v2: func at 0, kern (a CUkernel) at 56
        check(cu.cuGraphKernelNodeGetParams_v2(VP(node), buf), "cuGraphKernelNodeGetParams_v2")
        func, kern = VP.from_buffer(buf, 0).value, VP.from_buffer(buf, 56).value
        s = ctypes.c_char_p()
        if func:
            check(cu.cuFuncGetName(ctypes.byref(s), VP(func)), "cuFuncGetName")
        else:
            check(cu.cuKernelGetName(ctypes.byref(s), VP(kern)), "cuKernelGetName")
        name = s.value.decode()
    return name


def make_programmatic(g, want) -> list:
    """Every default edge between two kernels that want(from name, to name) accepts becomes programmatic."""
    changed = []
    for fr, to, ed in edges(g):
        if ed.type != 0 or kernel_name(fr) is None:
            continue
        name = kernel_name(to)
        if name is None or not want(kernel_name(fr), name):
            continue
        a, b, old, new = VP(fr), VP(to), EdgeData(), EdgeData(PORT_PROGRAMMATIC, 0, TYPE_PROGRAMMATIC)
        check(cu.cuGraphRemoveDependencies_v2(VP(g), ctypes.byref(a), ctypes.byref(b), ctypes.byref(old), 1),
              "cuGraphRemoveDependencies_v2")
        if cu.cuGraphAddDependencies_v2(VP(g), ctypes.byref(a), ctypes.byref(b), ctypes.byref(new), 1):
            print(f"  a programmatic edge {kernel_name(fr)} -> {name} was refused; the default edge stays")
            check(cu.cuGraphAddDependencies_v2(VP(g), ctypes.byref(a), ctypes.byref(b), ctypes.byref(old), 1),
                  "cuGraphAddDependencies_v2")
            continue
        changed.append(name)
    return changed


def capture(stream, fn) -> int:
    rt.streamBeginCapture(stream.ptr, rt.streamCaptureModeRelaxed)
    try:
        fn()
    finally:
        g = rt.streamEndCapture(stream.ptr)
    return g


PROBE = cp.RawModule(code=r'''
extern "C" __global__ void slow_write(unsigned short* x, int n, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = 0x3f80;  // 1.0
}
extern "C" __global__ void copy_nowait(const unsigned short* x, unsigned short* z, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) z[i] = x[i];
}''')


def probe(be, label, x, run, out, producer=None):
    """Does the kernel run() launches see x as written by the producer, behind a programmatic edge? producer(x, n)
    launches the kernel that writes x (default: slow_write, which lets its dependents launch at once)."""
    n = np.int32(x.size)
    if producer is None:
        slow = PROBE.get_function("slow_write")
        producer = lambda x, n: slow((1,), (256,), (x, n, np.int64(200_000)), stream=be.stream)  # noqa: E731
    x.fill(0x3f80)
    run()
    be.stream.synchronize()
    ref = out.copy()
    x.fill(0)
    be.stream.synchronize()
    g = capture(be.stream, lambda: (producer(x, n), run()))
    changed = make_programmatic(g, lambda fr, to: fr == "slow_write")
    ex = rt.graphInstantiate(g)
    out.fill(0)
    rt.graphLaunch(ex, be.stream.ptr)
    be.stream.synchronize()
    same = bool((out == ref).all())
    zero = not bool(out.any())
    print(f"probe {label:10s}: edges made programmatic into {changed}: "
          f"{'the written input' if same else 'STALE input (does not wait)' if zero else 'neither?'}")
    rt.graphExecDestroy(ex)
    rt.graphDestroy(g)
    return same, changed


def engine(max_batch: int):
    """The Qwen2.5-0.5B-shaped engine (random bf16 weights, default options) these probes run on, bound to this
    thread, after printing the environment."""
    e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=1024, max_num_seqs=max_batch)
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    e.runner.be.bind_thread()
    return e


def main():
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "8,32").split(",")]
    e = engine(max(batches))
    r, be, c = e.runner, e.runner.be, e.cfg
    opts = e.effective_options()
    L = r.model.w.layers[0]
    H, I = c.hidden_size, c.intermediate_size
    waits = set()
    for M in batches:
        x = be.empty((M, H))
        z = be.empty((M, H))
        ok, _ = probe(be, "control", x, lambda: PROBE.get_function("copy_nowait")(
            (4,), (256,), (x, z, np.int32(x.size)), stream=be.stream), z)
        if ok:
            print("  the control kernel saw the written input: this probe cannot tell; stopping")
            return 1
        gu = be.empty((M, 2 * I))
        ok, names = probe(be, f"gate_up@{M}", x, lambda: be.linear(x, L.gate_up, gu), gu)
        waits.update(names if ok else ())
        xa = be.empty((M, I))
        S = next((s for top, s in DOWN_SLICES if M <= top), 2)  # the plan's slices of the down projection
        parts = be.empty((S, M, H), np.float32)
        ok, names = probe(be, f"down/{S}@{M}", xa, lambda: be.linear_partials(xa, L.down, parts), parts)
        waits.update(names if ok else ())
        lg = r.logits[:M]
        ok, names = probe(be, f"lm_head@{M}", x, lambda: be.linear(x, r.model.w.lm_head, lg), lg)
        waits.update(names if ok else ())
    print(f"kernels that waited: {sorted(waits)}")
    if not waits:
        return 0
    print("| batch | step as captured µs | with programmatic edges into cuBLAS µs | edges changed | same logits |")
    print("|---:|---:|---:|---:|---|")
    for B in batches:
        bs = r.kv.block_size
        tables = np.arange(B, dtype=np.int32).reshape(B, 1)
        batch = StepBatch(np.zeros(B, np.int32), np.zeros(B, np.int32), (tables[:, 0] * bs).astype(np.int32),
                          np.arange(B + 1, dtype=np.int32), np.ones(B, np.int32), tables, B, r.context_bucket(1))
        sb = r.sampler.prepare([None] * B, batch.seq_lens, np.ones(B, bool), B, True)
        step = r.stager.stage(batch)
        r.sampler.stage(sb)
        body = r.graph_body(step, sb, r.model.plan(step, opts))
        body()
        ga, gb = capture(be.stream, body), capture(be.stream, body)
        changed = make_programmatic(gb, lambda fr, to: to in waits)
        xa, xb = rt.graphInstantiate(ga), rt.graphInstantiate(gb)
        outs = []
        for ex in (xa, xb):
            rt.graphLaunch(ex, be.stream.ptr)
            be.stream.synchronize()
            outs.append(r.logits[:B].copy())
        same = bool((outs[0] == outs[1]).all())
        times = {xa: [], xb: []}
        start, end = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(7):
            for ex in (xa, xb):
                for _ in range(20):
                    rt.graphLaunch(ex, be.stream.ptr)
                start.record(be.stream)
                for _ in range(200):
                    rt.graphLaunch(ex, be.stream.ptr)
                end.record(be.stream)
                end.synchronize()
                times[ex].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
        ta, tb = statistics.median(times[xa]), statistics.median(times[xb])
        print(f"| {B} | {ta:.1f} | {tb:.1f} | {len(changed)} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
