"""The projections of a prefill alone: cuBLAS as our backend calls it, against torch.matmul, in TFLOPS and % of the
dense bf16 peak (issue 36 asks for >= 70% at 4,096 tokens).

For each shape (toolkit/model/shapes.py) and token count M, the four projections of a layer, each y[M, N] =
x[M, K] @ W[N, K]^T in bf16 with fp32 accumulation: qkv (N = (q heads + 2 kv heads) x head dim, K = hidden), o
(N = hidden, K = q heads x head dim), gate_up (N = 2 x intermediate, K = hidden), down (N = hidden, K =
intermediate). Ours: --calls calls replayed from a CUDA graph on the backend's stream (dev/timing.py); torch: the
same count between CUDA events (toolkit/bench/sampler.py's torch_us; a call at these sizes is 20-700 µs, so launch
cost does not count); medians of --repeats. The last row of a shape is its layers' projections summed: the ms a
prefill of M tokens spends in them at these rates. `--lt` adds a column: cuBLASLt through nvmath-python's
`Matmul` with the best of its heuristic's algorithms by `autotune` (is there a faster algorithm than the one
gemmEx picks?), timed like torch.

    PYTHONPATH=. python3 dev/prefill_gemms.py [--shapes llama-3.2-1b,...] [--tokens 512,4096] [--peak 989] [--lt]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from timing import graph_us  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.bench.sampler import torch_us as torch_calls_us  # noqa: E402
from toolkit.model.shapes import NAMES, shape_config  # noqa: E402


def projections(cfg):
    H, D = cfg.hidden_size, cfg.head_dim
    return [("qkv", (cfg.num_heads + 2 * cfg.num_kv_heads) * D, H), ("o", H, cfg.num_heads * D),
            ("gate_up", 2 * cfg.intermediate_size, H), ("down", H, cfg.intermediate_size)]


def torch_us(M, N, K, calls, repeats, lt=False):
    """µs a call of y = x @ w.T on bf16 torch tensors, timed between events: torch.matmul, or with `lt` cuBLASLt's
    autotuned algorithm (nvmath-python's Matmul); None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    mm = None
    if lt:
        from nvmath.linalg.advanced import Matmul, MatmulPlanPreferences

        mm = Matmul(x, w.T)
        mm.plan(preferences=MatmulPlanPreferences(limit=16))
        mm.autotune(iterations=10)
    fn = mm.execute if mm else (lambda: x @ w.T)
    fn()
    us = statistics.median(torch_calls_us(torch, fn, calls) for _ in range(repeats))
    if mm:
        mm.free()
    return us


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(n for n in NAMES if n != "tiny"))
    ap.add_argument("--tokens", default="512,2048,4096")
    ap.add_argument("--peak", type=float, default=989.0, help="dense bf16 TFLOPS of the GPU (H100/H200 SXM: 989)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lt", action="store_true", help="add cuBLASLt with autotuned algorithms")
    args = ap.parse_args(argv)
    be = CudaBackend("bfloat16")
    dev = cp.cuda.Device()
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}; {be.gemm_note}")
    print(f"{'shape':14s} {'M':>5s} {'proj':8s} {'N':>6s} {'K':>6s} {'ours µs':>9s} {'TFLOPS':>7s} {'% peak':>7s} "
          f"{'torch µs':>9s} {'torch/ours':>10s}" + (f" {'Lt µs':>9s} {'Lt/ours':>8s}" if args.lt else ""))
    for shape in args.shapes.split(","):
        cfg = shape_config(shape)
        for M in map(int, args.tokens.split(",")):
            total_us = 0.0
            for name, N, K in projections(cfg):
                x = (cp.random.standard_normal((M, K), cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
                w = (cp.random.standard_normal((N, K), cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
                y = cp.empty((M, N), cp.uint16)
                us = graph_us(cp, lambda i: be.linear(x, w, y), args.calls, args.repeats, stream=be.stream)
                tf = 2 * M * N * K / (us * 1e-6) / 1e12
                t = torch_us(M, N, K, args.calls, args.repeats)
                try:
                    lt = torch_us(M, N, K, args.calls, args.repeats, lt=True) if args.lt else None
                except Exception as e:  # (a missing cuBLASLt, an nvmath without torch support) ends the column
                    print(f"cuBLASLt column left out: {type(e).__name__}: {e}")
                    lt = args.lt = None
                total_us += us
                print(f"{shape:14s} {M:5d} {name:8s} {N:6d} {K:6d} {us:9.1f} {tf:7.1f} {100 * tf / args.peak:6.1f}% "
                      + (f"{t:9.1f} {t / us:10.2f}" if t else "") + (f" {lt:9.1f} {lt / us:8.2f}" if lt else ""),
                      flush=True)
            flops = 2 * M * sum(N * K for _, N, K in projections(cfg))
            tf = flops / (total_us * 1e-6) / 1e12
            print(f"{shape:14s} {M:5d} {'layer':8s} {'':6s} {'':6s} {total_us:9.1f} {tf:7.1f} "
                  f"{100 * tf / args.peak:6.1f}%   x {cfg.num_layers} layers = {total_us * cfg.num_layers / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
