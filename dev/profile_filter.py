"""Where filter_sample (the sampler's fast path with processing) spends its time, stage by stage and select level
by level: a copy of kernels/sampler.cu with clock64() stamps at the stage boundaries of row 0's block (thread 0,
after the barriers that end each stage), run through `bench sampler`'s cases. No hardware counters needed.

    PYTHONPATH=. python3 dev/profile_filter.py [--batch 1,128] [--variant no_early_exit] [--source FILE]

Prints, per setting and batch, the kernel's graph-timed µs and the µs between stamps (at the SM clock), the
number of groups of 4 tokens queued for their fine Philox call, and each select level's bin scan, history scan
and digit pick. --variant times an edited copy (VARIANTS: the designs measured against); a
stale edit stops the run. --source times another sampler.cu (`git show <commit>:kernels/sampler.cu > FILE`: an
earlier design, graph-timed only, no stamps).
"""
import argparse

import numpy as np

from toolkit.backends import make_backend
from toolkit.backends import cuda_kernels
from toolkit.bench.sampler import MODES, bench_case

STAMP = "if (threadIdx.x == 0 && blockIdx.x == 0) g_stamp[{}] = clock64();"
STAGES = [  # (anchor, stamp before (True) or after it, the stage that ends there)
    ("    if (!(sample_temp[r] < 0.f)) return;\n", False, "start"),
    ("    const int nh = min((int)s.nh, HIST_CAP);\n", False, "history"),
    ("        unsigned tot = 0;\n        int km = -1;", True, "histogram pass"),
    ("    // fp32 logits: the fp32 route, its coarse", True, "totals, max and its index"),
    ("    bool listed = false;\n", True, "selects (16-bit)"),
    ("    // 3. Gumbel-max over the survivors\n", True, "selects (other routes)"),
    ("            for (int j = threadIdx.x; j < (int)min(s.nq, QCAP); j += blockDim.x) fine(qw[j], qi[j]);\n",
     True, "queue pass"),
    ("    if (threadIdx.x == 0) out[r] = (int)~(unsigned)s.best;\n}\n", True, "draw"),
]


VARIANTS = {  # name -> (old, new) edits of kernels/sampler.cu, each old text matching exactly once
    "no_early_exit": [  # select_key16 runs all four levels, as it did
        ("        if (only) return ord_key(val16<T>(lo));\n", ""),
    ],
}


def edited(src: str, variant: str) -> str:
    for old, new in VARIANTS.get(variant, []):
        if src.count(old) != 1:
            raise SystemExit(f"variant {variant}: stale edit {old[:60]!r}")
        src = src.replace(old, new)
    return src


LEVEL = "if (threadIdx.x == 0 && blockIdx.x == 0 && g_nl < 64) {{ g_lv[g_nl] = clock64(); g_tag[g_nl++] = {}; }}"
LEVEL_STAGES = [  # inside select_key16, per level: (anchor, stamp before it, what ends there)
    ("        for (int b = threadIdx.x; b < NB; b += blockDim.x) {\n", True, "start"),
    ("        for (int h0 = 0; h0 < nh; h0 += blockDim.x) {  // history entries, as in select_key; also counted in rc\n",
     True, "bins"),
    ("        if (mass && level == 0 && threadIdx.x < 32) target = (double)p * (double)digit_mass(s);\n", True, "history"),
    ("        pmask |= (NB - 1u) << shift;\n", False, "pick"),
]


