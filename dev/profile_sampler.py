"""gumbel_sample alone on `bench sampler`'s bf16 logits (V = 151,936), against the kernel of another sampler.cu
and a plain read of the logits, all in one process; every variant must give the baseline's tokens.

Two timings per case, medians of 5:
  * graph: one CUDA graph of 50 launches on the same logits (what `bench sampler` and the decode step see: a
    38.9 MB row block fits the 50 MB L2 in part);
  * eager: 50 launches rotating over 3 copies of the logits (117 MB, beyond the L2): HBM only.
Variants are edited copies of kernels/sampler.cu (an edit that no longer matches the source stops the run). Run it
under `ncu --clock-control none -k regex:gumbel` with --once for the counters.

    PYTHONPATH=. python3 dev/profile_sampler.py [--batch 1,32,128] [--baseline OLD_sampler.cu ...] [--once]
"""
import argparse
import pathlib
import re
import statistics
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from timing import graph_us  # noqa: E402

V = 151936
ANCHOR = "constexpr int GS_BLOCKS = 3;"  # the kernel's blocks per SM: variants edit it


def variants():
    """name -> (source, blocks per SM, CPT) of gumbel_sample<T, CPT> as built and edited."""
    from toolkit.backends.cuda_kernels import kernel_source
    src = kernel_source("sampler")
    assert ANCHOR in src, f"profile_sampler: {ANCHOR!r} is no longer in sampler.cu"

    def edit(text, old, new):  # an edit that no longer matches would time the kernel as built
        assert old in text, f"profile_sampler: {old!r} is no longer in sampler.cu"
        return text.replace(old, new)
    cheap = edit(src, "return philox4x32_10(make_uint4((unsigned)v >> 4, pos, 1u, 0u), k0, k1);",
                 "const unsigned h = (((unsigned)v >> 4) * 0x9E3779B9u) ^ pos ^ k0 ^ k1; "
                 "return make_uint4(h, h * 3u, h * 5u, h * 7u);")
    # without the row's shared bound: each block knows only its own keys
    no_row = edit(edit(src, 'asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gL) : "l"(row_L + r));', ";"),
                  "atomicMax(row_L + r, o);", "")
    # nothing appended to the queue (so no drain): the chunks' tests and the vote stay (a test against V, which
    # the compiler cannot see through, keeps them alive)
    nothing_queued = edit(src, "cnt += __popc(pend[j]);",
                          "if (pend[j] != (unsigned)V) pend[j] = 0; cnt += __popc(pend[j]);")
    at = lambda text, n: edit(text, ANCHOR, f"constexpr int GS_BLOCKS = {n};")
    return {"as built": (src, 3, 2), "2 blocks per SM": (at(src, 2), 2, 2), "4 blocks per SM": (at(src, 4), 4, 2),
            "no row bound": (no_row, 3, 2),
            "11 slots a lane": (edit(src, "slots = 4 * CPT + 1;", "slots = 4 * CPT + 3;"), 3, 2),
            "priced: coarse Philox as a hash": (cheap, 3, 2),
            "priced: coarse test kept, nothing queued": (nothing_queued, 3, 2),
            "priced: no coarse calls, nothing queued": (
                edit(nothing_queued, "if (__any_sync(0xffffffffu, any)) {", "if (false) {"), 3, 2)}


