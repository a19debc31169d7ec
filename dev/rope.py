"""rope_qkv against its dev variant rope_qkv_runs (dev/rope_runs.cu: a lane loads runs of up to 8 pairs as one
vector, several (token, head) items a warp), at the four bench-suite shapes: the same outputs (bits where there is
no q/k norm), and µs a call replayed from a CUDA graph, with the GB/s of the bytes each call must move (the qkv rows
read, q and the new K/V written).

    PYTHONPATH=. python3 dev/rope.py [--tokens 1,32,4096] [--shapes qwen2.5-0.5b,...] [--repeats 5]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

RUNS_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope_runs.cu")
SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "qwen2.5-1.5b")


def rope_layout(D: int, itemsize: int, ptrs, table_ptrs=()) -> tuple:
    """(V, lanes an item, KR) for rope_qkv_runs at head dim D: V the pairs a lane loads as one run of each half, the
    widest of 8, 4, 2, 1 that fits 16 bytes and divides D/2 and every pointer's alignment (a view may start anywhere;
    at V = 4 or 8 the fp32 cos/sin tables are read as float4, so they must be 16-byte aligned too); the lanes the
    largest power of two up to D/2 / V runs, at most 32; KR the runs a lane (1 or 2; 3 -> 4 at V = 1), a template
    argument so that the common case holds one run's registers (48 at V = 8, KR = 1; 72 at KR = 2)."""
    half, v = D // 2, 16 // itemsize
    while v > 1 and (half % v or any(p % (v * itemsize) for p in ptrs)
                     or (v % 4 == 0 and any(p % 16 for p in table_ptrs))):
        v //= 2
    lanes = 1 << (min(32, half // v).bit_length() - 1)
    kr = -(-(half // v) // lanes)
    return v, lanes, 4 if kr == 3 else kr


def run_names(ctype: str) -> list:
    """Every rope_qkv_runs instantiation rope_layout can ask for."""
    return [f"rope_qkv_runs<{ctype}, {v}, {kr}>" for v in (1, 2, 4) + ((8,) if ctype != "float" else ())
            for kr in ((1, 2, 4) if v == 1 else (1, 2))]


def variant_source() -> str:
    """kernels/rope.cu with the variant appended (it uses rope.cuh's rnd and rope_pair)."""
    import toolkit.backends.cuda_kernels as ck

    return ck.kernel_source("rope") + "\n" + open(RUNS_SRC).read()


def runs_launcher(cp, ctype: str, itemsize: int):
    """A call of rope_qkv_runs with CudaKernels.rope_qkv's arguments."""
    import toolkit.backends.cuda_kernels as ck

    names = run_names(ctype)
    mod = cp.RawModule(code=variant_source(), options=ck.OPTIONS, name_expressions=names)

    def call(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
             v_cache):
        T, (num_slots, hkv, D) = qkv.shape[0], k_cache.shape
        ptrs = [a.data.ptr for a in (qkv, bias, q_norm, k_norm, q_out, k_cache, v_cache) if a is not None]
        v, lanes, kr = rope_layout(D, itemsize, ptrs, (cos.data.ptr, sin.data.ptr))
        f = mod.get_function(f"rope_qkv_runs<{ctype}, {v}, {kr}>")
        i32 = np.int32
        f((-(-T * (n_heads + 2 * hkv) // (4 * (32 // lanes))),), (128,),
          (qkv, bias, q_norm, k_norm, np.float32(eps), cos, sin, positions, slot_mapping, i32(T), i32(n_heads),
           i32(hkv), i32(D), i32(cos.shape[0]), i32(num_slots), i32(lanes), q_out, k_cache, v_cache))
    return call


def main(argv=None):
    import cupy as cp

    from timing import graph_us
    from toolkit.backends.cuda_kernels import CudaKernels
    from toolkit.model.shapes import shape_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,32,4096")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    k = CudaKernels(args.dtype)
    runs = runs_launcher(cp, k.ctype, k.itemsize)
    rng = np.random.default_rng(0)
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}, {args.dtype}")
    print(f"{'shape':14s} {'T':>5s} {'rope_qkv µs':>11s} {'runs µs':>8s} {'runs/ours':>9s} {'GB/s ours':>9s} "
          f"{'GB/s runs':>9s}  outputs")
    for shape in args.shapes.split(","):
        c = shape_config(shape)
        hq, hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        nh = hq + 2 * hkv

        def arr(*shape, scale=1.0):
            a = cp.asarray(scale * rng.standard_normal(shape), cp.float32)
            return a if args.dtype == "float32" else (
                a.astype(cp.float16) if args.dtype == "float16" else (a.view(cp.uint32) >> 16).astype(cp.uint16))
        for T in map(int, args.tokens.split(",")):
            n_pos, n_slots = T + 64, T + 64
            ang = np.outer(np.arange(n_pos), 1.0 / (c.rope_theta ** (np.arange(0, D, 2) / D)))
            cos, sin = cp.asarray(np.cos(ang), cp.float32), cp.asarray(np.sin(ang), cp.float32)
            qkv = arr(T, nh * D)
            bias = arr(nh * D, scale=0.5) if c.qkv_bias else None
            qn, kn = (arr(D), arr(D)) if c.qk_norm else (None, None)
            pos = cp.asarray(np.arange(T, dtype=np.int32) + (n_pos - T if T == 1 else 0))
            slots = cp.asarray(rng.permutation(n_slots)[:T].astype(np.int32))
            outs = []
            for fn in (k.rope_qkv, runs):
                q = cp.zeros((T, hq, D), qkv.dtype)
                kc, vc = cp.zeros((n_slots, hkv, D), qkv.dtype), cp.zeros((n_slots, hkv, D), qkv.dtype)
                fn(qkv, bias, qn, kn, 1e-6, cos, sin, pos, slots, hq, hkv, q, kc, vc)
                us = graph_us(cp, lambda i, fn=fn, q=q, kc=kc, vc=vc: fn(qkv, bias, qn, kn, 1e-6, cos, sin, pos, slots,
                                                                        hq, hkv, q, kc, vc), reps=args.repeats)
                outs.append((us, [cp.asnumpy(x) for x in (q, kc, vc)]))
            (ua, a), (ub, b) = outs
            same = all(np.array_equal(x, y) for x, y in zip(a, b))
            if same:
                verdict = "same bits"
            else:  # the variant's norm sums in another order: compare as floats
                f = (lambda x: (x.astype(np.uint32) << 16).view(np.float32)) if args.dtype == "bfloat16" else \
                    (lambda x: x.astype(np.float32))
                err = max(float(np.abs(f(x) - f(y)).max()) for x, y in zip(a, b))
                differ = sum(int((x != y).sum()) for x, y in zip(a, b))
                verdict = f"{differ} of {sum(x.size for x in a)} elements differ, max|diff| {err:.2e}"
            gb = T * (nh + hq + 2 * hkv) * D * k.itemsize / 1e9  # qkv read, q and K/V written
            print(f"{shape:14s} {T:5d} {ua:11.2f} {ub:8.2f} {ub / ua:9.2f} {gb / ua * 1e6:9.0f} {gb / ub * 1e6:9.0f}  "
                  f"{verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
