"""Decode attention alone at long contexts: which kernel and how many splits, per shape x batch x context.

For each case (the four `bench suite` shapes' attention: q heads, kv heads, head dim), batch B and context L (every
sequence L keys, the plan sized for L), times:
  - `cuda_cores` and `tc`: the two short-context kernels at their own plans (decode_splits);
  - `stream`: decode_attention_tc_stream at the plan's split count (stream_splits), and at each split count of
    --splits, to check the plan's choice against the best.
Launches are replayed from a CUDA graph; each reads a different layer's cache, rotating over enough layers that K/V
does not sit in L2 (as in a step, where the other layers and the weights pass through L2 between two reads of a
layer). Median over --repeats of the mean over --launches launches, CUDA events. K/V GB/s counts the bytes the keys
read (B x L x kv heads x D x 2 x 2), as a % of the GPU's nominal HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8).
Every output is checked against a float32 reference over the same cache: max |err|, and the count of non-finite
outputs where there are any.

--layout head-major asks whether the cache's layout costs bandwidth. Our cache is [slot, kv head, D], so a block
(one kv head of one sequence) reads D * 2 bytes of every kv heads * D * 2 (Llama-3.2-1B: 128 of every 1,024); the
peer's static cache is [batch, kv head, position, D], each head's keys contiguous. The head-major case runs the
same kernels on the same bytes with each (sequence, kv head) as a sequence of its own with one kv head
(B * kv heads sequences, group q heads, a [slot, 1, D] cache), so a block's keys are contiguous rows: what a
head-major paged layout ([block, kv head, slot in block, D], FlashInfer's HND) would give, without a kernel change.

--stages 64:5,128:6 asks whether more K/V tiles in flight pay: the stream kernel (at its plan's split count)
compiled with dt_stream_stages(D) = NS for each D:NS listed (a ring of NS buffers, NS - 1 tiles in flight; today
4 at D = 64 and 3 at D = 128: 2 blocks an SM; D = 64 fits 2 blocks up to NS = 5, D = 128 1 block up to NS = 6).

    PYTHONPATH=. python3 dev/decode_attention_long.py [--shapes qwen2.5-0.5b,...] [--batch 1,32,128]
        [--context 1024,2048,8192] [--splits 1,2,4,8,16,32,64] [--layout slot-major,head-major] [--stages 64:5]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import toolkit.backends.cuda_kernels as ck  # noqa: E402
from toolkit.backends.cuda_kernels import CudaKernels, stream_splits  # noqa: E402
from timing import graph_us  # noqa: E402
from toolkit.engine.build import BLOCK_SIZE as BS  # noqa: E402

SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen3-0.6b": (16, 8, 128), "llama-3.2-1b": (32, 8, 64),
          "qwen2.5-1.5b": (12, 2, 128)}
NOMINAL_GBPS = {"H100": 3350.0, "H200": 4800.0}  # SXM, HBM3 and HBM3e
L2_CLEAR = 256 << 20  # rotate over layers until their K/V passes this many bytes


def ints(s):
    return [int(x) for x in s.split(",") if x]


_VARIANTS = {}  # (D, ns) -> the edited module, compiled once


def stage_variant(D, ns, ctype="__half"):
    """A CudaKernels whose stream kernel at head dim D has a ring of ns K/V buffers (the source edited)."""
    today = ck.STREAM_STAGES[D]
    if (D, ns) not in _VARIANTS:
        stages, original = {**ck.STREAM_STAGES, D: ns}, ck.kernel_source("decode_attention_tc")
        src = original.replace("return D == 64 ? 4 : 3;", f"return D == 64 ? {stages[64]} : {stages[128]};")
        assert src != original, "dt_stream_stages not found"
        _VARIANTS[D, ns] = cp.RawModule(code=src, options=ck.OPTIONS,
                                        name_expressions=ck.kernel_names("decode_attention_tc", ctype))
    mod = _VARIANTS[D, ns]
    saved = ck._MODULES.get(("decode_attention_tc", ctype))
    ck._MODULES[("decode_attention_tc", ctype)], ck.STREAM_STAGES[D] = mod, ns
    k = CudaKernels("float16")
    # the caller makes its plan (function, shared memory) before it calls restore: the module table, the stage count
    return k, lambda: (ck._MODULES.__setitem__(("decode_attention_tc", ctype), saved),
                       ck.STREAM_STAGES.__setitem__(D, today))


def reference(q, kc, vc, tables, L, scale, chunk=8):
    """float32 attention of q[B, Hq, D] over keys 0..L-1 of the paged cache, chunk sequences at a time."""
    B, Hq, D = q.shape
    Hkv = kc.shape[1]
    ref = cp.empty((B, Hq, D), cp.float32)
    for b0 in range(0, B, chunk):
        t = tables[b0:b0 + chunk]
        slots = (t[:, :, None] * BS + cp.arange(BS, dtype=cp.int32)).reshape(t.shape[0], -1)[:, :L]
        K, V = kc[slots].astype(cp.float32), vc[slots].astype(cp.float32)  # [b, L, Hkv, D]
        s = cp.einsum("bhgd,blhd->bhgl", q[b0:b0 + chunk].astype(cp.float32).reshape(-1, Hkv, Hq // Hkv, D), K)
        p = cp.exp((s - s.max(-1, keepdims=True)) * scale)
        ref[b0:b0 + chunk] = (cp.einsum("bhgl,blhd->bhgd", p, V) / p.sum(-1)[..., None]).reshape(-1, Hq, D)
    return ref


def check(out, ref):
    """'max|err| ...' of out against the float32 reference (over its finite entries) and its non-finite count."""
    bad = int((~cp.isfinite(out)).sum())
    err = float(cp.abs(cp.nan_to_num(out.astype(cp.float32), nan=0.0) - ref).max())
    return f"  max|err| {err:.2e}" + (f"  NON-FINITE {bad}" if bad else "")


def case(k, shape, B, L, split_counts, launches, repeats, layout="slot-major", stages=()):
    Hq, Hkv, D = SHAPES[shape]
    label = f"B={B:<4d}"
    if layout == "head-major":  # each (sequence, kv head) a sequence of its own: the same bytes, contiguous rows
        B, Hq, Hkv = B * Hkv, Hq // Hkv, 1
        label = f"B={B // SHAPES[shape][1]:<4d} head-major"
    nb = math.ceil(L / BS)
    kv_bytes = 2 * B * L * Hkv * D * 2
    layers = max(1, min(64, math.ceil(L2_CLEAR / kv_bytes)))
    rng = np.random.default_rng(0)
    tables = cp.asarray(rng.permutation(B * nb).astype(np.int32).reshape(B, nb))
    def rand(*shape, scale=1.0):
        return (cp.random.standard_normal(shape, cp.float32) * scale).astype(cp.float16)

    kc, vc = rand(B * nb * BS, Hkv, D), rand(B * nb * BS, Hkv, D)
    # every other layer its own copy (distinct bytes), so that L2 does not hold the next launch's K/V
    caches = [(kc, vc)] + [(kc.copy(), vc.copy()) for _ in range(layers - 1)]
    q = rand(B, Hq, D, scale=2.0)
    lens = cp.full(B, L, cp.int32)
    ref = reference(q, kc, vc, tables, L, D ** -0.5)
    rows = []

    def run(kind, n=None, kernels=k):
        out = cp.zeros((B, Hq, D), cp.float16)
        fn = {"cuda_cores": kernels.decode_attention, "tc": kernels.decode_attention_tc,
              "stream": kernels.decode_attention_stream}[kind]

        def launch(i):
            kc, vc = caches[i % layers]
            fn(q, kc, vc, tables, lens, BS, D ** -0.5, out, L, n_splits=n)
        us = graph_us(cp, launch, launches, repeats)
        launch(0)  # layer 0's output for the check
        cp.cuda.Device().synchronize()
        plan_n = [p for key, p in kernels._decode_plans.items() if key[:6] == (B, Hq, Hkv, D, L, kind)
                  and key[6] == n][0][2]
        return us, int(plan_n), out

    for kind in ("cuda_cores", "tc"):
        us, n, out = run(kind)
        rows.append((kind, n, us, check(out, ref)))
    plan_n = stream_splits(B, Hkv, k.num_sms, L)
    for n in [None] + [s for s in split_counts if s <= math.ceil(L / 64) and s != plan_n]:
        us, got_n, out = run("stream", n)
        rows.append((("stream (plan)" if n is None else "stream"), got_n, us, check(out, ref)))
    for D_, ns in stages:
        if D_ != D:
            continue
        kv, restore = stage_variant(D_, ns)
        try:
            us, got_n, out = run("stream", kernels=kv)
            rows.append((f"stream NS={ns}", got_n, us, check(out, ref)))
        finally:
            restore()
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    peak = next((v for name, v in NOMINAL_GBPS.items() if name in gpu), NOMINAL_GBPS["H200"])
    for kind, n, us, err in rows:
        gbps = kv_bytes / (us * 1e-6) / 1e9
        print(f"{shape:13s} {label} L={L:<5d} {kind:14s} splits {n:4d} {us:9.2f} us  {gbps:7.0f} GB/s K/V "
              f"({gbps / peak:4.0%}){err}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch", type=ints, default=[1, 32, 128])
    ap.add_argument("--context", type=ints, default=[1024, 2048, 8192])
    ap.add_argument("--splits", type=ints, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layout", default="slot-major", help="slot-major (the cache's), head-major, or both")
    ap.add_argument("--stages", default="", help="D:NS,... stream-kernel ring depths to time besides today's")
    a = ap.parse_args()
    k = CudaKernels("float16")
    stages = [tuple(int(x) for x in v.split(":")) for v in a.stages.split(",") if v]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {k.num_sms} SMs, fp16, block size {BS}")
    for shape in a.shapes.split(","):
        for L in a.context:
            for B in a.batch:
                for layout in a.layout.split(","):
                    case(k, shape, B, L, a.splits, a.launches, a.repeats, layout, stages)
                    cp.get_default_memory_pool().free_all_blocks()  # the case's caches, before the next one's
    return 0


if __name__ == "__main__":
    sys.exit(main())