def stats_source(src):
    """The kernel as built, counting (in g_stat) the groups it queues, its drains, the tokens whose exact key it
    computes and its coarse calls."""
    def edit(text, old, new):
        assert old in text, f"profile_sampler: {old!r} is no longer in sampler.cu"
        return text.replace(old, new)
    src = "__device__ unsigned long long g_stat[4];\n" + src
    src = edit(src, "cnt += __popc(pend[j]);",
               "cnt += __popc(pend[j]); atomicAdd(&g_stat[0], (unsigned long long)__popc(pend[j]));")
    src = edit(src, "auto drain = [&]() {", "auto drain = [&]() { if (lane == 0) atomicAdd(&g_stat[1], 1ull);")
    src = edit(src, "if (u > __expf(xr[q] * rt + c)) continue;", "if (u > __expf(xr[q] * rt + c)) continue; atomicAdd(&g_stat[2], 1ull);")
    return edit(src, "any |= live[j];", "any |= live[j]; if (live[j]) atomicAdd(&g_stat[3], 1ull);")


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
    ap.add_argument("--stats", action="store_true", help="count the as-built kernel's queued groups, drains, exact "
                    "keys and coarse calls per launch, and stop")
    ap.add_argument("--baseline", action="append", default=[],
                    help="another sampler.cu (an earlier gumbel_sample<T, CPT>); may be repeated")
    a = ap.parse_args()
    import cupy as cp
    from toolkit.backends.cuda_kernels import OPTIONS, inline_headers
    from toolkit.backends.cuda_sampler import CudaSamplerKernels, GS_THREADS
    from toolkit.bench.sampler import make_logits

    k = CudaSamplerKernels("bfloat16")
    sms = k._sms
    if a.stats:
        return stats(a, cp, k, sms)
    kernels = {}  # name -> launch(logits, temp, seeds, pos, out)
    for name, (src, blocks, cpt) in variants().items():
        if a.only and not any(w in name for w in a.only.split(",")):
            continue
        fname = f"gumbel_sample<__nv_bfloat16, {cpt}>"
        f = cp.RawModule(code=src, options=OPTIONS, name_expressions=[fname]).get_function(fname)

        def launch(x, temp, seeds, pos, out, f=f, blocks=blocks):
            R = x.shape[0]
            s = max(1, min(sms * blocks // R, -(-V // 16) // 128))  # gumbel_splits at `blocks`
            f((R * s,), (GS_THREADS,), (x, np.int32(V), np.int32(s), temp, seeds, pos, k._ws, k._row_key,
                                         k._counters, out))
        kernels[name] = launch
    for path in a.baseline:  # other sampler.cu files: an earlier gumbel_sample<T, CPT>, with or without row_L
        src = inline_headers(pathlib.Path(path).read_text())
        assert "gumbel_sample(const T* __restrict__ logits, int V, int S," in src, f"{path}: no gumbel_sample<T, CPT>"
        name = "gumbel_sample<__nv_bfloat16, 2>"
        f = cp.RawModule(code=src, options=OPTIONS, name_expressions=[name]).get_function(name)
        blocks = int(re.search(r"constexpr int GS_BLOCKS = (\d+);", src).group(1))
        row_l = "unsigned* __restrict__ row_L" in src  # session 6's on; session 5's has no row bound

        def old(x, temp, seeds, pos, out, f=f, blocks=blocks, row_l=row_l):
            R = x.shape[0]
            s = max(1, min(sms * blocks // R, -(-V // 16) // 128))
            ws = (k._ws, k._row_key, k._counters) if row_l else (k._ws, k._counters)
            f((R * s,), (GS_THREADS,), (x, np.int32(V), np.int32(s), temp, seeds, pos, *ws, out))
        kernels[f"baseline {pathlib.Path(path).name}"] = old

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
            # "filtered": every row is filter_sample's (T < 0), so the launch only reads the settings and exits
            for tname, tv in (("T=0", 0.0), ("T=1", 1.0), ("T=0.7", 0.7), ("mixed", None), ("filtered", -1.0)):
                if shape == "flat" and tname in ("T=0", "mixed", "filtered"):
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
                    g = graph_us(cp, lambda i: fn(sets[0], temp, seeds, pos, out))
                    e = eager_us(cp, lambda i: fn(sets[i % 3], temp, seeds, pos, out))
                    print(f"B={B:<4d} {shape:5s} {tname:6s} {name:40s} graph {g:6.1f} us  eager {e:6.1f} us",
                          flush=True)
            if not a.once:
                g = graph_us(cp, lambda i: cp.max(sets[0], axis=1))
                e = eager_us(cp, lambda i: cp.max(sets[i % 3], axis=1))
                print(f"B={B:<4d} {shape:5s} read floor: cupy max(axis=1) of the bits   graph {g:6.1f} us  eager "
                      f"{e:6.1f} us", flush=True)


def stats(a, cp, k, sms):
    from toolkit.backends.cuda_kernels import kernel_source
    from toolkit.backends.cuda_sampler import GS_BLOCKS, GS_THREADS
    from toolkit.bench.sampler import make_logits
    fname = "gumbel_sample<__nv_bfloat16, 2>"
    mod = cp.RawModule(code=stats_source(kernel_source("sampler")), options=__import__(
        "toolkit.backends.cuda_kernels", fromlist=["OPTIONS"]).OPTIONS, name_expressions=[fname])
    f, g = mod.get_function(fname), mod.get_global("g_stat")
    stat = cp.ndarray((4,), cp.uint64, g)
    rng = np.random.default_rng(0)
    for B in [int(b) for b in a.batch.split(",")]:
        k.reserve(B)
        s = max(1, min(sms * GS_BLOCKS // B, -(-V // 16) // 128))
        seeds = cp.asarray(rng.integers(0, 2**32, (B, 2), dtype=np.uint32))
        pos = cp.arange(B, dtype=cp.int32) + 7
        out = cp.zeros(B, cp.int32)
        for shape in ("llm", "flat"):
            x = cp.asarray(bf16_bits(make_logits(rng, B, V, shape)))
            for tv in (1.0, 0.7):
                stat[:] = 0
                f((B * s,), (GS_THREADS,), (x, np.int32(V), np.int32(s), cp.full(B, tv, cp.float32), seeds, pos,
                                            k._ws, k._row_key, k._counters, out))
                q, d, e, c = (int(v) for v in cp.asnumpy(stat))
                warps = B * s * GS_THREADS // 32
                print(f"B={B:<4d} {shape:5s} T={tv}: per row {q / B:7.1f} groups queued ({100 * q / (B * V / 4):.2f}% "
                      f"of groups), {e / B:6.1f} exact keys, {c / B:7.1f} coarse calls of {-(-V // 16)}; "
                      f"{d / warps:.2f} drains a warp", flush=True)


if __name__ == "__main__":
    main()
