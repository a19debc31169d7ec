"""The MLP's cuBLAS GEMMs at 2-128 rows, asked both ways round: out[T, N] as cuBLAS's column-major N x T (how the
backend asks: m = N, n = T, the weights as A) or its transpose T x N (m = T, n = N, the weights as B). Same
arithmetic, another problem to cuBLAS's heuristic, which picks its kernel (tile shape, split-K) by (m, n, k).

    python benchmarks/gemm_orientation.py [--shape qwen2.5-0.5b] [--rows 2,8,32,128]

Each timing is a CUDA graph of back-to-back calls (bench_kernels.N_CALLS), each on another copy of the weights
(weights from DRAM, as in a decode step; bench_kernels.cycling and time_calls). down's rows are split_down's
strided-batched call (8 / 4 slices).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_kernels import cycling, time_calls  # noqa: E402
from toolkit.backends.cuda import _OP_N, _OP_T, CudaBackend  # noqa: E402
from toolkit.bench.env import environment  # noqa: E402
from toolkit.shapes import NAMES, shape_config  # noqa: E402

POOL_BYTES = 256 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=NAMES)
    ap.add_argument("--rows", default="2,8,32,128")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    c = shape_config(args.shape)
    be = CudaBackend("bfloat16")
    be.bind_thread()
    g, bf = be._gemm, be._in_type
    H, I = c.hidden_size, c.intermediate_size
    print(f"{'op':8s} {'rows':>4s} {'asked as':28s} {'us':>8s} {'rel err':>8s}")
    for name, N, K in (("gate_up", 2 * I, H), ("down", H, I)):
        copies = max(1, -(-POOL_BYTES // (N * K * 2)))
        w0 = (cp.random.standard_normal((N, K), cp.float32) * 0.02).view(cp.uint32) >> 16
        ws = [w0.astype(cp.uint16) for _ in range(copies)]
        for T in map(int, args.rows.split(",")):
            x = (cp.random.standard_normal((T, K), cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
            S = be.down_slices(T, N, K) if name == "down" else 1
            ks = K // S
            # gate_up writes the compute type (bf16), as in the step; down's slices write fp32 partials
            ot, oc = (cp.float32, 0) if name == "down" else (cp.uint16, bf)
            out = cp.zeros((S, T, N), ot)
            out_t = cp.zeros((S, N, T), ot)

            def normal(w):  # C (N x T, col-major) = W^T-as-A . x  (the backend's way)
                g.strided(_OP_T, _OP_N, N, T, ks, w.data.ptr, bf, K, ks, x.data.ptr, bf, K, ks, out.data.ptr, oc, N,
                          T * N, S)

            def flipped(w):  # C (T x N, col-major) = x^T-as-A . W  (the transpose: out_t[s] is [N, T] row-major)
                g.strided(_OP_T, _OP_N, T, N, ks, x.data.ptr, bf, K, ks, w.data.ptr, bf, K, ks, out_t.data.ptr, oc, T,
                          T * N, S)

            normal(ws[0])
            flipped(ws[0])
            be.stream.synchronize()
            ref, got = _f64(cp.asnumpy(out)), _f64(cp.asnumpy(out_t)).transpose(0, 2, 1)
            err = abs(got - ref).max() / abs(ref).max()
            y = cp.empty((T, N), cp.uint16)
            runs = [(f"m=N n=T (S={S})", normal, ""), (f"m=T n=N (S={S})", flipped, f"{err:8.1e}")]
            if name == "gate_up":
                runs.insert(0, ("gemmEx (the backend's linear)", lambda w: be.linear(x, w, y), ""))
            for label, f, e in runs:
                us = time_calls(cycling(f, ws), args.reps, True, stream=be.stream)
                print(f"{name:8s} {T:4d} {label:28s} {us:8.2f} {e}", flush=True)
        ws = None
    return 0


def _f64(a):
    return ((a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a).astype(np.float64)


if __name__ == "__main__":
    sys.exit(main())
