"""The down projection at 2-32 rows: cuBLAS's split-K (a GEMM kernel, then its reduce kernel) against a strided-
batched GEMM over S slices of K that leaves S fp32 partial products for the next add_rmsnorm to add.

    PYTHONPATH=. python dev/down_partials.py [--shape qwen2.5-0.5b] [--rows 8,16,32] [--slices 1,2,4,8,16]

Each timing is a CUDA graph of back-to-back calls (bench_kernels.N_CALLS), each on another copy of the weights
(weights from DRAM, as in a decode step; bench_kernels.cycling and time_calls). "+norm" rows time the pair the
step runs: the projection, then the add_rmsnorm that takes its output (the bf16 row, or the S partials).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_gemm_skinny import _bf16, _to_bf16, projection_args, projection_backend, weight_copies  # noqa: E402
from bench_kernels import cycling, time_calls  # noqa: E402


def main():
    ap = projection_args("8,16,32")
    ap.add_argument("--slices", default="1,2,4,8,16")
    args = ap.parse_args()
    c, be = projection_backend(args.shape)
    H, I = c.hidden_size, c.intermediate_size
    ws = weight_copies(_to_bf16(cp.random.standard_normal((H, I), cp.float32) * 0.02))
    norm_w = _to_bf16(cp.random.standard_normal(H, cp.float32) * 0.1 + 1)
    print(f"{'rows':>4s} {'impl':24s} {'us':>8s} {'rel err':>8s}")
    for M in map(int, args.rows.split(",")):
        x = _to_bf16(cp.random.standard_normal((M, I), cp.float32))
        y = cp.empty((M, H), cp.uint16)
        h0 = _to_bf16(cp.random.standard_normal((M, H), cp.float32))
        h, xo = h0.copy(), cp.empty((M, H), cp.uint16)
        be.linear(x, ws[0], y)
        ref = _bf16(cp.asnumpy(y)).astype(np.float64)
        def report(impl, us, got=None):
            err = ""
            if got is not None:
                err = f"{abs(got - ref).max() / abs(ref).max():8.1e}"
            print(f"{M:4d} {impl:24s} {us:8.2f} {err}", flush=True)

        def t(f):
            return time_calls(cycling(f, ws), args.reps, True, stream=be.stream)

        report("gemmEx bf16", t(lambda w: be.linear(x, w, y)))
        report("gemmEx bf16 +norm", t(lambda w: (be.linear(x, w, y), be.add_rmsnorm(y, h, norm_w, 1e-6, xo))))
        for S in map(int, args.slices.split(",")):
            if I % S or (I // S) % 8:
                continue
            parts = cp.empty((S, M, H), cp.float32)
            be.linear_partials(x, ws[0], parts)
            be.stream.synchronize()
            report(f"strided S={S} fp32", t(lambda w: be.linear_partials(x, w, parts)),
                   cp.asnumpy(parts).astype(np.float64).sum(0))
            report(f"strided S={S} +norm", t(lambda w: (be.linear_partials(x, w, parts),
                                                       be.add_rmsnorm_partials(parts, h, norm_w, 1e-6, xo))))
        # the partials' norm against the plain one: same h in, same bits out?
        parts = cp.empty((4, M, H), cp.float32)
        be.linear_partials(x, ws[0], parts)
        ha, hb = h0.copy(), h0.copy()
        oa, ob = cp.empty_like(xo), cp.empty_like(xo)
        acc = parts[0].copy()
        for s in range(1, 4):  # in slice order, as the kernel adds them
            acc += parts[s]
        yb = _to_bf16_rn(acc)
        be.add_rmsnorm(yb, ha, norm_w, 1e-6, oa)
        be.add_rmsnorm_partials(parts, hb, norm_w, 1e-6, ob)
        be.stream.synchronize()
        print(f"{M:4d} partials norm == plain norm on the same sum: h {bool((ha == hb).all())}, "
              f"out {bool((oa == ob).all())}")
    return 0


def _to_bf16_rn(a):
    """fp32 -> bf16 bits, round to nearest even (as the kernels' from_f32)."""
    u = a.astype(cp.float32).view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


if __name__ == "__main__":
    sys.exit(main())
