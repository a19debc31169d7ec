"""Where a graph-replayed decode step's time goes, without a timeline profiler (the H200 image has no nsys):
capture the step (model.forward + sampling, as the runner does) with one family of kernels left out, replay it,
and take the difference from the whole step. A kernel's cost inside the graph includes what it adds to the
critical path (its launch, the wait for its inputs, PDL overlap), which Nsight Compute's serialised, cold-L2 times
do not show. Leaving kernels out makes the step's values garbage; only the times are read.

Qwen2.5-0.5B shape (or $SHAPE, e.g. SHAPE=llama-3.2-1b), random bf16 weights. Run from the repo root on the GPU:

    PYTHONPATH=. python3 dev/decode_attribution.py [batches] [names] [contexts] [toggles] [plan]

batches "1,32" by default; names a ";"-separated list of prefixes of the variants to run (default: all; the whole
step always runs); contexts a comma-separated list of lengths of every request, its new token included (default
1), one table each; toggles "name=on|off,..." of EngineOptions (default: the defaults); plan "field=value,..." of
the StepPlan (toolkit/model/plan.py) to replace in the engine's plan, for an A/B of kernels by hand, e.g.
"o=skinny,swiglu=silu_mul" (the o projection without the RMSNorm epilogue) or "down=blas,down_slices=0".
"from idle" times the whole step as the engine's step clock does: events around one replay on an idle GPU (after
a synchronisation), so the graph's launch is inside."""
import dataclasses
import os
import statistics
import sys

from decode_step import replay_us, uniform_step
from toolkit.backends.cuda_kernels import CudaKernels
from toolkit.bench.env import environment
from toolkit.engine.build import build_engine
from toolkit.engine.options import EngineOptions

batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,32").split(",")]
only = sys.argv[2].split(";") if len(sys.argv) > 2 and sys.argv[2] != "all" else [""]
lengths = [int(n) for n in (sys.argv[3] if len(sys.argv) > 3 else "1").split(",")]
toggles = dict(kv.split("=") for kv in sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[4] else {}
plan_changes = dict(kv.split("=") for kv in sys.argv[5].split(",")) if len(sys.argv) > 5 and sys.argv[5] else {}
e = build_engine(shape=os.environ.get("SHAPE", "qwen2.5-0.5b"), device="cuda", max_context=max(1024, max(lengths)),
                 max_num_seqs=max(batches), options=EngineOptions(**{k: v == "on" for k, v in toggles.items()}))
r, be, vocab = e.runner, e.runner.be, e.cfg.vocab_size
opts = e.effective_options()
print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
print("options: " + " ".join(f"{n}={getattr(opts, n)}" for n in EngineOptions.names()))
gemm_cls = type(be._gemm)
gemm_call = gemm_cls.__call__


def noop(*args, **kwargs):
    pass


def gemm_skipping(skip):
    """cuBLAS calls with those whose output width m satisfies skip(m) left out (the lm_head's is the vocabulary)."""
    def call(self, transa, transb, m, *rest):
        if not skip(m):
            gemm_call(self, transa, transb, m, *rest)
    return call


def plan_of(step):
    """The engine's plan for this step, with the command line's replacements (the fields' types kept)."""
    plan = r.model.plan(step, opts)
    changes = {}
    for k, v in plan_changes.items():
        kind = type(getattr(plan, k))
        changes[k] = (v in ("on", "true", "1")) if kind is bool else kind(v)
    return dataclasses.replace(plan, **changes)


QKV, HIDDEN, GATE_UP = e.cfg.qkv_size, e.cfg.hidden_size, 2 * e.cfg.intermediate_size  # output widths
SKINNY = ("gemm_skinny", "gemm_skinny_swiglu", "gemm_skinny_rope", "gemm_skinny_norm")
SMALL = ("add_rmsnorm", "add_rmsnorm_partials", "rope_qkv", "decode_attention", "decode_attention_tc",
         "decode_attention_stream", "silu_mul", "silu_mul_scaled", "embedding")
VARIANTS = {  # name -> (class, attribute, replacement) patched while the graph is captured
    "whole step": [],
    "add_rmsnorm": [(CudaKernels, "add_rmsnorm", noop)],
    "add_rmsnorm_partials (the sliced down's norm)": [(CudaKernels, "add_rmsnorm_partials", noop)],
    "rope_qkv": [(CudaKernels, "rope_qkv", noop)],
    "decode_attention (every kernel)": [(CudaKernels, n, noop) for n in ("decode_attention", "decode_attention_tc",
                                                                           "decode_attention_stream")],
    "gemv (1 row)": [(CudaKernels, "gemv", noop)],
    "gemv_rope (qkv at 1 row)": [(CudaKernels, "gemv_rope", noop)],
    "gemv_swiglu (gate_up at 1 row)": [(CudaKernels, "gemv_swiglu", noop)],
    "silu_mul": [(CudaKernels, "silu_mul", noop)],
    "silu_mul_scaled (after the o projection's norm epilogue)": [(CudaKernels, "silu_mul_scaled", noop)],
    "gemm_skinny (all epilogues, 2-32 rows)": [(CudaKernels, n, noop) for n in SKINNY],
    "cuBLAS projections": [(gemm_cls, "__call__", gemm_skipping(lambda m: m != vocab)), (gemm_cls, "strided", noop)],
    "cuBLAS strided (the sliced down)": [(gemm_cls, "strided", noop)],
    "cuBLAS qkv": [(gemm_cls, "__call__", gemm_skipping(lambda m: m == QKV))],
    "cuBLAS o (and a down that is not sliced)": [(gemm_cls, "__call__", gemm_skipping(lambda m: m == HIDDEN))],
    "cuBLAS gate_up": [(gemm_cls, "__call__", gemm_skipping(lambda m: m == GATE_UP))],
    "lm_head (cuBLAS)": [(gemm_cls, "__call__", gemm_skipping(lambda m: m == vocab))],
    "embedding": [(CudaKernels, "embedding", noop)],
    "sampling": [(type(r.sampler), "sample", noop)],
    "all but projections and lm_head": [(CudaKernels, n, noop) for n in SMALL] + [(type(r.sampler), "sample", noop)],
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
        plan = plan_of(step)
        print(f"| {B} | plan: {plan.describe()} | | | |")
        body = r.graph_body(step, sb, plan)  # what the runner captures

        whole = None
        for name, patches in VARIANTS.items():
            if name != "whole step" and not any(name.startswith(o) for o in only):
                continue
            # (an inherited method, e.g. SkinnyGemms', is patched on the class named and deleted there after)
            saved = [(cls, attr, vars(cls).get(attr)) for cls, attr, _ in patches]
            try:
                for cls, attr, fn in patches:
                    setattr(cls, attr, fn)
                body()  # eager first: workspaces and cuBLAS's algorithm choice stay outside the capture
                graph = be.capture(body)
            finally:
                for cls, attr, fn in saved:
                    if fn is None:
                        delattr(cls, attr)
                    else:
                        setattr(cls, attr, fn)
            us, sd = replay_us(be, graph)
            whole = us if whole is None else whole
            idle = f" (from idle: {idle_us(graph):.1f})" if name == "whole step" else ""
            print(f"| {B} | {name}{idle} | {us:.1f} | {sd:.1f} | {whole - us:.1f} |", flush=True)
