"""gumbel_sample alone on `bench sampler`'s bf16 logits (V = 151,936), against the kernel of another sampler.cu
and a plain read of the logits, all in one process; every variant must give the baseline's tokens.

Two timings per case, medians of 5:
  * graph: one CUDA graph of 50 launches on the same logits (what `bench sampler` and the decode step see: a
    38.9 MB row block fits the 50 MB L2 in part);
  * eager: 50 launches rotating over 3 copies of the logits (117 MB, beyond the L2): HBM only.
Variants are edited copies of kernels/sampler.cu (an edit that no longer matches the source stops the run). Run it
under `ncu --clock-control none -k regex:gumbel` with --once for the counters.

    PYTHONPATH=. python3 dev/profile_sampler.py [--batch 1,32,128] [--baseline OLD_sampler.cu] [--once]
"""
import argparse
import pathlib
import statistics

import numpy as np

V = 151936
ANCHOR = "constexpr int GS_BLOCKS = 3;"  # the kernel's blocks per SM: variants edit it


def variants():
    """name -> (source, blocks per SM, CPT) of gumbel_sample<T, CPT> as built and edited."""
    from toolkit.backends.cuda_kernels import kernel_source
    src = kernel_source("sampler")
    assert ANCHOR in src, f"profile_sampler: {ANCHOR!r} is no longer in sampler.cu"
    blocks = lambda n: src.replace(ANCHOR, f"constexpr int GS_BLOCKS = {n};")

    def edit(text, old, new):  # an edit that no longer matches would time the kernel as built
        assert old in text, f"profile_sampler: {old!r} is no longer in sampler.cu"
        return text.replace(old, new)
    cheap = edit(src, "return philox4x32_10(make_uint4((unsigned)v >> 4, pos, 1u, 0u), k0, k1);",
                 "const unsigned h = (((unsigned)v >> 4) * 0x9E3779B9u) ^ pos ^ k0 ^ k1; "
                 "return make_uint4(h, h * 3u, h * 5u, h * 7u);")
    return {"as built": (src, 3, 2), "4 blocks per SM": (blocks(4), 4, 2), "2 blocks per SM": (blocks(2), 2, 2),
            "1 chunk a step, 4 blocks per SM": (blocks(4), 4, 1), "1 chunk a step, 3 blocks": (src, 3, 1),
            "priced: coarse Philox as a hash": (cheap, 3, 2),
            "priced: no queue": (edit(src, "if (pend) {", "if (false) {"), 3, 2),
            "priced: coarse test kept, nothing queued": (edit(src, "if (pend) {", "if (pend == 0xdeadu) {"), 3, 2),
            "priced: queued, never drained": (edit(edit(src, "if (*(volatile unsigned*)&s_qn[warp] >= 32u) drain();",
                                                    "if (*(volatile unsigned*)&s_qn[warp] >= 32u) { __syncwarp(); "
                                                    "if (lane == 0) s_qn[warp] = 0u; __syncwarp(); }"),
                                               "if (!greedy && s_qn[warp]) drain();", ""), 3, 2),
            "drained at 128": (edit(edit(src, "constexpr int GS_QUEUE = 32 + 4 * 32 * 2;",
                                         "constexpr int GS_QUEUE = 128 + 4 * 32 * 2;"),
                                    "&s_qn[warp] >= 32u) drain();", "&s_qn[warp] >= 128u) drain();"), 3, 2)}


