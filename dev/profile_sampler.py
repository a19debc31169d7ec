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


# The step's coarse calls as built run from BLOCK_START to BLOCK_END; the variant with each chunk's call in its own
# branch keeps the block's bound arithmetic from "// D covers" on.
BLOCK_START = "            // The coarse calls of the step's chunks, outside any per-chunk branch"
BLOCK_END, BOUND = "                    // One bound for the chunk", "                    // D covers the rounding"
SEPARATE_HEAD = """#pragma unroll
            for (int j = 0; j < CPT; j++) {
                unsigned pend = 0;  // the chunk's groups to queue (bit g: tokens t0 + 4g .. t0 + 4g + 3)
                const int t0 = 16 * chunk_of(k, j);
                uint4 cw4 = make_uint4(0u, 0u, 0u, 0u);
                if (cm[j] > NEG_INF && cm[j] * rt + G_MAX >= L) {
"""


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
    no_row = edit(edit(src, "if (!greedy && k > 0 && lane == 0) gL = *(volatile unsigned*)(row_L + r);", ""),
                  "atomicMax(row_L + r, o);", "")
    # the block's range prefetched into L2 by bulk copies at the start (measured: no faster at T = 1, slower greedy)
    prefetch = edit(src, """    if (threadIdx.x == 0) s_L = 0u;
    __syncthreads();  // while the first loads are in flight""", """    if (threadIdx.x == 0) {
        s_L = 0u;
        if (vec) {
            const int p0 = min(c0 + STEP, c1), p1 = min(c1, V >> 4);  // whole chunks only
            const char* base = reinterpret_cast<const char*>(row + 16 * (size_t)p0);
            const long long bytes = (long long)max(p1 - p0, 0) * 16 * sizeof(T);
            for (long long o = 0; o < bytes; o += 32768)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + o),
                             "r"((unsigned)min(bytes - o, 32768ll)) : "memory");
        }
    }
    __syncthreads();  // while the first loads are in flight""")
    nothing_queued = edit(edit(src, "for (; pend; pend &= pend - 1) {", "for (; pend == 0xdeadu; pend &= pend - 1) {"),
                          "qn += __popc(b0)", "qn += 0 * __popc(b0)")
    # each chunk's coarse call in the chunk's own branch
    interleaved = src[src.index(BLOCK_START):src.index(BLOCK_END)]
    separate = (SEPARATE_HEAD + interleaved[interleaved.index(BOUND):]
                + "                    cw4 = coarse_call(t0, pos, k0, k1);\n")
    separate = edit(edit(src, interleaved, separate), "sel4(cw4[j], g)", "sel4(cw4, g)")  # (both uses)
    # session 5's pipeline: the next step's values in registers (a double buffer), loaded while this step works
    regs = edit(edit(edit(src, "if (k > 0) load(k, cur);",
                          "if (k + 1 < steps) load(k + 1, nxt);"),
                     "    uint4 cur[CPT][LPC];\n", "    uint4 cur[CPT][LPC], nxt[CPT][LPC];\n"),
                "            if (qn >= 32u) drain();\n        }\n", """            if (qn >= 32u) drain();
        }
        if (k + 1 < steps) {
#pragma unroll
            for (int j = 0; j < CPT; j++)
#pragma unroll
                for (int l = 0; l < LPC; l++) cur[j][l] = nxt[j][l];
        }
""")
    at = lambda text, n: edit(text, ANCHOR, f"constexpr int GS_BLOCKS = {n};")
    return {"as built": (src, 3, 2), "2 blocks per SM": (at(src, 2), 2, 2),
            "coarse calls in separate branches": (separate, 3, 2),
            "coarse calls in separate branches, 4 blocks per SM": (at(separate, 4), 4, 2),
            "4 blocks per SM": (at(src, 4), 4, 2),
            "next step's values in registers": (regs, 3, 2),
            "next step's values in registers, 2 blocks per SM": (at(regs, 2), 2, 2),
            "L2 bulk prefetch": (prefetch, 3, 2), "no row bound": (no_row, 3, 2),
            "priced: coarse Philox as a hash": (cheap, 3, 2),
            "priced: coarse test kept, nothing queued": (nothing_queued, 3, 2),
            "priced: no coarse calls": (edit(src, "if (__any_sync(0xffffffffu, any)) {", "if (false) {"), 3, 2)}


def stats_source(src):
    """The kernel as built, counting (in g_stat) the groups it queues, its drains, the tokens whose exact key it
    computes and its coarse calls."""
    def edit(text, old, new):
        assert old in text, f"profile_sampler: {old!r} is no longer in sampler.cu"
        return text.replace(old, new)
    src = "__device__ unsigned long long g_stat[4];\n" + src
    src = edit(src, "qn += __popc(b0)", "if (lane == 0) atomicAdd(&g_stat[0], (unsigned long long)(__popc(b0) + 2 * "
               "__popc(b1) + 4 * __popc(b2)));\n                qn += __popc(b0)")
    src = edit(src, "auto drain = [&]() {", "auto drain = [&]() { if (lane == 0) atomicAdd(&g_stat[1], 1ull);")
    src = edit(src, "if (u > __expf(xs[q] + c)) continue;", "if (u > __expf(xs[q] + c)) continue; atomicAdd(&g_stat[2], 1ull);")
    return edit(src, "if (live[j]) {", "if (live[j]) { atomicAdd(&g_stat[3], 1ull);")


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
    ap.add_argument("--stats", action="store_true", help="count the as-built kernel's queued groups, drains, exact "
                    "keys and coarse calls per launch, and stop")
    ap.add_argument("--baseline", default=None, help="another sampler.cu (an earlier gumbel_sample)")
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
    if a.baseline:  # another sampler.cu: session 5's gumbel_sample<T, CPT> (no row bound), or session 4's <T, NL>
        src = inline_headers(pathlib.Path(a.baseline).read_text())
        if "gumbel_sample(const T* __restrict__ logits, int V, int S," in src:
            name = "gumbel_sample<__nv_bfloat16, 2>"
            f = cp.RawModule(code=src, options=OPTIONS, name_expressions=[name]).get_function(name)

            def old(x, temp, seeds, pos, out):
                R = x.shape[0]
                s = max(1, min(sms * 3 // R, -(-V // 16) // 128))
                f((R * s,), (GS_THREADS,), (x, np.int32(V), np.int32(s), temp, seeds, pos, k._ws, k._counters, out))
        else:
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
