"""rope_qkv (kernels/rope.cu: a lane loads runs of up to 8 pairs as one vector, several (token, head) items a warp)
against rope_qkv_warp, the kernel it replaced (dev/rope_warp.cu: one warp an item, 2-byte accesses), at the four
bench-suite shapes: the same outputs (bits where there is no q/k norm: the norm sums in another order), and µs a call
replayed from a CUDA graph, with the GB/s of the bytes each call must move (the qkv rows read, q and the new K/V
written). `--widths` also times rope_qkv at each run width V, whatever rope_layout would pick (is its rule for small
steps, narrower runs below ROPE_MIN_WARPS_PER_SM warps an SM, right?).

    PYTHONPATH=. python3 dev/rope.py [--tokens 1,32,256,4096] [--shapes qwen2.5-0.5b,...] [--widths] [--repeats 5]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WARP_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope_warp.cu")
SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "qwen2.5-1.5b")


def warp_source() -> str:
    """kernels/rope.cu with the old kernel appended (it uses rope.cuh's rnd and rope_pair)."""
    import toolkit.backends.cuda_kernels as ck

    return ck.kernel_source("rope") + "\n" + open(WARP_SRC).read()


def warp_launcher(cp, ctype: str):
    """A call of rope_qkv_warp with CudaKernels.rope_qkv's arguments."""
    import toolkit.backends.cuda_kernels as ck

    name = f"rope_qkv_warp<{ctype}>"
    f = cp.RawModule(code=warp_source(), options=ck.OPTIONS, name_expressions=[name]).get_function(name)

    def call(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
             v_cache):
        T, (num_slots, hkv, D), i32 = qkv.shape[0], k_cache.shape, np.int32
        f((-(-T * (n_heads + 2 * hkv) // 4),), (128,),
          (qkv, bias, q_norm, k_norm, np.float32(eps), cos, sin, positions, slot_mapping, i32(T), i32(n_heads),
           i32(hkv), i32(D), i32(cos.shape[0]), i32(num_slots), q_out, k_cache, v_cache))
    return call


def width_launcher(kern, v: int):
    """A call of rope_qkv at run width v (the widest lanes and the runs a lane rope_layout gives for it), or None
    where the head dim or the pointers do not allow v."""
    import toolkit.backends.cuda_kernels as ck

    def call(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slot_mapping, n_heads, n_kv_heads, q_out, k_cache,
             v_cache):
        T, (num_slots, hkv, D), i32 = qkv.shape[0], k_cache.shape, np.int32
        ptrs = [a.data.ptr for a in (qkv, bias, q_norm, k_norm, q_out, k_cache, v_cache) if a is not None]
        widest, _, _ = ck.rope_layout(D, kern.itemsize, ptrs, (cos.data.ptr, sin.data.ptr))
        half = D // 2
        lanes = 1 << (min(32, half // v).bit_length() - 1)
        kr = -(-(half // v) // lanes)
        f = kern._fn("rope", f"rope_qkv<{kern.ctype}, {v}, {4 if kr == 3 else kr}>")
        f((-(-T * (n_heads + 2 * hkv) // (4 * (32 // lanes))),), (128,),
          (qkv, bias, q_norm, k_norm, np.float32(eps), cos, sin, positions, slot_mapping, i32(T), i32(n_heads),
           i32(hkv), i32(D), i32(cos.shape[0]), i32(num_slots), i32(lanes), q_out, k_cache, v_cache))
    return call


def compare(a, b, dtype: str) -> str:
    """'same bits', or how many elements of the output arrays a and b differ and by how much."""
    if all(np.array_equal(x, y) for x, y in zip(a, b)):
        return "same bits"
    f = (lambda x: (x.astype(np.uint32) << 16).view(np.float32)) if dtype == "bfloat16" else \
        (lambda x: x.astype(np.float32))
    err = max(float(np.abs(f(x) - f(y)).max()) for x, y in zip(a, b))
    differ = sum(int((x != y).sum()) for x, y in zip(a, b))
    return f"{differ} of {sum(x.size for x in a)} elements differ, max|diff| {err:.2e}"


def main(argv=None):
    import cupy as cp

    from timing import graph_us
    from toolkit.backends.cuda_kernels import ROPE_MIN_WARPS_PER_SM, CudaKernels, rope_layout
    from toolkit.model.shapes import shape_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,32,256,4096")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--widths", action="store_true", help="also time every run width V")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    k = CudaKernels(args.dtype)
    old = warp_launcher(cp, k.ctype)
    widths = [v for v in (8, 4, 2, 1) if v * k.itemsize <= 16] if args.widths else []
    rng = np.random.default_rng(0)
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}, {args.dtype}, "
          f"{k.num_sms} SMs")
    print(f"{'shape':14s} {'T':>5s} {'V,lanes,KR':>10s} {'ours µs':>8s} {'warp µs':>8s} {'ours/warp':>9s} "
          f"{'GB/s ours':>9s} {'GB/s warp':>9s}  outputs" + "".join(f" {'V=' + str(v) + ' µs':>8s}" for v in widths))
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
            for fn in [k.rope_qkv, old] + [width_launcher(k, v) for v in widths]:
                q = cp.zeros((T, hq, D), qkv.dtype)
                kc, vc = cp.zeros((n_slots, hkv, D), qkv.dtype), cp.zeros((n_slots, hkv, D), qkv.dtype)
                fn(qkv, bias, qn, kn, 1e-6, cos, sin, pos, slots, hq, hkv, q, kc, vc)
                us = graph_us(cp, lambda i, fn=fn, q=q, kc=kc, vc=vc: fn(qkv, bias, qn, kn, 1e-6, cos, sin, pos, slots,
                                                                        hq, hkv, q, kc, vc), reps=args.repeats)
                outs.append((us, [cp.asnumpy(x) for x in (q, kc, vc)]))
            (ua, a), (ub, b) = outs[:2]
            gb = T * (nh + hq + 2 * hkv) * D * k.itemsize / 1e9  # qkv read, q and K/V written
            layout = rope_layout(D, k.itemsize, [qkv.data.ptr, q.data.ptr], [cos.data.ptr], T * nh,
                                 ROPE_MIN_WARPS_PER_SM * k.num_sms)
            print(f"{shape:14s} {T:5d} {','.join(map(str, layout)):>10s} {ua:8.2f} {ub:8.2f} {ua / ub:9.2f} "
                  f"{gb / ua * 1e6:9.0f} {gb / ub * 1e6:9.0f}  {compare(a, b, args.dtype)}"
                  + "".join(f" {u:8.2f}" for u, o in outs[2:]), flush=True)
            for v, (u, o) in zip(widths, outs[2:]):
                if compare(o, a, args.dtype) != "same bits":
                    print(f"  V={v}: {compare(o, a, args.dtype)} against rope_layout's pick")
    return 0


if __name__ == "__main__":
    sys.exit(main())
