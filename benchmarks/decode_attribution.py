"""Where a graph-replayed decode step's time goes, without a timeline profiler (the H200 image has no nsys):
capture the step (model.forward + sampling, as the runner does) with one family of kernels left out, replay it,
and take the difference from the whole step. A kernel's cost inside the graph includes what it adds to the
critical path (its launch, the wait for its inputs, PDL overlap), which Nsight Compute's serialised, cold-L2 times
do not show. Leaving kernels out makes the step's values garbage; only the times are read.

Qwen2.5-0.5B shape, random bf16 weights, default options (PDL on). Run from the repo root on the GPU:
`PYTHONPATH=. python3 benchmarks/decode_attribution.py [batches] [names] [contexts]`: batches "1,32" by default;
names a ";"-separated list of prefixes of the variants to run (default: all; the whole step always runs); contexts
a comma-separated list of lengths of every request, its new token included (default 1), one table each; options
"name=on|off,..." of EngineOptions (default: the defaults).
"from idle" times the whole step as the engine's step clock does: events around one replay on an idle GPU (after
a synchronisation), so the graph's launch is inside."""
import statistics
import sys

from decode_step import replay_us, uniform_step
from toolkit.engine.build import build_engine
from toolkit.backends.cuda_kernels import CudaKernels
from toolkit.bench.env import environment
from toolkit.engine.options import EngineOptions

batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,32").split(",")]
only = sys.argv[2].split(";") if len(sys.argv) > 2 else [""]
lengths = [int(n) for n in (sys.argv[3] if len(sys.argv) > 3 else "1").split(",")]
switches = dict(kv.split("=") for kv in sys.argv[4].split(",")) if len(sys.argv) > 4 else {}
e = build_engine(shape="qwen2.5-0.5b", device="cuda", max_context=max(1024, max(lengths)),
                 max_num_seqs=max(batches), options=EngineOptions(**{k: v == "on" for k, v in switches.items()}))
r, be, vocab = e.runner, e.runner.be, e.cfg.vocab_size
opts = e.effective_options()
print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
print(f"options: pdl={opts.pdl} small_batch_gemv={opts.small_batch_gemv} gemv_swiglu={opts.gemv_swiglu} "
      f"tensor_cores={opts.tensor_cores} skinny_gemm={opts.skinny_gemm} split_down={opts.split_down}")
gemm_cls = type(be._gemm)
gemm_call = gemm_cls.__call__


def noop(*args, **kwargs):
    pass


def gemm_without(lm_head: bool):
    """cuBLAS calls with the lm_head (lm_head=True) or the layers' projections (False) left out."""
    def call(self, transa, transb, m, *rest):
        if (m == vocab) != lm_head:
            gemm_call(self, transa, transb, m, *rest)
    return call


VARIANTS = {  # name -> (class, attribute, replacement) patched while the graph is captured
    "whole step": [],
    "add_rmsnorm": [(CudaKernels, "add_rmsnorm", noop)],
    "add_rmsnorm_partials (split_down's norm)": [(CudaKernels, "add_rmsnorm_partials", noop)],
    "rope_qkv": [(CudaKernels, "rope_qkv", noop)],
    "decode_attention": [(CudaKernels, "decode_attention", noop)],
    "gemv (qkv, o, down at 1-4 rows)": [(CudaKernels, "gemv", noop)],
    "gemv_swiglu (gate_up at 1-4 rows)": [(CudaKernels, "gemv_swiglu", noop)],
    "silu_mul": [(CudaKernels, "silu_mul", noop)],
    "gemm_skinny (qkv with RoPE, o at 2-32 rows)": [(CudaKernels, "gemm_skinny", noop),
                                                    (CudaKernels, "gemm_skinny_rope", noop)],
    "cuBLAS projections": [(gemm_cls, "__call__", gemm_without(lm_head=False)), (gemm_cls, "strided", noop)],
    "cuBLAS strided (split_down's down)": [(gemm_cls, "strided", noop)],
    "lm_head (cuBLAS)": [(gemm_cls, "__call__", gemm_without(lm_head=True))],
    "embedding": [(CudaKernels, "embedding", noop)],
    "sampling": [(type(r.sampler), "sample", noop)],
    "all but projections and lm_head": [(CudaKernels, n, noop) for n in ("add_rmsnorm", "add_rmsnorm_partials",
                                                                         "rope_qkv",
                                                                         "decode_attention", "silu_mul",
                                                                         "embedding")]
                                       + [(type(r.sampler), "sample", noop)],
}


def idle_us(graph, replays=50):
    """Median µs of one replay between events, the GPU idle before each (as an engine step)."""
    cp = be.cp
    start, end, out = cp.cuda.Event(), cp.cuda.Event(), []
    for _ in range(replays):
        be.stream.synchronize()
        start.record(be.stream)
        be.replay(graph)
        end.record(be.stream)
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(out)


for length in lengths:
    print(f"context length {length}")
    print("| batch | left out | step µs | ± | µs it took |")
    print("|---:|---|---:|---:|---:|")
    for B in batches:
        step, sb = uniform_step(r, B, length)
        body = r.graph_body(step, sb, opts)  # what the runner captures

        whole = None
        for name, patches in VARIANTS.items():
            if name != "whole step" and not any(name.startswith(o) for o in only):
                continue
            saved = [(cls, attr, cls.__dict__[attr]) for cls, attr, _ in patches]
            try:
                for cls, attr, fn in patches:
                    setattr(cls, attr, fn)
                body()  # eager first: workspaces and cuBLAS's algorithm choice stay outside the capture
                graph = be.capture(body)
            finally:
                for cls, attr, fn in saved:
                    setattr(cls, attr, fn)
            us, sd = replay_us(be, graph)
            whole = us if whole is None else whole
            idle = f" (from idle: {idle_us(graph):.1f})" if name == "whole step" else ""
            print(f"| {B} | {name}{idle} | {us:.1f} | {sd:.1f} | {whole - us:.1f} |", flush=True)
