"""The MLP's cuBLAS GEMMs at 2-128 rows, asked both ways round: out[T, N] as cuBLAS's column-major N x T (how the
backend asks: m = N, n = T, the weights as A) or its transpose T x N (m = T, n = N, the weights as B). Same
arithmetic, another problem to cuBLAS's heuristic, which picks its kernel (tile shape, split-K) by (m, n, k).

    PYTHONPATH=. python experiments/gemm_orientation.py [--shape qwen2.5-0.5b] [--rows 2,8,32,128]

Each timing is a CUDA graph of back-to-back calls (bench_kernels.N_CALLS), each on another copy of the weights
(weights from DRAM, as in a decode step; dev/bench_kernels.py's cycling and time_calls). down's rows are the
step plan's sliced down projection, a strided-batched call (8 / 4 slices, toolkit/model/plan.py).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev"))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_gemm_skinny import _to_bf16, projection_args, projection_backend, weight_copies  # noqa: E402
from bench_kernels import cycling, time_calls  # noqa: E402
from toolkit.backends.cuda import _OP_N, _OP_T  # noqa: E402
from toolkit.model.plan import DOWN_SLICES  # noqa: E402


def main():
    args = projection_args("2,8,32,128").parse_args()
    c, be = projection_backend(args.shape)
    g, bf = be._gemm, be._in_type
    H, I = c.hidden_size, c.intermediate_size
    print(f"{'op':8s} {'rows':>4s} {'asked as':28s} {'us':>8s} {'rel err':>8s}")
    for name, N, K in (("gate_up", 2 * I, H), ("down", H, I)):
        ws = weight_copies(_to_bf16(cp.random.standard_normal((N, K), cp.float32) * 0.02))
        for T in map(int, args.rows.split(",")):
            x = _to_bf16(cp.random.standard_normal((T, K), cp.float32))
            S = next((s for top, s in DOWN_SLICES if T <= top), 1) if name == "down" else 1
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
