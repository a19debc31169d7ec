"""Where filter_sample (the sampler's fast path with processing) spends its time, stage by stage and select level
by level: a copy of kernels/sampler.cu with clock64() stamps at the stage boundaries of row 0's block (thread 0,
after the barriers that end each stage), run through `bench sampler`'s cases. No hardware counters needed.

    PYTHONPATH=. python3 dev/profile_filter.py [--batch 1,128] [--variant lane_chunks|no_chunk_max]

Prints, per setting and batch, the kernel's graph-timed µs and the µs between stamps (at the SM clock), the
16-bit queue's length (tokens that can win the draw) and each select level's interval search, bin scan and digit
pick. --variant times an edited copy (VARIANTS: the designs measured against); a stale edit stops the run.
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
    ("        unsigned tot = 0;\n        bool nan = false;\n", True, "histogram pass"),
    ("        h16 = s.nq == (unsigned)(V - nh);  // else a count overflowed: the general route\n", False, "max + totals"),
    ("    bool listed = false;\n", True, "selects (16-bit)"),
    ("    // 3. Gumbel-max over the survivors\n", True, "selects (other routes)"),
    ("            di = qtok;\n", True, "queue pass"),
    ("    if (threadIdx.x == 0) out[r] = (int)~(unsigned)s.best;\n}\n", True, "draw"),
]


VARIANTS = {  # name -> (old, new) edits of kernels/sampler.cu, each old text matching exactly once
    "lane_chunks": [  # select_key16's level scan as it was: a chunk of words a warp, lane-interleaved
        ("            const unsigned w0 = klo >> 1, w1 = (khi + 1) >> 1;\n",
         "            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
         "            const unsigned w0 = klo >> 1, w1 = (khi + 1) >> 1, per = ((w1 - w0 + nw - 1) / nw + 31) & ~31u;\n"
         "            const unsigned a0 = w0 + warp * per, a1 = min(w1, a0 + per);\n"),
        ("            for (unsigned w = w0 + threadIdx.x; w < w1; w += blockDim.x) {\n"
         "                const unsigned hw = hist[w];\n",
         "            for (unsigned w = a0 + lane; w < a1; w += 32) {\n"
         "                const unsigned hw = hist[w];\n"),
    ],
    "no_chunk_max": [  # the queue pass tests every value, as it did
        ("            }, [&](uint4 c) { return chunk_max<T>(c) >= ymin; });\n", "            }, [](uint4) { return true; });\n"),
    ],
}


def edited(src: str, variant: str) -> str:
    for old, new in VARIANTS.get(variant, []):
        if src.count(old) != 1:
            raise SystemExit(f"variant {variant}: stale edit {old[:60]!r}")
        src = src.replace(old, new)
    return src


LEVEL = "if (threadIdx.x == 0 && blockIdx.x == 0 && g_nl < 64) g_lv[g_nl++] = clock64();"
LEVEL_STAGES = [  # inside select_key16, per level: start, the interval found, the bins scanned, the digit picked
    ("        for (int b = threadIdx.x; b < NB; b += blockDim.x) { s.cnt[b] = 0; s.ms[b] = 0; }\n", True),
    ("        const unsigned klo = s.klo, khi = s.khi;  // [klo, khi)\n", True),
    ("        auto add = [&](bool valid, float y) {  // a history entry, as in select_key\n", True),
    ("        pmask |= (NB - 1u) << shift;\n", False),
]


def stamped(src: str) -> str:
    head = "__device__ unsigned long long g_stamp[16], g_lv[64];\n__device__ unsigned g_queue, g_nl;\n"
    a = src.index("__device__ unsigned select_key16(")
    b = src.index("\n}\n", a)
    body = src[a:b]
    for anchor, before in LEVEL_STAGES:
        if body.count(anchor) != 1:
            raise SystemExit(f"stale anchor in select_key16: {anchor!r}")
        stamp = "        " + LEVEL + "\n"
        body = body.replace(anchor, stamp + anchor if before else anchor + stamp)
    src = src[:a] + body + src[b:]
    for n, (anchor, before, _) in enumerate(STAGES):
        if src.count(anchor) != 1:
            raise SystemExit(f"stale anchor for stage {n}: {anchor!r}")
        stamp = " " * (len(anchor) - len(anchor.lstrip())) + STAMP.format(n) + "\n"
        src = src.replace(anchor, stamp + anchor if before else anchor + stamp)
    src = src.replace("            di = qtok;\n", "            if (threadIdx.x == 0 && blockIdx.x == 0) g_queue = s.nq;\n"
                      "            di = qtok;\n")
    return src.replace("constexpr int FILTER_THREADS", head + "constexpr int FILTER_THREADS", 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", default="1,128")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--variant", default="", choices=["", *VARIANTS])
    a = p.parse_args()
    original = cuda_kernels.kernel_source
    cuda_kernels.kernel_source = lambda op: stamped(edited(original(op), a.variant)) if op == "sampler" else original(op)
    import cupy as cp

    be = make_backend("cuda", "bfloat16")
    print(f"variant: {a.variant or 'kernels/sampler.cu as it is'}")
    khz = cp.cuda.Device().attributes["ClockRate"]
    print(f"SM clock (nominal) {khz / 1e3:.0f} MHz; µs between stamps of row 0's block, median of 5 launches")
    modes = [m for m, (prm, fast, _, _) in MODES.items() if fast and ("top" in m or "default" in m)]
    for B in (int(b) for b in a.batch.split(",")):
        for mode in modes:
            params, fast, shape, history = MODES[mode]
            row = bench_case(be, a.vocab, B, params, fast, shape, 20, 3, history)
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
            # the last run's first launch: 4 levels a select (top-k, then top-p), 4 stamps a level
            per = 4 * ((0 < params.get("top_k", 0) < a.vocab) + (params.get("top_p", 1.0) < 1.0))
            levels = [t[i:i + 4] for i in range(0, min(n, 4 * per), 4)]
            print("   select levels (interval, bins, pick µs): " + "; ".join(
                "/".join(f"{(y - x) / khz * 1e3:.1f}" for x, y in zip(lv4[:-1], lv4[1:])) for lv4 in levels))


if __name__ == "__main__":
    main()
