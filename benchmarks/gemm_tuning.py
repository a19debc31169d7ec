"""cublasGemmEx against cuBLASLt (heuristic's first algorithm, and the measured one) on a model's projections.

    python benchmarks/gemm_tuning.py [--shape qwen2.5-0.5b] [--rows 1,8,32,128,256,4096]

Each projection runs as a CUDA graph of `layers` launches over distinct weight copies (like one decode step's
layers), so the weights come from DRAM as in the engine; us per GEMM is the graph's median time / layers over 20
replays. For tuned row counts it also prints every candidate's cold-L2 time from the plan. The outputs of the three
paths are compared (cuBLASLt's first algorithm against cublasGemmEx, bit for bit where they pick the same kernel).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.backends.cublaslt import LtGemm, tuned_rows  # noqa: E402
from toolkit.backends.cuda import _NvmathGemm, _OP_N, _OP_T, _WORKSPACE_BYTES  # noqa: E402
from toolkit.shapes import shape_config  # noqa: E402

BF16 = 14


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--rows", default="1,8,32,128,256,4096")
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    import cupy as cp

    print(f"GPU {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, CuPy {cp.__version__}, "
          f"CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, driver {cp.cuda.runtime.driverGetVersion()}")
    c = shape_config(args.shape)
    H, I = c.hidden_size, c.intermediate_size
    projections = {"qkv": (c.qkv_size, H), "o": (H, c.num_heads * c.head_dim), "gate_up": (2 * I, H),
                   "down": (H, I), "lm_head": (c.vocab_size, H)}
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    ex, lt0, lt = _NvmathGemm(cp, stream), LtGemm(cp, stream, _WORKSPACE_BYTES), LtGemm(cp, stream, _WORKSPACE_BYTES)
    lt0.tune = False
    rng = cp.random.default_rng(0)

    def bf16(shape):
        return (rng.standard_normal(shape, dtype=cp.float32) * 0.05).view(cp.uint32).__rshift__(16).astype(cp.uint16)

    print("| projection | rows | gemmEx us | Lt first us | Lt tuned us | tuned / gemmEx | pick | candidates (cold L2, us) "
          "| max diff first / tuned |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name, (N, K) in projections.items():
        copies = 1 if name == "lm_head" else args.layers
        ws = [bf16((N, K)) for _ in range(copies)]
        for T in (int(r) for r in args.rows.split(",")):
            x = bf16((T, K))
            outs = {p: cp.empty((T, N), cp.uint16) for p in ("ex", "lt0", "lt")}
            times = {}
            for p, g in (("ex", ex), ("lt0", lt0), ("lt", lt)):
                def body():
                    for w in ws:
                        g(_OP_T, _OP_N, N, T, K, w.data.ptr, BF16, K, x.data.ptr, BF16, K, outs[p].data.ptr, BF16, N)
                body()  # plans (and tunes) outside the capture
                stream.synchronize()
                stream.begin_capture()
                body()
                graph = stream.end_capture()
                graph.launch(stream)
                reps = []
                for _ in range(20):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(stream)
                    graph.launch(stream)
                    e1.record(stream)
                    e1.synchronize()
                    reps.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / copies)
                times[p] = float(np.median(reps))
            f = {p: (outs[p].astype(cp.uint32) << 16).view(cp.float32) for p in outs}
            d0 = float(cp.abs(f["lt0"] - f["ex"]).max())
            d1 = float(cp.abs(f["lt"] - f["ex"]).max())
            plan = lt.plan_for(_OP_T, _OP_N, N, T, K, BF16, K, BF16, K, BF16, N, tuned_rows(T))
            cands = " ".join(f"{t:.1f}" for t in plan.times_us) if plan.times_us else "-"
            print(f"| {name} | {T} | {times['ex']:.2f} | {times['lt0']:.2f} | {times['lt']:.2f} | "
                  f"{times['lt'] / times['ex']:.2f} | {plan.index} | {cands} | {d0:.3g} / {d1:.3g} |", flush=True)


if __name__ == "__main__":
    main()
