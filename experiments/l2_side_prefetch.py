"""Does pulling a layer's MLP weights into L2 on a side branch of the decode graph pay, at batch 32?

At batch 32 the step reads ~1 GB in ~0.74 ms (1.4 TB/s of 4.8): DRAM idles while the attention half of a layer
(qkv, attention, o, add_rmsnorm: small, latency-bound kernels) runs, then cuBLAS's gate_up and down stream 26 MB
at ~2.4 TB/s. Here each layer forks a branch off the main chain (an event after its input norm, or before its
attention) whose one kernel prefetches that layer's gate_up and down into L2; every branch joins the main stream
only at the end of the step, so no kernel of the chain waits for a prefetch. experiments/NOTEBOOK.md records two earlier
prefetch attempts that lost: a branch joined per layer with cp.async.bulk.prefetch, and bulk prefetches issued from
inside add_rmsnorm (both made the chain wait for the copy unit).

Run from the repo root on the GPU: `PYTHONPATH=. python3 experiments/l2_side_prefetch.py [batch] [contexts]`.
Prints, per variant, the graph-replayed step (median of repeats) and its difference from the plain step, and
checks the logits of every variant are bit for bit the plain step's."""
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev"))
from decode_step import replay_us, uniform_step  # noqa: E402
from toolkit.backends.cuda_kernels import CudaKernels  # noqa: E402
from toolkit.bench.env import environment  # noqa: E402
from toolkit.engine.build import build_engine  # noqa: E402

SRC = r"""
extern "C" __global__ void pf_lines(const char* p, unsigned long long bytes, unsigned stride, int evict_last) {
    const unsigned long long n = (bytes + stride - 1) / stride;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (evict_last) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + i * stride));
        else asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i * stride));
    }
}
extern "C" __global__ void pf_bulk(const char* p, unsigned long long bytes, unsigned chunk) {
    const unsigned long long n = (bytes + chunk - 1) / chunk;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long off = i * chunk;
        const unsigned size = (unsigned)min((unsigned long long)chunk, bytes - off);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
    }
}
extern "C" __global__ void pf_none(const char* p, unsigned long long bytes) {}
"""

B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
lengths = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,65").split(",")]
rounds = 5
only = sys.argv[3].split(";") if len(sys.argv) > 3 else None  # prefixes of the variants to run (plain always)
e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=1024, max_num_seqs=B)
r, be = e.runner, e.runner.be
cp = be.cp
opts = e.effective_options()
print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
mod = cp.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90"))
K = {n: mod.get_function(n) for n in ("pf_lines", "pf_bulk", "pf_none")}
side = cp.cuda.Stream(non_blocking=True)
layers = e.runner.model.w.layers
NL = len(layers)

# variant -> (fork point, kernel, which weights, grid, block, extra args)
VARIANTS = {
    "plain": None,
    "branch, empty kernel (cost of the branches)": ("qkv", "pf_none", "both", 1, 32, ()),
    "branch at attention, empty kernel": ("attn", "pf_none", "both", 1, 32, ()),
    "one branch at the embedding, empty kernel": ("embed", "pf_none", "both", 1, 32, ()),
    "lines 128 B, at qkv, gate_up+down": ("qkv", "pf_lines", "both", 132, 256, (128, 0)),
    "lines 128 B evict_last, at qkv, gate_up+down": ("qkv", "pf_lines", "both", 132, 256, (128, 1)),
    "lines 32 B, at qkv, gate_up+down": ("qkv", "pf_lines", "both", 132, 256, (32, 0)),
    "lines 128 B, at qkv, gate_up": ("qkv", "pf_lines", "gate_up", 132, 256, (128, 0)),
    "lines 128 B, at attention, gate_up+down": ("attn", "pf_lines", "both", 132, 256, (128, 0)),
    "bulk 16 KB, at qkv, gate_up+down": ("qkv", "pf_bulk", "both", 132, 32, (16384,)),
    "bulk 16 KB, at qkv, gate_up": ("qkv", "pf_bulk", "gate_up", 132, 32, (16384,)),
}


def prefetch(layer, spec):
    _, name, which, grid, block, extra = spec
    arrays = [layers[layer].gate_up] + ([layers[layer].down] if which == "both" else [])
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(be.stream)
    side.wait_event(ev)
    with side:
        for a in arrays:
            args = (a, np.uint64(a.nbytes))
            if name == "pf_lines":
                args += (np.uint32(extra[0]), np.int32(extra[1]))
            elif name == "pf_bulk":
                args += (np.uint32(extra[0]),)
            K[name]((grid,), (block,), args)
    be.stream.use()


def patched(spec, plan):
    """(attribute, original, wrapper): fork a prefetch branch before the layer's qkv or attention launch (the
    kernels the step plan runs)."""
    attn = "decode_attention_tc" if plan.decode_attention == "tc" else "decode_attention"
    qkv = {"skinny_rope": "gemm_skinny_rope", "skinny": "gemm_skinny", "gemv": "gemv"}.get(plan.qkv)
    attr = {"qkv": qkv, "attn": attn, "embed": "embedding"}[spec[0]]
    if attr is None:
        raise SystemExit(f"the plan's qkv projection ({plan.qkv}) is cuBLAS: no kernel of ours to fork before")
    orig = CudaKernels.__dict__[attr]
    count = [0]

    def wrapper(self, *a, **k):
        prefetch(count[0] % NL, spec)
        count[0] += 1
        return orig(self, *a, **k)
    return attr, orig, wrapper


for length in lengths:
    step, sb = uniform_step(r, B, length)
    plan = r.model.plan(step, opts)
    body = r.graph_body(step, sb, plan)
    graphs, ref = {}, None
    for name, spec in VARIANTS.items():
        if only and name != "plain" and not any(name.startswith(o) for o in only):
            continue

        def run():
            body()
            if spec is not None:  # join every branch at the end of the step
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(side)
                be.stream.wait_event(ev)
        saved = None
        if spec is not None:
            attr, orig, wrapper = patched(spec, plan)
            saved = (attr, orig)
            setattr(CudaKernels, attr, wrapper)
        try:
            run()
            graphs[name] = be.capture(run)
        finally:
            if saved:
                setattr(CudaKernels, saved[0], saved[1])
        be.replay(graphs[name])
        be.synchronize()
        logits = cp.asnumpy(r.logits[:B]).copy()
        if ref is None:
            ref = logits
        same = np.array_equal(logits, ref)
        print(f"  captured {name}: logits {'bit-identical' if same else 'DIFFER'}", flush=True)
    # Interleave the variants (ABAB...) so drift between them averages out: 5 rounds, median of the rounds.
    times = {n: [] for n in graphs}
    for _ in range(rounds):
        for n, g in graphs.items():
            times[n].append(replay_us(be, g, repeats=3)[0])
    base = statistics.median(times["plain"])
    print(f"batch {B}, context {length}")
    print("| variant | step µs | vs plain |")
    print("|---|---:|---:|")
    for n in graphs:
        t = statistics.median(times[n])
        print(f"| {n} | {t:.1f} | {t - base:+.1f} |", flush=True)