def graph_us(cp, fn, n=50, reps=5):
    """µs per call of fn from one CUDA graph of n calls, median of reps replays."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.begin_capture()
        for _ in range(n):
            fn()
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        res = []
        for _ in range(reps):
            a.record(s)
            g.launch(s)
            b.record(s)
            b.synchronize()
            res.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / n)
    return statistics.median(res)


def eager_us(cp, fn, n=50, reps=5):
    a, b = cp.cuda.Event(), cp.cuda.Event()
    res = []
    for _ in range(reps):
        fn(0)
        a.record()
        for i in range(n):
            fn(i)
        b.record()
        b.synchronize()
        res.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / n)
    return statistics.median(res)


def bf16_bits(x):
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # rounded to nearest even


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--once", action="store_true", help="one launch per case (under ncu)")
    ap.add_argument("--only", default="", help="time only the variants whose names contain one of these, comma-separated")
    ap.add_argument("--baseline", default=None, help="another sampler.cu (the previous gumbel_sample<T, NL>)")
    a = ap.parse_args()
    import cupy as cp
    from toolkit.backends.cuda_kernels import OPTIONS, inline_headers
    from toolkit.backends.cuda_sampler import CudaSamplerKernels, GS_THREADS
    from toolkit.bench.sampler import make_logits

    k = CudaSamplerKernels("bfloat16")
    sms = k._sms
    kernels = {}  # name -> launch(logits, temp, seeds, pos, out)
    for name, (src, blocks, cpt) in variants().items():
        if a.only and not any(w in name for w in a.only.split(",")):
            continue
        fname = f"gumbel_sample<__nv_bfloat16, {cpt}>"
        f = cp.RawModule(code=src, options=OPTIONS, name_expressions=[fname]).get_function(fname)

        def launch(x, temp, seeds, pos, out, f=f, blocks=blocks):
            R = x.shape[0]
            s = max(1, min(sms * blocks // R, -(-V // 16) // 128))  # gumbel_splits at `blocks`
            f((R * s,), (GS_THREADS,), (x, np.int32(V), np.int32(s), temp, seeds, pos, k._ws, k._counters, out))
        kernels[name] = launch
    if a.baseline:  # the previous kernel: blocks of 256 threads, NL 16-byte loads each (4 once the grid fills)
        src = inline_headers(pathlib.Path(a.baseline).read_text())
        names = ["gumbel_sample<__nv_bfloat16, 1>", "gumbel_sample<__nv_bfloat16, 4>"]
        mod = cp.RawModule(code=src, options=OPTIONS, name_expressions=names)
        fs = {1: mod.get_function(names[0]), 4: mod.get_function(names[1])}

        def old(x, temp, seeds, pos, out):
            R = x.shape[0]
            nl = 4 if R * -(-V // (256 * 4 * 8)) >= 4 * sms else 1
            bpr = -(-V // (256 * nl * 8))
            fs[nl]((bpr * R,), (256,), (x, np.int32(V), temp, seeds, pos, k._ws, k._counters, out))
        kernels[f"baseline {pathlib.Path(a.baseline).name}"] = old

    rng = np.random.default_rng(0)
    for B in [int(b) for b in a.batch.split(",")]:
        k.reserve(B)
        seeds = cp.asarray(rng.integers(0, 2**32, (B, 2), dtype=np.uint32))
        pos = cp.arange(B, dtype=cp.int32) + 7
        out = cp.zeros(B, cp.int32)
        for shape in ("llm", "flat"):
            host = make_logits(rng, B, V, shape)
            if shape == "llm" and B >= 4:  # rows that test the edges: NaN, all -inf, ties at the max, -inf runs
                host[0, 5000] = np.nan
                host[1, :] = -np.inf
                host[2, [7, 70000, 151935]] = host[2].max() + 1
                host[3, : V // 2] = -np.inf
            sets = [cp.asarray(bf16_bits(np.roll(host, 16 * i, axis=1))) for i in range(3)]
            for tname, tv in (("T=0", 0.0), ("T=1", 1.0), ("T=0.7", 0.7), ("mixed", None)):
                if shape == "flat" and tname in ("T=0", "mixed"):
                    continue
                t = np.full(B, tv, np.float32) if tv is not None else np.float32([0, 1, 0.7, 1.5])[np.arange(B) % 4]
                temp = cp.asarray(t)
                refs = {}  # trial -> the first kernel's tokens
                for name, fn in kernels.items():
                    for trial in range(3):  # tokens must match the first kernel's, for three sets of seeds
                        fn(sets[0], temp, seeds + trial, pos, out)
                        got = cp.asnumpy(out)
                        ref = refs.setdefault(trial, got)
                        if not np.array_equal(got, ref) and not name.startswith("priced"):
                            bad = np.flatnonzero(got != ref)
                            print(f"MISMATCH {name} B={B} {shape} {tname}: rows {bad[:8]} {got[bad[:4]]} vs "
                                  f"{ref[bad[:4]]}", flush=True)
                    if a.once:
                        continue
                    g = graph_us(cp, lambda: fn(sets[0], temp, seeds, pos, out))
                    e = eager_us(cp, lambda i: fn(sets[i % 3], temp, seeds, pos, out))
                    print(f"B={B:<4d} {shape:5s} {tname:6s} {name:40s} graph {g:6.1f} us  eager {e:6.1f} us",
                          flush=True)
            if not a.once:
                g = graph_us(cp, lambda: cp.max(sets[0], axis=1))
                e = eager_us(cp, lambda i: cp.max(sets[i % 3], axis=1))
                print(f"B={B:<4d} {shape:5s} read floor: cupy max(axis=1) of the bits   graph {g:6.1f} us  eager "
                      f"{e:6.1f} us", flush=True)


if __name__ == "__main__":
    main()
