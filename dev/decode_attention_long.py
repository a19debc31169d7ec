"""Decode attention alone at long contexts: which kernel and how many splits, per shape x batch x context.

For each case (the four `bench suite` shapes' attention: q heads, kv heads, head dim), batch B and context L (every
sequence L keys, the plan sized for L), times:
  - `cuda_cores` and `tc`: the two short-context kernels at their own plans (decode_splits);
  - `stream`: decode_attention_tc_stream at the plan's split count (stream_splits), and at each split count of
    --splits, to check the plan's choice against the best.
Launches are replayed from a CUDA graph; each reads a different layer's cache, rotating over enough layers that K/V
does not sit in L2 (as in a step, where the other layers and the weights pass through L2 between two reads of a
layer). Median over --repeats of the mean over --launches launches, CUDA events. K/V GB/s counts the bytes the keys
read (B x L x kv heads x D x 2 x 2). Each stream result is also checked against the tc kernel's output (max |diff|,
fp16).

--layout head-major asks whether the cache's layout costs bandwidth. Our cache is [slot, kv head, D], so a block
(one kv head of one sequence) reads D * 2 bytes of every kv heads * D * 2 (Llama-3.2-1B: 128 of every 1,024); the
peer's static cache is [batch, kv head, position, D], each head's keys contiguous. The head-major case runs the
same kernels on the same bytes with each (sequence, kv head) as a sequence of its own with one kv head
(B * kv heads sequences, group q heads, a [slot, 1, D] cache), so a block's keys are contiguous rows: what a
head-major paged layout ([block, kv head, slot in block, D], FlashInfer's HND) would give, without a kernel change.

    PYTHONPATH=. python3 dev/decode_attention_long.py [--shapes qwen2.5-0.5b,...] [--batch 1,32,128]
        [--context 1024,2048,8192] [--splits 1,2,4,8,16,32,64] [--layout slot-major,head-major]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from toolkit.backends.cuda_kernels import CudaKernels, stream_splits  # noqa: E402
from timing import graph_us  # noqa: E402
from toolkit.engine.build import BLOCK_SIZE as BS  # noqa: E402

SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen3-0.6b": (16, 8, 128), "llama-3.2-1b": (32, 8, 64),
          "qwen2.5-1.5b": (12, 2, 128)}
PEAK_GBPS = 4800.0  # H200 nominal HBM3e
L2_CLEAR = 256 << 20  # rotate over layers until their K/V passes this many bytes


def ints(s):
    return [int(x) for x in s.split(",") if x]


def case(k, shape, B, L, split_counts, launches, repeats, layout="slot-major"):
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
    outs = {}
    rows = []

    def run(kind, n=None):
        out = cp.zeros((B, Hq, D), cp.float16)
        fn = {"cuda_cores": k.decode_attention, "tc": k.decode_attention_tc,
              "stream": k.decode_attention_stream}[kind]

        def launch(i):
            kc, vc = caches[i % layers]
            fn(q, kc, vc, tables, lens, BS, D ** -0.5, out, L, n_splits=n)
        us = graph_us(cp, launch, launches, repeats)
        launch(0)  # layer 0's output for the check
        cp.cuda.Device().synchronize()
        plan_n = [p for key, p in k._decode_plans.items() if key[:6] == (B, Hq, Hkv, D, L, kind)
                  and key[6] == n][0][2]
        return us, int(plan_n), out

    for kind in ("cuda_cores", "tc"):
        us, n, out = run(kind)
        outs[kind] = out
        rows.append((kind, n, us))
    plan_n = stream_splits(B, Hkv, k.num_sms, L)
    for n in [None] + [s for s in split_counts if s <= math.ceil(L / 64) and s != plan_n]:
        us, got_n, out = run("stream", n)
        diff = float(cp.abs(out.astype(cp.float32) -
                            outs["tc"].astype(cp.float32)).max())
        rows.append((("stream (plan)" if n is None else "stream"), got_n, us, diff))
    for r in rows:
        gbps = kv_bytes / (r[2] * 1e-6) / 1e9
        check = f"  max|diff| vs tc {r[3]:.2e}" if len(r) > 3 else ""
        print(f"{shape:13s} {label} L={L:<5d} {r[0]:14s} splits {r[1]:4d} {r[2]:9.2f} us  {gbps:7.0f} GB/s K/V "
              f"({gbps / PEAK_GBPS:4.0%}){check}", flush=True)
    del caches, kc, vc
    cp.get_default_memory_pool().free_all_blocks()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch", type=ints, default=[1, 32, 128])
    ap.add_argument("--context", type=ints, default=[1024, 2048, 8192])
    ap.add_argument("--splits", type=ints, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layout", default="slot-major", help="slot-major (the cache's), head-major, or both")
    a = ap.parse_args()
    k = CudaKernels("float16")
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {k.num_sms} SMs, fp16, block size {BS}")
    for shape in a.shapes.split(","):
        for L in a.context:
            for B in a.batch:
                for layout in a.layout.split(","):
                    case(k, shape, B, L, a.splits, a.launches, a.repeats, layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
