"""Time the sampler's CUDA kernels (kernels/sampler.cu) at B in {1, 32, 128}, V = 151,936, bf16 logits, and the
PyTorch reference operations in the same run when torch is importable.

    python dev/bench_sampler_kernels.py [--reps 5] [--calls 100]

Each number is GPU microseconds per call: CUDA events around one replay of a CUDA graph of `calls` back-to-back
launches, the median of `reps` replays (launch overhead is not in it). In-place ops are timed together with the
to_fp32 copy that feeds them (each call then sees fresh logits), as the sampler's slow path runs them.
Logits: "llm" = N(0, 2) bulk plus 40 tokens raised by 4..14 (a language model's shape: a few likely tokens);
"dense" = N(0, 1) (every token a contender: the worst case for the Gumbel kernel's noise skipping).
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from toolkit.backends.cuda_sampler import CudaSamplerKernels  # noqa: E402

V = 151936


def graph_us(fn, calls, reps, stream):
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        times = []
        for _ in range(reps + 1):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            graph.launch(stream)
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1000 / calls)
    return statistics.median(times[1:])


def torch_us(fn, calls, reps):
    import torch

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        run = lambda: [fn() for _ in range(calls)]  # noqa: E731
        mode = "graph"
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                run()
            run = g.replay
        except Exception:  # (multinomial may refuse capture on some versions)
            torch.cuda.synchronize()
            mode = "eager"
        times = []
        for _ in range(reps + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            run()
            b.record(stream)
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times[1:]), mode


def logits(rng, B, kind):
    x = rng.standard_normal((B, V)).astype(np.float32)
    if kind == "llm":
        x *= 2
        top = rng.integers(0, V, (B, 40))
        np.put_along_axis(x, top, np.take_along_axis(x, top, 1) + rng.uniform(4, 14, top.shape), 1)
    import ml_dtypes

    return cp.asarray(x.astype(ml_dtypes.bfloat16).view(np.uint16))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"GPU: {props['name'].decode()}  driver {cp.cuda.runtime.driverGetVersion()}  CUDA runtime "
          f"{cp.cuda.runtime.runtimeGetVersion()}  CuPy {cp.__version__}")
    try:
        import torch

        print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda})")
    except ImportError:
        torch = None
        print("PyTorch: not importable (no reference column)")
    print(f"\nV = {V}, bf16 logits; GPU us per call (graph of {args.calls} calls, median of {args.reps})\n")
    k = CudaSamplerKernels("bfloat16")
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    rows = []
    for B in (1, 32, 128):
        with stream:
            x = {kind: logits(rng, B, kind) for kind in ("llm", "dense")}
            x32 = cp.empty((B, V), cp.float32)
            out = cp.zeros(B, cp.int32)
            seeds = cp.asarray(rng.integers(0, 2 ** 32, (B, 2), dtype=np.uint64).astype(np.uint32))
            pos = cp.arange(B, dtype=cp.int32)
            t0, t1 = cp.zeros(B, cp.float32), cp.ones(B, cp.float32)
            t07, mp = cp.full(B, 0.7, cp.float32), cp.full(B, 0.05, cp.float32)
            k50, p09 = cp.full(B, 50, cp.int32), cp.full(B, 0.9, cp.float32)
            koff, p1 = cp.zeros(B, cp.int32), cp.ones(B, cp.float32)
            n = 5
            lp_out = (cp.zeros((B, n), cp.int32), cp.zeros((B, n), cp.float32), cp.zeros(B, cp.float32),
                      cp.zeros(B, cp.int32))
        k.reserve(B)

        def fp32(kind="llm"):
            k.to_fp32(x[kind], x32)

        ops = [
            ("gumbel greedy (bf16 in)", lambda: k.gumbel_sample(x["llm"], t0, seeds, pos, out)),
            ("gumbel T=1 (bf16 in), llm logits", lambda: k.gumbel_sample(x["llm"], t1, seeds, pos, out)),
            ("gumbel T=1 (bf16 in), dense logits", lambda: k.gumbel_sample(x["dense"], t1, seeds, pos, out)),
            ("gumbel T=0.7 (bf16 in), llm logits", lambda: k.gumbel_sample(x["llm"], t07, seeds, pos, out)),
            ("to_fp32", fp32),
            ("to_fp32 + temperature_min_p(0.7, 0.05)", lambda: (fp32(), k.temperature_min_p(x32, t07, mp))),
            ("to_fp32 + top_k_top_p(50, 0.9)", lambda: (fp32(), k.top_k_top_p(x32, k50, p09))),
            ("to_fp32 + top_k_top_p(50, off)", lambda: (fp32(), k.top_k_top_p(x32, k50, p1))),
            ("to_fp32 + top_k_top_p(off, 0.9)", lambda: (fp32(), k.top_k_top_p(x32, koff, p09))),
            ("to_fp32 + top_k_top_p(50, 0.9), dense", lambda: (fp32("dense"), k.top_k_top_p(x32, k50, p09))),
            ("gumbel T=1 on fp32 copy", lambda: k.gumbel_sample(x32, t1, seeds, pos, out)),
            (f"logprobs n={n} (bf16 in)", lambda: k.logprobs(x["llm"], out, n, *lp_out)),
        ]
        for name, fn in ops:
            rows.append((name, B, graph_us(fn, args.calls, args.reps, stream), "graph"))
            print(f"  B={B:<4} {name:<42} {rows[-1][2]:9.1f} us", flush=True)
        if torch is not None:
            xt = torch.as_tensor(x["llm"].view(cp.int16), device="cuda").view(torch.bfloat16)
            x32t = xt.float()
            tops = [
                ("torch empty_like(float32).copy_", lambda: torch.empty_like(xt, dtype=torch.float32).copy_(xt)),
                ("torch bf16 argmax", lambda: xt.argmax(-1)),
                ("torch softmax + multinomial fp32", lambda: torch.multinomial(torch.softmax(x32t, -1), 1)),
                ("torch sort fp32", lambda: torch.sort(x32t, -1, descending=True)),
            ]
            for name, fn in tops:
                us, mode = torch_us(fn, args.calls, args.reps)
                rows.append((name, B, us, mode))
                print(f"  B={B:<4} {name:<42} {us:9.1f} us ({mode})", flush=True)

    names = list(dict.fromkeys(r[0] for r in rows))
    table = {(r[0], r[1]): r for r in rows}
    print("\n| op | B=1 (us) | B=32 (us) | B=128 (us) |\n|---|---:|---:|---:|")
    for name in names:
        cells = []
        for B in (1, 32, 128):
            r = table.get((name, B))
            cells.append("" if r is None else f"{r[2]:.1f}" + ("" if r[3] == "graph" else f" ({r[3]})"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