def stamped(src: str) -> str:
    head = "__device__ unsigned long long g_stamp[16], g_lv[64];\n__device__ unsigned g_queue, g_nl, g_tag[64];\n"
    a = src.index("__device__ unsigned select_key16(")
    b = src.index("\n}\n", a)
    body = src[a:b]
    for tag, (anchor, before, _) in enumerate(LEVEL_STAGES):
        if body.count(anchor) != 1:
            raise SystemExit(f"stale anchor in select_key16: {anchor!r}")
        stamp = " " * (len(anchor) - len(anchor.lstrip())) + LEVEL.format(tag) + "\n"
        body = body.replace(anchor, stamp + anchor if before else anchor + stamp)
    src = src[:a] + body + src[b:]
    for n, (anchor, before, _) in enumerate(STAGES):
        if src.count(anchor) != 1:
            raise SystemExit(f"stale anchor for stage {n}: {anchor!r}")
        stamp = " " * (len(anchor) - len(anchor.lstrip())) + STAMP.format(n) + "\n"
        src = src.replace(anchor, stamp + anchor if before else anchor + stamp)
    anchor = STAGES[6][0]
    src = src.replace(anchor, "            if (threadIdx.x == 0 && blockIdx.x == 0) g_queue = s.nq;\n" + anchor)
    return src.replace("constexpr int FILTER_THREADS", head + "constexpr int FILTER_THREADS", 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", default="1,128")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--variant", default="", choices=["", *VARIANTS])
    p.add_argument("--source", help="time this sampler.cu instead, unstamped")
    a = p.parse_args()
    original = cuda_kernels.kernel_source
    if a.source:
        other = cuda_kernels.inline_headers(open(a.source).read())
        cuda_kernels.kernel_source = lambda op: other if op == "sampler" else original(op)
    else:
        cuda_kernels.kernel_source = lambda op: stamped(edited(original(op), a.variant)) if op == "sampler" else original(op)
    import cupy as cp

    be = make_backend("cuda", "bfloat16")
    print(f"variant: {a.source or a.variant or 'kernels/sampler.cu as it is'}")
    khz = cp.cuda.Device().attributes["ClockRate"]
    print(f"SM clock (nominal) {khz / 1e3:.0f} MHz; µs between stamps of row 0's block, median of 5 launches")
    modes = [m for m, (prm, fast, _, _) in MODES.items() if fast and ("top" in m or "default" in m)]
    for B in (int(b) for b in a.batch.split(",")):
        for mode in modes:
            params, fast, shape, history = MODES[mode]
            row = bench_case(be, a.vocab, B, params, fast, shape, 20, 3, history)
            if a.source:
                print(f"B={B:4d} {mode}: kernel {row['graph_us']:.1f} µs/step (graph)")
                continue
            mod = next(m for (op, _), m in cuda_kernels._MODULES.items() if op == "sampler")
            g = mod.get_global("g_stamp")
            stamps = cp.ndarray((16,), cp.uint64, g)
            q = cp.ndarray((1,), cp.uint32, mod.get_global("g_queue"))
            lv = cp.ndarray((64,), cp.uint64, mod.get_global("g_lv"))
            nl = cp.ndarray((1,), cp.uint32, mod.get_global("g_nl"))
            runs = []
            for _ in range(5):
                stamps[:] = 0
                nl[:] = 0
                row2 = bench_case(be, a.vocab, B, params, fast, shape, 2, 1, history)
                s = stamps.get().astype(np.int64)
                runs.append([(s[i + 1] - s[i]) / khz * 1e3 if s[i + 1] and s[i] else float("nan")
                             for i in range(len(STAGES) - 1)])
            med = np.nanmedian(np.array(runs), axis=0) if runs else []
            parts = ", ".join(f"{STAGES[i + 1][2]} {v:.1f}" for i, v in enumerate(med) if v == v)
            if B == 1 and mode == modes[0]:
                fn = mod.get_function("filter_sample<__nv_bfloat16>")
                print(f"filter_sample<bf16>: {fn.num_regs} registers, {fn.local_size_bytes} bytes local (spills)")
            print(f"B={B:4d} {mode}: kernel {row['graph_us']:.1f} µs/step (graph); queue {int(q.get()[0])}; {parts}")
            del row2
            n, t = int(nl.get()[0]), lv.get().astype(np.int64)
            tags = cp.ndarray((64,), cp.uint32, mod.get_global("g_tag")).get()
            # the last run's first launch: each level's steps, µs since the stamp before ("start": a new level)
            print("   select levels, µs: " + " ".join(
                ("|" if tags[i] == 0 else f"{LEVEL_STAGES[tags[i]][2]} {(t[i] - t[i - 1]) / khz * 1e3:.1f}")
                for i in range(1, n)))


if __name__ == "__main__":
    main()
