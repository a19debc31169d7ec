"""gemm_skinny (tensor cores, 2-32 rows) against cuBLAS and torch at the decode projections, weights from DRAM.

    PYTHONPATH=. python dev/bench_gemm_skinny.py [--shape qwen2.5-0.5b] [--rows 2,4,8,16,32] [--reps 7] [--sweep]
        [--ops qkv,down]

Each timing is a CUDA graph of back-to-back calls (bench_kernels.time_calls), but every call reads another copy
of the weight matrix (at least 256 MB of copies in all), so the weights come from DRAM as in a decode step (24
layers x 30 MB) instead of from the 50 MB L2. GB/s = weight bytes / time. "MTxWKxS" rows sweep gemm_skinny's
split (m-tiles a tile x warps a block x slices of K); "*" marks the launcher's own (cuda_gemm.skinny_plan). Whether
the engine runs a projection on gemm_skinny at all is the step plan's choice (toolkit/model/plan.py).
gate_up+swiglu is the MLP's first half: cuBLAS then silu_mul, against gemm_skinny with SwiGLU in its epilogue. The
last column checks each result against cuBLAS's (max |difference| / max |value|).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from bench_kernels import cycling, time_calls  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.backends.cuda_gemm import skinny_plan  # noqa: E402
from toolkit.bench.env import environment  # noqa: E402
from toolkit.model.shapes import NAMES, shape_config  # noqa: E402

POOL_BYTES = 256 << 20
SPLITS = ((1, 8, 1), (1, 16, 1), (2, 8, 1), (1, 8, 2), (1, 8, 4), (1, 16, 2), (1, 16, 4), (2, 8, 2), (2, 4, 1),
          (2, 4, 2), (2, 2, 1), (2, 4, 4), (2, 4, 8), (1, 4, 1), (1, 4, 2), (1, 4, 4), (1, 4, 8), (1, 2, 8), (1, 2, 4))


def projection_args(rows: str) -> argparse.ArgumentParser:
    """The flags of every projection benchmark (this one, down_partials.py, experiments/gemm_orientation.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=NAMES)
    ap.add_argument("--rows", default=rows)
    ap.add_argument("--reps", type=int, default=7)
    return ap


def projection_backend(shape: str):
    """Print the environment; return the shape's config and a bf16 CUDA backend bound to this thread."""
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    be = CudaBackend("bfloat16")
    be.bind_thread()
    return shape_config(shape), be


def weight_copies(w0) -> list:
    """Copies of the weight matrix w0, POOL_BYTES of them at least: distinct buffers of the same values, which
    bench_kernels.cycling goes through so that no call finds its weights in L2."""
    return [w0.copy() for _ in range(max(1, -(-POOL_BYTES // w0.nbytes)))]


def main():
    ap = projection_args("2,4,8,16,32")
    ap.add_argument("--sweep", action="store_true", help="also time every (MT, WK) split")
    ap.add_argument("--ops", default="", help="only these ops (comma-separated names)")
    args = ap.parse_args()
    c, be = projection_backend(args.shape)
    try:
        import torch

        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    k = be.kernels
    H, I, Q = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim
    shapes = (("qkv", c.qkv_size, H), ("o_proj", H, Q), ("gate_up", 2 * I, H), ("gate_up+swiglu", 2 * I, H),
              ("down", H, I), ("lm_head", c.vocab_size, H))
    print(f"{'op':15s} {'M':>3s} {'N':>7s} {'K':>5s} {'impl':18s} {'us':>8s} {'GB/s':>7s} {'rel err':>8s}")
    for name, N, K in shapes:
        if args.ops and name not in args.ops.split(","):
            continue
        swiglu = name.endswith("swiglu")
        nbytes = N * K * 2
        ws = weight_copies(_to_bf16(cp.random.standard_normal((N, K), cp.float32) * 0.02))
        copies = len(ws)
        n_out = N // 2 if swiglu else N
        for M in map(int, args.rows.split(",")):
            x = _to_bf16(cp.random.standard_normal((M, K), cp.float32))
            y = cp.empty((M, n_out), cp.uint16)
            gu = cp.empty((M, N), cp.uint16)
            ref = cp.empty((M, n_out), cp.uint16)
            if swiglu:
                be.linear(x, ws[0], gu)
                be.silu_mul(gu, ref)
            else:
                be.linear(x, ws[0], ref)
            be.stream.synchronize()
            refv = cp.asnumpy(ref)
            def report(impl, us, out=None):
                err = ""
                if out is not None:
                    a = _bf16(cp.asnumpy(out)).astype("float64")
                    b = _bf16(refv).astype("float64")
                    err = f"{abs(a - b).max() / max(abs(b).max(), 1e-30):8.1e}"
                print(f"{name:15s} {M:3d} {N:7d} {K:5d} {impl:18s} {us:8.2f} {nbytes / us / 1e3:7.0f} {err}",
                      flush=True)

            def time(f):
                return time_calls(cycling(f, ws), args.reps, True, stream=be.stream)

            if swiglu:
                report("cublas+silu_mul", time(lambda w: (be.linear(x, w, gu), be.silu_mul(gu, y))))
            else:
                report("cublas", time(lambda w: be.linear(x, w, y)))
            if M > 32:
                continue
            skinny = k.gemm_skinny_swiglu if swiglu else k.gemm_skinny
            MT, NT, WK, S = skinny_plan(M, n_out, K, k.num_sms, swiglu)
            report(f"skinny {MT}x{WK}x{S}*", time(lambda w: skinny(x, w, y)), y)
            chunks = K // 32
            for split in SPLITS if args.sweep else ():
                mt, wk, s = split
                if (split == (MT, WK, S) or (swiglu and mt == 1) or chunks % s or chunks // s < wk
                        or (N > 32768 and s > 1)):
                    continue
                report(f"skinny {mt}x{wk}x{s}", time(lambda w, s=split: skinny(x, w, y, split=s)), y)
            if has_torch and not swiglu:
                tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                tws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                ti = {"i": 0}

                def tcall():
                    tx @ tws[ti["i"] % copies].T
                    ti["i"] += 1
                report("torch", time_calls(tcall, args.reps, True, "torch"))
                del tws
        ws = None  # free the copies before the next shape
    return 0


def _to_bf16(a):
    """fp32 CuPy array -> bf16 bits (uint16, truncated: fine for timing and for comparing two kernels)."""
    return (a.view(cp.uint32) >> 16).astype(cp.uint16)


def _bf16(a):
    import numpy as np

    return (a.astype(np.uint32) << 16).view(np.float32)


if __name__ == "__main__":
    sys.exit(main())
