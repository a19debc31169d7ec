"""cuBLASLt's algorithms for the decode projections, against cublasGemmEx's default (the engine's cuBLAS path).

    python benchmarks/bench_cublaslt.py [--shape qwen2.5-0.5b] [--rows 8,16,32] [--ops gate_up,down] [--reps 5]

For each shape cublasLtMatmulAlgoGetHeuristic lists up to 16 algorithms (32 MB of workspace allowed, as the
engine's handle has); each is timed like bench_gemm_skinny.py times a kernel (a CUDA graph of back-to-back calls,
every call on another copy of the weights, so they come from DRAM). Columns: the algorithm's id, tile, split-K
slices and reduction scheme (cuBLASLt's enums), and the max |difference| / max |value| against GemmEx's result.
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_gemm_skinny import POOL_BYTES, _bf16, _to_bf16  # noqa: E402
from bench_kernels import time_calls  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.bench.env import environment  # noqa: E402
from toolkit.shapes import NAMES, shape_config  # noqa: E402

BF16, F32, COMPUTE_32F = 14, 0, 68
WORKSPACE = 32 << 20


class Lt:
    """One cuBLASLt handle, and out[M, N] = x[M, K] @ w[N, K].T as GemmEx computes it (column-major
    C[N, M] = op_T(w) x) with a chosen algorithm."""

    def __init__(self, stream):
        from nvmath.bindings import cublasLt as L

        self.L, self.stream = L, stream
        self.handle = L.create()
        self.ws = cp.empty(WORKSPACE, cp.uint8)
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _attr(self, setter, obj, attr, value, ctype):
        v = ctype(value)
        setter(obj, attr, ctypes.addressof(v), ctypes.sizeof(v))

    def plan(self, M, N, K, count=16):
        L = self.L
        desc = L.matmul_desc_create(COMPUTE_32F, F32)
        self._attr(L.matmul_desc_set_attribute, desc, L.MatmulDescAttribute.TRANSA, 1, ctypes.c_int32)
        self._attr(L.matmul_desc_set_attribute, desc, L.MatmulDescAttribute.TRANSB, 0, ctypes.c_int32)
        a = L.matrix_layout_create(BF16, K, N, K)
        b = L.matrix_layout_create(BF16, K, M, K)
        c = L.matrix_layout_create(BF16, N, M, N)
        pref = L.matmul_preference_create()
        self._attr(L.matmul_preference_set_attribute, pref, L.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                   WORKSPACE, ctypes.c_uint64)
        results = L.MatmulHeuristicResult(count)
        found = ctypes.c_int(0)
        L.matmul_algo_get_heuristic(self.handle, desc, a, b, c, c, pref, count, results.ptr,
                                    ctypes.addressof(found))
        return desc, a, b, c, results, found.value

    def describe(self, results, i):
        L = self.L
        algo = results.ptr + i * L.matmul_heuristic_result_dtype.itemsize  # algo is the struct's first field
        out = []
        for attr in ("ID", "TILE_ID", "SPLITK_NUM", "REDUCTION_SCHEME"):
            v = ctypes.c_int32(0)
            written = ctypes.c_size_t(0)
            L.matmul_algo_config_get_attribute(algo, getattr(L.MatmulAlgoConfigAttribute, attr),
                                               ctypes.addressof(v), 4, ctypes.addressof(written))
            out.append(v.value)
        return algo, out

    def __call__(self, desc, a, b, c, algo, w, x, y):
        self.L.matmul(self.handle, desc, ctypes.addressof(self._one), w.data.ptr, a, x.data.ptr, b,
                      ctypes.addressof(self._zero), y.data.ptr, c, y.data.ptr, c, algo, self.ws.data.ptr,
                      WORKSPACE, self.stream.ptr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=NAMES)
    ap.add_argument("--rows", default="8,16,32")
    ap.add_argument("--ops", default="qkv,o_proj,gate_up,down")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    c = shape_config(args.shape)
    be = CudaBackend("bfloat16")
    be.bind_thread()
    lt = Lt(be.stream)
    H, I, Q = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim
    shapes = {"qkv": (c.qkv_size, H), "o_proj": (H, Q), "gate_up": (2 * I, H), "down": (H, I)}
    print(f"{'op':8s} {'M':>3s} {'N':>6s} {'K':>5s} {'impl':>8s} {'id':>4s} {'tile':>5s} {'splitK':>6s} "
          f"{'red':>4s} {'us':>7s} {'GB/s':>6s} {'rel err':>8s}")
    for name in args.ops.split(","):
        N, K = shapes[name]
        nbytes = N * K * 2
        copies = max(1, -(-POOL_BYTES // nbytes))
        w0 = _to_bf16(cp.random.standard_normal((N, K), cp.float32) * 0.02)
        ws = [w0.copy() for _ in range(copies)]
        for M in map(int, args.rows.split(",")):
            x = _to_bf16(cp.random.standard_normal((M, K), cp.float32))
            y, ref = cp.empty((M, N), cp.uint16), cp.empty((M, N), cp.uint16)
            be.linear(x, ws[0], ref)
            be.stream.synchronize()
            refv = _bf16(cp.asnumpy(ref)).astype(np.float64)
            it = {"i": 0}

            def cycle(f):
                def call():
                    f(ws[it["i"] % copies])
                    it["i"] += 1
                return call

            def row(impl, us, desc=(-1, -1, -1, -1), err=""):
                print(f"{name:8s} {M:3d} {N:6d} {K:5d} {impl:>8s} {desc[0]:4d} {desc[1]:5d} {desc[2]:6d} "
                      f"{desc[3]:4d} {us:7.2f} {nbytes / us / 1e3:6.0f} {err}", flush=True)

            row("gemmEx", time_calls(cycle(lambda w: be.linear(x, w, y)), args.reps, True, stream=be.stream))
            desc, a, b, cc, results, found = lt.plan(M, N, K)
            for i in range(found):
                algo, d = lt.describe(results, i)
                try:
                    lt(desc, a, b, cc, algo, ws[0], x, y)
                    be.stream.synchronize()
                except Exception as e:  # an algorithm the heuristic listed but that refuses the call
                    print(f"{name:8s} {M:3d} algo {i}: {type(e).__name__}: {e}")
                    continue
                got = _bf16(cp.asnumpy(y)).astype(np.float64)
                err = f"{abs(got - refv).max() / max(abs(refv).max(), 1e-30):8.1e}"
                us = time_calls(cycle(lambda w, algo=algo: lt(desc, a, b, cc, algo, w, x, y)), args.reps, True,
                                stream=be.stream)
                row(f"lt{i}", us, d, err)
        ws = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
