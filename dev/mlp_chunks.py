"""A prefill's MLP block (gate_up on cuBLAS, silu_mul, down on cuBLAS) over M tokens at once, against the same block
run in row chunks of C tokens. Why: at 4,096 tokens gate_up writes M x 2I bf16 values (80 MB on the 0.5B shape,
134 MB on Llama) that silu_mul reads back from HBM (silu_mul runs at HBM speed, 9% of the 0.5B's prefill); in
chunks whose gate_up output fits in L2 (50 MB on an H100 or H200), silu_mul and down read it from L2 instead. The
cost: smaller GEMMs (fewer tiles, more wave quantisation). Each row: µs of the block (graph-replayed, median of
--repeats), and of its three parts alone at that chunk size.

    PYTHONPATH=. python3 dev/mlp_chunks.py [--shapes qwen2.5-0.5b,...] [--tokens 4096] [--chunks 4096,2048,1024,512]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from timing import graph_us  # noqa: E402
from toolkit.backends.cuda import CudaBackend  # noqa: E402
from toolkit.model.shapes import shape_config  # noqa: E402

SHAPES = "qwen2.5-0.5b,llama-3.2-1b,qwen3-0.6b,qwen2.5-1.5b"


def bf16(*shape):
    return (cp.random.standard_normal(shape, cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunks", default="4096,2048,1024,512")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    be = CudaBackend("bfloat16")
    M = args.tokens
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}; {be.gemm_note}; "
          f"{M} tokens; µs a layer's MLP block")
    print(f"{'shape':14s} {'chunk':>6s} {'block':>9s} {'x best':>7s} {'gate_up':>9s} {'silu_mul':>9s} {'down':>9s} "
          f"{'gate_up MB':>10s}")
    for shape in args.shapes.split(","):
        cfg = shape_config(shape)
        H, I = cfg.hidden_size, cfg.intermediate_size
        x, w_gu, w_d = bf16(M, H), bf16(2 * I, H), bf16(H, I)
        gu, act, out = cp.empty((M, 2 * I), cp.uint16), cp.empty((M, I), cp.uint16), cp.empty((M, H), cp.uint16)
        rows = []
        for C in map(int, args.chunks.split(",")):
            spans = [(a, min(a + C, M)) for a in range(0, M, C)]

            def block(i, parts=("gate_up", "silu_mul", "down")):
                for a, b in spans:  # each chunk's own slice of the buffers: as a chunked MLP would run it
                    g = gu[a:b] if C >= M else gu[:b - a]  # the chunked block reuses one chunk's buffer (in L2)
                    if "gate_up" in parts:
                        be.linear(x[a:b], w_gu, g)
                    if "silu_mul" in parts:
                        be.silu_mul(g, act[a:b])
                    if "down" in parts:
                        be.linear(act[a:b], w_d, out[a:b])
            t = graph_us(cp, block, args.calls, args.repeats, stream=be.stream)
            part = [graph_us(cp, lambda i, p=p: block(i, (p,)), args.calls, args.repeats, stream=be.stream)
                    for p in ("gate_up", "silu_mul", "down")]
            rows.append((C, t, part))
        best = min(t for _, t, _ in rows)
        for C, t, part in rows:
            print(f"{shape:14s} {C:6d} {t:9.1f} {t / best:7.2f} {part[0]:9.1f} {part[1]:9.1f} {part[2]:9.1f} "
                  f"{min(C, M) * 2 * I * 2 / 1e6:10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
