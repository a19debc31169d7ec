"""Batch-1 GEMV at the larger shapes: how many warps a weight row (wpr) and how many chunks a lane loads before the
PDL wait (GEMV_PF)?

gemv.cu gives a row of K inputs the most warps (up to 8) that leave each lane 2+ 16-byte chunks
(cuda_kernels.gemv_warps_per_row), so at Llama-3.2-1B's K = 2,048 a lane loads 2 chunks a row and a block lives
a few microseconds: gate_up is 4,096 blocks, about 6 waves. Fewer warps a row give each lane more loads in flight
and fewer, longer blocks. GEMV_PF = 4 chunks a lane are loaded before the PDL wait.

Part 1, alone: each projection as 40 calls replayed from one CUDA graph (plain launches), cycling over weight
copies past the L2, at wpr 1, 2, 4, 8 (GEMV_PF 4) and at the rule's wpr with GEMV_PF 8.
Part 2, in the step: the batch-1 decode step at context 1 captured and replayed (dev/decode_step.py) with the wpr
rule "each lane gets at least L chunks" for L = 2 (today), 4, 8, and with GEMV_PF 8.

    PYTHONPATH=. python3 dev/gemv_wpr.py [shapes]      (default llama-3.2-1b,qwen2.5-1.5b)
"""
import sys

import cupy as cp
import numpy as np

import toolkit.backends.cuda_kernels as ck
from decode_step import replay_us, uniform_step
from gemv_waves import PEAK_GBS, projection_cases
from timing import graph_us
from toolkit.engine.build import build_engine
from toolkit.engine.options import EngineOptions

RULE = ck.gemv_warps_per_row


def rule(min_chunks):
    """The wpr rule with each lane given at least min_chunks chunks (min_chunks = 2 is gemv_warps_per_row)."""
    def wpr(kc):
        w = 1
        while w < ck.GEMV_MAX_WPR and kc >= 32 * min_chunks * (2 * w):
            w *= 2
        return w
    return wpr


def pf_module(pf, ctype="__nv_bfloat16"):
    src = ck.kernel_source("gemv").replace("constexpr int GEMV_PF = 4;", f"constexpr int GEMV_PF = {pf};")
    assert f"GEMV_PF = {pf};" in src
    return cp.RawModule(code=src, options=ck.OPTIONS, name_expressions=ck.kernel_names("gemv", ctype))


def alone(shapes):
    k = ck.CudaKernels("bfloat16")
    pf8 = pf_module(8)
    cp.random.seed(0)
    print("| shape | projection | N x K | MB | rule wpr | wpr 1 | wpr 2 | wpr 4 | wpr 8 | rule, GEMV_PF 8 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        for name, N, K, op, mb, copies, x, n_out in projection_cases(shape):
            y = cp.empty((1, n_out), cp.uint16)
            fname = "gemv_swiglu<__nv_bfloat16, 1>" if op == "swiglu" else "gemv<__nv_bfloat16, __nv_bfloat16, 1>"
            fn = k._fn("gemv", fname)

            def time(f, wpr):
                grid = -(-n_out // (8 // wpr))
                t = graph_us(cp, lambda i: f((grid,), (256,), (x, copies[i % len(copies)], y, np.int32(n_out),
                                                               np.int32(K), np.int32(wpr))), n=40)
                return f"{t:.2f} ({mb * 1e3 / t / PEAK_GBS * 100:.0f}%)"

            cells = [time(fn, w) for w in (1, 2, 4, 8)]
            base = RULE(K // 8)
            print(f"| {shape} | {name} | {N} x {K} | {mb:.1f} | {base} | " + " | ".join(cells)
                  + f" | {time(pf8.get_function(fname), base)} |", flush=True)


def in_step(shapes):
    print("\n| shape | variant | batch-1 step µs | ± |")
    print("|---|---|---:|---:|")
    for shape in shapes:
        e = build_engine(shape=shape, device="cuda", max_context=1024, max_num_seqs=1, options=EngineOptions())
        r = e.runner
        be = r.be
        step, sb = uniform_step(r, 1, 1)
        plan = r.model.plan(step, e.effective_options())
        body = r.graph_body(step, sb, plan)
        kernels = be.kernels
        default_module = ck._module("gemv", kernels.ctype)
        variants = [("today (2+ chunks a lane, GEMV_PF 4)", RULE, default_module),
                    ("4+ chunks a lane", rule(4), default_module), ("8+ chunks a lane", rule(8), default_module),
                    ("GEMV_PF 8", RULE, pf_module(8)), ("4+ chunks a lane, GEMV_PF 8", rule(4), pf_module(8)),
                    ("today, again", RULE, default_module)]
        for name, wpr_rule, module in variants:
            ck.gemv_warps_per_row = wpr_rule
            ck._MODULES[("gemv", kernels.ctype)] = module
            for f in [n for n in kernels._fns if n.startswith("gemv")]:
                del kernels._fns[f]
            try:
                body()
                graph = be.capture(body)
            finally:
                ck.gemv_warps_per_row = RULE
                ck._MODULES[("gemv", kernels.ctype)] = default_module
            us, sd = replay_us(be, graph)
            print(f"| {shape} | {name} | {us:.1f} | {sd:.1f} |", flush=True)
        del e, r, be, body, graph
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    shapes = (sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b,qwen2.5-1.5b").split(",")
    alone(shapes)
    in_step(shapes)
