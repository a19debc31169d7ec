"""gemm_small (tensor cores, 2-32 rows) against cuBLAS and torch at the decode projections, weights from DRAM.

    python benchmarks/bench_gemm_small.py [--shape qwen2.5-0.5b] [--rows 2,8,16,32] [--reps 7]

Each timing is a CUDA graph of back-to-back calls (bench_kernels.time_calls), but every call reads another copy
of the weight matrix (at least 256 MB of copies in all), so the weights come from DRAM as in a decode step (24
layers x 30 MB) instead of from the 50 MB L2. GB/s = weight bytes / time. The slices column sweeps gemm_small's
split of K; "auto" is what the engine uses (cuda_gemm.gemm_small_slices). The first column checks each result
against cuBLAS's (max |difference| / max |value|).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from bench_kernels import time_calls  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.backends.cuda_gemm import gemm_small_slices  # noqa: E402
from toolkit.shapes import NAMES, shape_config  # noqa: E402

POOL_BYTES = 256 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=NAMES)
    ap.add_argument("--rows", default="1,2,8,16,32")
    ap.add_argument("--slices", default="1,2,4,7,14,19")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rt = cp.cuda.runtime
    print(f"GPU: {rt.getDeviceProperties(0)['name'].decode()}  driver API {rt.driverGetVersion()}  "
          f"CuPy {cp.__version__}  CUDA runtime {rt.runtimeGetVersion()}")
    try:
        import torch

        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    c = shape_config(args.shape)
    be = CudaBackend("bfloat16")
    be.bind_thread()
    k = be.kernels
    n_sm = rt.getDeviceProperties(0)["multiProcessorCount"]
    H, I, Q = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim
    shapes = (("qkv", c.qkv_size, H), ("o_proj", H, Q), ("gate_up", 2 * I, H), ("down", H, I),
              ("lm_head", c.vocab_size, H))
    print(f"{'op':8s} {'M':>3s} {'N':>7s} {'K':>5s} {'impl':16s} {'us':>8s} {'GB/s':>7s} {'rel err':>8s}")
    for name, N, K in shapes:
        nbytes = N * K * 2
        copies = max(1, -(-POOL_BYTES // nbytes))
        w0 = _to_bf16(cp.random.standard_normal((N, K), cp.float32) * 0.02)
        ws = [w0.copy() for _ in range(copies)]  # distinct buffers of the same values: no L2 reuse
        for M in map(int, args.rows.split(",")):
            x = _to_bf16(cp.random.standard_normal((M, K), cp.float32))
            y = cp.empty((M, N), cp.uint16)
            ref = cp.empty((M, N), cp.uint16)
            be.linear(x, ws[0], ref)
            refv = cp.asnumpy(ref)
            it = {"i": 0}

            def cycle(f):
                def call():
                    f(ws[it["i"] % copies])
                    it["i"] += 1
                return call

            def report(impl, us, out=None):
                err = ""
                if out is not None:
                    a = _bf16(cp.asnumpy(out)).astype("float64")
                    b = _bf16(refv).astype("float64")
                    err = f"{abs(a - b).max() / max(abs(b).max(), 1e-30):8.1e}"
                print(f"{name:8s} {M:3d} {N:7d} {K:5d} {impl:16s} {us:8.2f} {nbytes / us / 1e3:7.0f} {err}",
                      flush=True)

            us = time_calls(cycle(lambda w: be.linear(x, w, y)), args.reps, True, stream=be.stream)
            report("cublas", us)
            if M == 1:  # the batch-1 GEMV the engine uses at one row
                report("gemv", time_calls(cycle(lambda w: k.gemv(x, w, y)), args.reps, True, stream=be.stream), y)
            auto = gemm_small_slices(N, K, n_sm)
            for s in [None] + [int(v) for v in args.slices.split(",")]:
                if s is not None and (s > K // 64 or s == auto or N > 32768):  # the lm_head: the plan's split only
                    continue
                us = time_calls(cycle(lambda w, s=s: k.gemm_small(x, w, y, s)), args.reps, True, stream=be.stream)
                report(f"gemm_small s={s or auto}{'*' if s is None else ''}", us, y)
            if has_torch:
                tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                tws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                ti = {"i": 0}

                def tcall():
                    tx @ tws[ti["i"] % copies].T
                    ti["i"] += 1
                report("torch", time_calls(tcall, args.reps, True, "torch"))
                del tws
        del ws
    return 0


def _to_bf16(a):
    """fp32 CuPy array -> bf16 bits (uint16, truncated: fine for timing and for comparing two kernels)."""
    return (a.view(cp.uint32) >> 16).astype(cp.uint16)


def _bf16(a):
    import numpy as np

    return (a.astype(np.uint32) << 16).view(np.float32)


if __name__ == "__main__":
    sys.exit(main())
