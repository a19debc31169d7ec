"""The MLP block of a decode step at 2-32 rows, out = W_down SwiGLU(W_gate_up x), as the engine runs it with
stream_gemm off (cuBLAS gate_up, silu_mul, cuBLAS down: three kernels), with gemm_stream a projection (two), and
as mlp_stream (one kernel; kernels/gemm_stream.cu), weights from DRAM.

    python benchmarks/bench_mlp_stream.py [--shape qwen2.5-0.5b] [--rows 2,8,16,32] [--reps 7] [--splits 4,8,16]
        [--pdl]

Each timing is a CUDA graph of back-to-back MLP blocks (bench_kernels.time_calls), every block reading another
copy of the two weight matrices (at least 256 MB of copies in all), so the weights come from DRAM as in a decode
step. GB/s = the two matrices' bytes / time. "mlp_stream SxB2xNS" is mlp_stream with S slices of the down
projection's K, B2 blocks a slice and NS stages; "*" marks the engine's plan (cuda_gemm.mlp_plan). --pdl launches
our kernels with programmatic dependent launch, as a graph-replayed decode step does. The last column checks each
result against the first row's (max |difference| / max |value|).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_gemm_skinny import _bf16, _to_bf16  # noqa: E402
from bench_kernels import time_calls  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.backends.cuda_gemm import mlp_plan  # noqa: E402
from toolkit.bench.env import environment  # noqa: E402
from toolkit.shapes import NAMES, shape_config  # noqa: E402

POOL_BYTES = 256 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=NAMES)
    ap.add_argument("--rows", default="2,8,16,32")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--splits", default="", help="also time mlp_stream at these slicings of the down projection")
    ap.add_argument("--pdl", action="store_true", help="launch our kernels with PDL")
    ap.add_argument("--prof", action="store_true", help="print mlp_stream's phase stamps (needs "
                    "TOOLKIT_NVRTC_DEFINES=-DMLP_PROF)")
    args = ap.parse_args()
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    c = shape_config(args.shape)
    be = CudaBackend("bfloat16")
    be.bind_thread()
    if args.pdl:
        be = be.launching(True)
    k = be.kernels
    H, I = c.hidden_size, c.intermediate_size
    nbytes = 3 * H * I * 2
    copies = max(1, -(-POOL_BYTES // nbytes))
    gu0 = _to_bf16(cp.random.standard_normal((2 * I, H), cp.float32) * 0.02)
    d0 = _to_bf16(cp.random.standard_normal((H, I), cp.float32) * 0.02)
    pool = [(gu0.copy(), d0.copy()) for _ in range(copies)]  # distinct buffers of the same values: no L2 reuse
    print(f"{args.shape}: H {H}, I {I}, {nbytes / 1e6:.1f} MB of weights a block, {copies} copies")
    print(f"{'M':>3s} {'impl':24s} {'us':>8s} {'GB/s':>7s} {'rel err':>8s}")
    for M in map(int, args.rows.split(",")):
        x = _to_bf16(cp.random.standard_normal((M, H), cp.float32))
        gate_up, act = cp.empty((M, 2 * I), cp.uint16), cp.empty((M, I), cp.uint16)
        y = cp.empty((M, H), cp.uint16)
        ref = None
        it = {"i": 0}

        def cycle(f):
            def call():
                f(*pool[it["i"] % copies])
                it["i"] += 1
            return call

        def report(impl, f):
            nonlocal ref
            us = time_calls(cycle(f), args.reps, True, stream=be.stream)
            y.fill(0)
            f(*pool[0])
            be.stream.synchronize()
            out = _bf16(cp.asnumpy(y)).astype(np.float64)
            if ref is None:
                ref = out
            err = abs(out - ref).max() / max(abs(ref).max(), 1e-30)
            print(f"{M:3d} {impl:24s} {us:8.2f} {nbytes / us / 1e3:7.0f} {err:8.1e}", flush=True)

        def unfused(stream_gemm):
            def f(gu, d):
                be.linear_swiglu(x, gu, gate_up, act, False, False, stream_gemm)
                be.linear(act, d, y, False, False, stream_gemm)
            return f

        report("cublas+silu_mul+cublas", unfused(False))
        if 2 <= M <= 32 and be._stream_ok(M, 2 * I, H, swiglu=True) and be._stream_ok(M, H, I):
            report("gemm_stream x2", unfused(True))
        plan = mlp_plan(M, H, I, k.num_sms, k.smem_optin)
        if plan is None:
            continue
        NT, S, B2, NS = plan
        report(f"mlp_stream {S}x{B2}x{NS}*", lambda gu, d: k.mlp_stream(x, gu, d, act, y))
        if args.prof:
            phases(k, S * B2, lambda: k.mlp_stream(x, *pool[1], act, y))
        for s in (int(v) for v in args.splits.split(",") if v):
            sp = mlp_plan(M, H, I, k.num_sms, k.smem_optin, 2, s)
            if sp and s != S:
                report(f"mlp_stream {s}x{sp[2]}x{sp[3]}", lambda gu, d, s=s: k.mlp_stream(x, gu, d, act, y, s))
    return 0


def phases(k, blocks, launch):
    """One launch's per-block %globaltimer stamps (gemm_stream.cu's PROF): the median and max over blocks of
    each stamp, in us from the earliest block's start."""
    from toolkit.backends.cuda_kernels import _MODULES

    prof = _MODULES[("gemm_stream", k.ctype)].get_global("mlp_prof")
    stamps = cp.ndarray((1024, 8), cp.uint64, prof)
    stamps.fill(0)
    launch()
    cp.cuda.runtime.deviceSynchronize()
    s = cp.asnumpy(stamps[:blocks]).astype(np.int64)
    t0 = s[:, 0].min()
    names = ["start", "PDL wait done", "x staged", "phase 1 done", "grid barrier", "phase 2 done", "slices added"]
    for i, name in enumerate(names):
        col = s[:, i][s[:, i] > 0] - t0
        if col.size:
            print(f"    {name:16s} median {np.median(col) / 1e3:7.2f} us  max {col.max() / 1e3:7.2f} us")


if __name__ == "__main__":
    sys.exit(main())
