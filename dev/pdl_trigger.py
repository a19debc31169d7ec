"""Should a decode-step kernel let the next one launch before its PDL wait, and is the step then still exact?

Today every kernel of the chain calls pdl_launch_dependents() right after pdl_wait() (kernels/pdl.cuh), so at most
two kernels overlap. Triggering first measured faster on the H200 (0.892 against 0.921 ms, the 0.5B at batch 1,
commit 5aac9fa) but changed tokens of the fp32 stories260K model from a graph. The reading then: with the trigger
first, kernels launch several ahead, and a kernel's blocks can sit on an SM while a kernel two or more before it
still runs there; that one's loads of a buffer fill the SM's L1 with values a later kernel overwrites, and the
waiting kernel's loads (ld.global.nc from __ldg and const __restrict__ pointers, and plain ld.global, both cached in
L1) then hit the stale lines. If so, loads that go to L2 only (ld.global.cg) should make the early trigger exact.
(Session 30 on an H100: every variant was exact; experiments/NOTEBOOK.md, "Should a kernel let the next one launch
before its PDL wait?")

Variants, each the product's kernel sources edited as text here (the product is unchanged):
  late       the product: wait, then trigger
  early      trigger, then wait
  late_l2    wait then trigger, every global load of our kernels L2-only: __ldg -> __ldcg, no __restrict__ (so no
             inferred ld.global.nc) and ptxas -dlcm=cg (plain loads .cg); the control for what that costs alone
  early_l2   both
A variant may end in "+waveB" (e.g. early+wave4): the batch-1 GEMVs (gemv and gemv_swiglu, bf16) then run
dev/gemv_waves.py's one-wave kernels, at most B blocks an SM, each block striding over its row groups (the same
bits). With the trigger first, the next kernel can then launch at the GEMV's start, where a GEMV of several waves
lets it launch only with its last wave.
Each variant runs in a process of its own (a fresh NVRTC build, no cached functions), in the order given, so a
repeat of the first measures drift. In each: the exactness checks of tests/kernels/test_gpu_pdl.py (PDL launches
from a graph against plain eager launches, bit for bit: fp32 and bf16, three attention kernels), the fp32
stories260K model's greedy tokens with PDL graphs against eager steps (where ../shared/models/stories260K exists),
then each shape's decode step replayed from a graph (median µs of 5 x 200 replays).

    PYTHONPATH=. python3 dev/pdl_trigger.py [--variants late,early,late_l2,early_l2,late] [--shapes ...]
        [--batches 1,32] [--context 1]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "dev"))

VARIANTS = ("late", "early", "late_l2", "early_l2")
LATE = "    pdl_wait();\n    pdl_launch_dependents();\n"
EARLY = "    pdl_launch_dependents();\n    pdl_wait();\n"
L2_OPTIONS = ("-Xptxas=-dlcm=cg",)


def edit_source(src: str, variant: str) -> str:
    """One kernel source (headers inlined) as `variant` builds it."""
    if variant.startswith("early") and LATE in src:
        src = src.replace(LATE, EARLY)
    if variant.endswith("_l2"):
        src = src.replace("__ldg(", "__ldcg(").replace("__restrict__", "")
    return src


def split_variant(name: str) -> tuple:
    """"early+wave4" -> ("early", 4); "late" -> ("late", 0)."""
    base, plus, wave = name.partition("+wave")
    assert base in VARIANTS and (wave.isdigit() or not plus), f"unknown variant {name!r}: {VARIANTS}, +waveB"
    return base, int(wave or 0)


def wave_source(variant: str) -> str:
    """gemv.cu with dev/gemv_waves.py's one-wave kernels appended, as `variant` builds it."""
    import toolkit.backends.cuda_kernels as ck
    from gemv_waves import VARIANT

    return edit_source(ck.kernel_source("gemv") + VARIANT, variant)


