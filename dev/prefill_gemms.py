"""The projections of a prefill alone: cuBLAS as our backend calls it, against torch.matmul, in TFLOPS and % of the
dense bf16 peak (issue 36 asks for >= 70% at 4,096 tokens).

For each shape (toolkit/model/shapes.py) and token count M, the four projections of a layer, each y[M, N] =
x[M, K] @ W[N, K]^T in bf16 with fp32 accumulation: qkv (N = (q heads + 2 kv heads) x head dim, K = hidden), o
(N = hidden, K = q heads x head dim), gate_up (N = 2 x intermediate, K = hidden), down (N = hidden, K =
intermediate). Ours: `linear` (gemmEx) and `linear_tuned` (the plan's "tuned" projections: the cuBLAS algorithm
measured fastest for the shape's row bucket, toolkit/backends/cuda_tuned.py; measured by its first call, outside
the graph), each --calls calls replayed from a CUDA graph on the backend's stream (dev/timing.py); torch: the same
count between CUDA events (toolkit/bench/sampler.py's torch_us; a call at these sizes is 20-700 µs, so launch cost
does not count); medians of --repeats. `choice` is what the tuned call runs, and `cands` the measurement it came
from (µs: gemmEx first, then cuBLASLt's heuristic candidates in its order). The last row of a shape is its layers'
projections summed: the ms a prefill of M tokens spends in them at these rates.

    PYTHONPATH=. python3 dev/prefill_gemms.py [--shapes llama-3.2-1b,...] [--tokens 512,4096] [--peak 989]
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from timing import bf16_random, gemm_parser, graph_us  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.bench.sampler import torch_us as torch_calls_us  # noqa: E402
from toolkit.model.shapes import shape_config  # noqa: E402


def projections(cfg):
    H, D = cfg.hidden_size, cfg.head_dim
    return [("qkv", (cfg.num_heads + 2 * cfg.num_kv_heads) * D, H), ("o", H, cfg.num_heads * D),
            ("gate_up", 2 * cfg.intermediate_size, H), ("down", H, cfg.intermediate_size)]


def torch_us(M, N, K, calls, repeats):
    """µs a call of y = x @ w.T on bf16 torch tensors (torch.matmul) timed between events; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    fn = lambda: x @ w.T  # noqa: E731
    fn()
    return statistics.median(torch_calls_us(torch, fn, calls) for _ in range(repeats))


def main(argv=None):
    args = gemm_parser(__doc__, "512,2048,4096").parse_args(argv)
    be = CudaBackend("bfloat16")
    dev = cp.cuda.Device()
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}; {be.gemm_note}")
    print(f"{'shape':14s} {'M':>5s} {'proj':8s} {'N':>6s} {'K':>6s} {'ours µs':>9s} {'TFLOPS':>7s} {'% peak':>7s} "
          f"{'torch µs':>9s} {'torch/ours':>10s} {'tuned µs':>9s} {'tuned/ours':>10s}  choice; cands")
    for shape in args.shapes.split(","):
        cfg = shape_config(shape)
        for M in map(int, args.tokens.split(",")):
            total_us = total_tuned = 0.0
            for name, N, K in projections(cfg):
                x, w = bf16_random(cp, (M, K)), bf16_random(cp, (N, K))
                y = cp.empty((M, N), cp.uint16)
                cp.cuda.Device().synchronize()
                us = graph_us(cp, lambda i: be.linear(x, w, y), args.calls, args.repeats, stream=be.stream)
                tuned = graph_us(cp, lambda i: be.linear_tuned(x, w, y), args.calls, args.repeats, stream=be.stream)
                choice = be._tuned.choice(N, M, K, be._in_type, be._in_type) if be._tuned else None
                tf = 2 * M * N * K / (us * 1e-6) / 1e12
                t = torch_us(M, N, K, args.calls, args.repeats)
                total_us, total_tuned = total_us + us, total_tuned + tuned
                cands = " ".join(f"{c:.1f}" for c in choice.times_us) if choice else ""
                print(f"{shape:14s} {M:5d} {name:8s} {N:6d} {K:6d} {us:9.1f} {tf:7.1f} {100 * tf / args.peak:6.1f}% "
                      + (f"{t:9.1f} {t / us:10.2f}" if t else f"{'':9s} {'':10s}")
                      + f" {tuned:9.1f} {tuned / us:10.2f}  {choice.describe() if choice else '-'}; {cands}",
                      flush=True)
            flops = 2 * M * sum(N * K for _, N, K in projections(cfg))
            tf = flops / (total_us * 1e-6) / 1e12
            print(f"{shape:14s} {M:5d} {'layer':8s} {'':6s} {'':6s} {total_us:9.1f} {tf:7.1f} "
                  f"{100 * tf / args.peak:6.1f}%   x {cfg.num_layers} layers = {total_us * cfg.num_layers / 1e3:.2f} ms;"
                  f" tuned {total_tuned * cfg.num_layers / 1e3:.2f} ms ({total_tuned / total_us:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
