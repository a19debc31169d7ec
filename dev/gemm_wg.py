"""A decode step's gate_up projection with SwiGLU in its epilogue (gemm_wg_swiglu, kernels/gemm_wg.cu) against the
two kernels it replaces: the gate_up GEMM (cuBLAS: `linear`, gemmEx, and `linear_tuned`, the algorithm the plan's
"tuned" projections measured fastest) followed by silu_mul.

For each shape (toolkit/model/shapes.py) and row count M (1-128): x [M, hidden] and gate_up [2I, hidden] random
bf16; first the outputs (gemm_wg_swiglu's against linear + silu_mul's: max |difference| and the share of elements
whose bits differ; the two sum K in different orders, so a few bf16 steps apart is expected, and the GPU tests hold
both to the fp32 CPU twin), then µs a call, --calls calls replayed from one CUDA graph (dev/timing.py), median of
--repeats, with the gate_up GEMM's TFLOPS and % of --peak.

At decode rows the weights, not the math, set the time, and one gate_up (2-67 MB) can sit in the 50 MB L2 between
calls. `--copies N` cycles each graph's calls over N copies of the weight (past the L2: each call reads its weights
from HBM, as a decode step's layers do), adds our GEMV (gemv_swiglu) where it takes the rows, and prints the % of
nominal HBM (--hbm GB/s) ours reaches on the weight bytes. (The removed cooperative and ping-pong kernels, and
one block an SM: `git show 8047390:dev/gemm_wg.py` and its kernels/gemm_wg.cu.)

    PYTHONPATH=. python3 dev/gemm_wg.py --tokens 1,8,32,64,128 --copies 8 [--shapes qwen2.5-0.5b,...]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from timing import bf16_random, gemm_parser, graph_us  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.backends.cuda_kernels import GEMV_MAX_ROWS  # noqa: E402
from toolkit.backends.cuda_wg import gw_shape_ok  # noqa: E402
from toolkit.model.shapes import shape_config  # noqa: E402


def as_f32(a):
    return (a.astype(cp.uint32) << 16).view(cp.float32)


def main(argv=None):
    ap = gemm_parser(__doc__, "1,8,32,64,128")
    ap.add_argument("--copies", type=int, default=1, help="weight copies each graph cycles over (past the L2)")
    ap.add_argument("--hbm", type=float, default=4814.0, help="nominal HBM GB/s (H200 4,814; H100 SXM 3,352)")
    args = ap.parse_args(argv)
    be = CudaBackend("bfloat16")
    dev = cp.cuda.Device()
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}; {be.gemm_note}")
    print(f"{'shape':14s} {'M':>5s} {'I':>6s} {'K':>5s} | {'blas+silu':>9s} {'tuned+silu':>10s} (silu) | wg µs | "
          f"TFLOPS %peak, wg/tuned+silu | max|diff| bits differ"
          + (f" | gemv_swiglu µs, wg's % of HBM ({args.copies} weight copies)" if args.copies > 1 else ""))
    for shape in args.shapes.split(","):
        cfg = shape_config(shape)
        K, I = cfg.hidden_size, cfg.intermediate_size
        ws = [bf16_random(cp, (2 * I, K), K ** -0.5) for _ in range(args.copies)]
        w = ws[0]
        for M in map(int, args.tokens.split(",")):
            if not gw_shape_ok(M, I, K):
                print(f"{shape:14s} {M:5d}: gemm_wg_swiglu does not take M {M}, I {I}, K {K}")
                continue
            x = bf16_random(cp, (M, K))
            cp.cuda.Device().synchronize()  # x and w come from the null stream; the backend's stream does not wait
            gu, act, ref = cp.empty((M, 2 * I), cp.uint16), cp.empty((M, I), cp.uint16), cp.empty((M, I), cp.uint16)
            with be.stream:  # the output against cuBLAS + silu_mul's; every copy's TMA descriptors, made outside the
                be.linear(x, w, gu)  # captures (graph_us warms copy 0 only)
                be.silu_mul(gu, ref)
                be.gemm_wg_swiglu(x, w, act)
                be.stream.synchronize()
                diff = float(cp.abs(as_f32(act) - as_f32(ref)).max())
                differ = float((act != ref).mean())
                for wc in ws[1:]:
                    be.gemm_wg_swiglu(x, wc, act)
            n = len(ws)
            blas = graph_us(cp, lambda i: (be.linear(x, ws[i % n], gu), be.silu_mul(gu, act)), args.calls,
                            args.repeats, stream=be.stream)
            tuned = graph_us(cp, lambda i: (be.linear_tuned(x, ws[i % n], gu), be.silu_mul(gu, act)), args.calls,
                             args.repeats, stream=be.stream)
            silu = graph_us(cp, lambda i: be.silu_mul(gu, act), args.calls, args.repeats, stream=be.stream)
            best = graph_us(cp, lambda i: be.gemm_wg_swiglu(x, ws[i % n], act), args.calls, args.repeats,
                            stream=be.stream)
            extra = ""
            if n > 1:
                gemv = (graph_us(cp, lambda i: be.gemv_swiglu(x, ws[i % n], act), args.calls, args.repeats,
                                 stream=be.stream) if M <= GEMV_MAX_ROWS else float("nan"))
                extra = f" | {gemv:7.1f} {100 * 2 * I * K * 2 / (best * 1e-6) / 1e9 / args.hbm:5.1f}%"
            tf = 2 * M * 2 * I * K / (best * 1e-6) / 1e12
            print(f"{shape:14s} {M:5d} {I:6d} {K:5d} | {blas:9.1f} {tuned:10.1f} ({silu:5.1f}) | "
                  + f"{best:5.1f} | {tf:6.1f} {100 * tf / args.peak:5.1f}% {best / tuned:6.3f}x | {diff:.3g} {differ:.4f}"
                  + extra,
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