def install_waves(variant: str, per_sm: int):
    """The bf16 batch-1 gemv and gemv_swiglu on one-wave grids of at most per_sm blocks an SM (launched as the
    product's kernels are: with PDL where the backend has it); every other call as before."""
    import cupy as cp

    import toolkit.backends.cuda_kernels as ck

    names = ("gemv_wave<__nv_bfloat16, 1>", "gemv_swiglu_wave<__nv_bfloat16, 1>")
    mod = cp.RawModule(code=wave_source(variant), options=ck.OPTIONS, name_expressions=names)
    fns = {n: mod.get_function(n) for n in names}
    cls, plain, swiglu = ck.CudaKernels, ck.CudaKernels.gemv, ck.CudaKernels.gemv_swiglu

    def launch(self, name, x, w, out, n_out):
        K = x.shape[1]
        (groups,), wpr = self._gemv_grid(n_out, K)  # the product's grid, capped at one wave below
        self._go(fns[name], (min(groups, per_sm * self.num_sms),), (256,), (x, w, out, ck._i32(n_out), ck._i32(K),
                                                                           wpr))

    def gemv(self, x, w, out):
        if self.ctype != "__nv_bfloat16" or x.shape[0] != 1 or out.dtype != self.storage:
            return plain(self, x, w, out)
        launch(self, names[0], x, w, out, w.shape[0])

    def gemv_swiglu(self, x, w, out):
        if self.ctype != "__nv_bfloat16" or x.shape[0] != 1:
            return swiglu(self, x, w, out)
        launch(self, names[1], x, w, out, w.shape[0] // 2)

    cls.gemv, cls.gemv_swiglu = gemv, gemv_swiglu


def install(name: str):
    """Make this process's kernel builds variant `name`'s (before any kernel is built)."""
    import toolkit.backends.cuda_kernels as ck

    variant, waves = split_variant(name)
    assert not ck._MODULES, "install before the first kernel is built"
    real = ck.kernel_source
    ck.kernel_source = lambda op: edit_source(real(op), variant)
    if variant.endswith("_l2"):
        ck.OPTIONS = ck.OPTIONS + L2_OPTIONS
    if waves:
        install_waves(variant, waves)


def exactness() -> dict:
    """tests/kernels/test_gpu_pdl.py's check, run as is: PDL launches (eager and from a graph) give plain launches'
    bits. {case: passed}."""
    from tests.kernels.test_gpu_pdl import test_pdl_launches_change_no_bit as check

    out = {}
    for dt, attention, fused in (("float32", "decode_attention", False), ("bfloat16", "decode_attention", True),
                                 ("bfloat16", "decode_attention_tc", True),
                                 ("bfloat16", "decode_attention_stream", True)):
        name = f"{dt} {attention}{' fused' if fused else ''}"
        out[name] = True
        try:
            check(fused, dt, attention)
        except AssertionError:
            out[name] = False
    return out


def stories_tokens():
    """The fp32 stories260K model's greedy tokens, PDL graphs against eager steps (None without the model)."""
    model = ROOT.parent / "shared" / "models" / "stories260K"
    if not model.is_dir():
        return None
    import numpy as np
    from tests.engine.test_gpu_engine import prompts, run_batch

    from toolkit.engine.build import build_engine
    from toolkit.engine.options import EngineOptions

    eng = build_engine(model, device="cuda", dtype="float32", max_context=256, kv_cache_tokens=256 * 40)
    reqs = prompts(np.random.default_rng(5), eng.cfg.vocab_size, 24)
    runs = {}
    for graphs in (True, False):
        eng.runner.graphs.clear()
        eng.set_options(EngineOptions(cuda_graphs=graphs, pdl=True))
        runs[graphs], _ = run_batch(eng, reqs, 48)
    diff = sum(a != b for a, b in zip(runs[True], runs[False]))
    return f"{diff} of {len(reqs)} requests differ"


def step_times(shapes, batches, context) -> dict:
    """µs of each shape's decode step (the engine's own plan, PDL on), replayed from a graph."""
    from decode_step import replay_us, uniform_step

    from toolkit.engine.build import build_engine

    out = {}
    for shape in shapes:
        e = build_engine(shape=shape, device="cuda", max_context=1024, max_num_seqs=max(batches),
                         kv_cache_tokens=max(batches) * 1024 + 1024)
        r = e.runner
        opts = e.effective_options()
        for B in batches:
            step, sb = uniform_step(r, B, context)
            body = r.graph_body(step, sb, r.model.plan(step, opts))
            body()  # eager first: workspaces and cuBLAS's algorithm choice stay outside the capture
            us, sd = replay_us(r.be, r.be.capture(body))
            out[f"{shape} b{B}"] = (round(us, 1), round(sd, 1))
            print(f"  {shape} batch {B}: {us:.1f} ± {sd:.1f} µs", flush=True)
        del e, r
    return out


def child(args):
    install(args.variant)
    t = time.time()
    res = {"variant": args.variant, "exact": exactness()}
    print(f"  exact (PDL against plain launches, bit for bit): {res['exact']}", flush=True)
    res["stories260K fp32, PDL graphs against eager"] = stories_tokens()
    print(f"  stories260K fp32: {res['stories260K fp32, PDL graphs against eager']}", flush=True)
    res["steps"] = step_times(args.shapes.split(","), [int(b) for b in args.batches.split(",")], args.context)
    res["seconds"] = round(time.time() - t, 1)
    print("RESULT " + json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="late,early,late_l2,early_l2,late")
    p.add_argument("--shapes", default="qwen2.5-0.5b,llama-3.2-1b,qwen2.5-1.5b")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--context", type=int, default=1)
    p.add_argument("--variant", help=argparse.SUPPRESS)  # a child's
    args = p.parse_args()
    if args.variant:
        return child(args)
    from toolkit.bench.env import environment

    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()), flush=True)
    results = []
    for v in args.variants.split(","):
        split_variant(v)
        print(f"== {v}", flush=True)
        cmd = [sys.executable, __file__, "--variant", v, "--shapes", args.shapes, "--batches", args.batches,
               "--context", str(args.context)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(proc.stdout[-2000:] + proc.stderr[-3000:], flush=True)
            continue
        print("\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("RESULT ")), flush=True)
        results.append(json.loads(lines[-1][7:]))
    if not results:
        return
    cells = list(results[0]["steps"])
    print("\n| variant | exact | stories260K | " + " | ".join(cells) + " |")
    print("|---|---|---|" + "---:|" * len(cells))
    for r in results:
        exact = "yes" if all(r["exact"].values()) else "NO: " + ", ".join(k for k, v in r["exact"].items() if not v)
        times = " | ".join(f"{r['steps'][c][0]:.1f}" if c in r["steps"] else "" for c in cells)
        print(f"| {r['variant']} | {exact} | {r['stories260K fp32, PDL graphs against eager']} | {times} |")


if __name__ == "__main__":
    main()
