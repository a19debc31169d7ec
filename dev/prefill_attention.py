"""Prefill attention alone: our kernels against PyTorch's SDPA at the `bench suite` shapes' heads.

For each shape (q heads, kv heads, head dim): one sequence of --tokens new tokens after --prefix cached ones, in the
engine's paged cache (16-token blocks, a shuffled block table), bf16. Times, µs a call (CUDA graph replay, median of
repeats):
  - tc: prefill_attention_tc (mma.sync, FlashAttention-2), 64 queries a block;
  - wg: prefill_attention_wg (Hopper wgmma, kernels/wgmma.cuh), 128 queries a block, at the plan's K/V tile (WG_KEYS)
    and at each other tile size of --keys (the same source, other template arguments); "wg s=N": the plan's tile with
    each query tile's keys in N splits (--splits) and prefill_attention_merge, "(plan)" marking prefill_splits' N;
  - wgp: dev/prefill_attention_wgp.cu, wg with FlashAttention-3's intra-warpgroup overlap (--variants);
  - wgpp: the same file, wgp plus FA3's ping-pong of the two warpgroups (mbarriers, named barriers);
  - wgt: dev/prefill_attention_wgt.cu, wg with its K/V tiles loaded by TMA (warp 0 issues a box a lane) into a ring
    of stages on mbarriers, nothing block-wide in the loop; wgtp: the same with wgp's overlapped loop; wgtpp: and
    wgpp's ping-pong of the warpgroups; wgtf: wgt with a lean softmax (exp2 as the MUFU alone, the scale folded into
    its argument's FFMA). With
    --splits, each also at the plan's tile in N splits (the product's merge kernel);
  - sdpa: torch's scaled_dot_product_attention(is_causal=True, enable_gqa=True) on contiguous [1, H, T, D] tensors,
    as the torch.compile peer's prefill runs it (only without a prefix), when torch imports.
TFLOPS counts the causal work, 4 * D * Hq * (the keys each query sees, summed). Every output is checked against our
CUDA-core kernel in float32 on the same (bf16-rounded) values -- itself tested against the CPU twin: max |err| and
the count of non-finite outputs.

--probe first checks wgmma.cuh's pieces alone, one warpgroup: S = A B^T with A and B K-major in smem (the Q K^T
step) and O = P V with P from registers and V MN-major in smem (the P V step), at N 64 and 128 and K 64 and 128,
against NumPy. A wrong descriptor or fragment layout shows there first; a failing probe prints which 8 x 8 blocks of
the result are wrong.

    PYTHONPATH=. python3 dev/prefill_attention.py [--probe] [--shapes llama-3.2-1b,...] [--tokens 4096]
        [--prefix 0] [--keys 64,128] [--variants wgp,wgpp] [--splits 1,2,4,8]

A chunk of a long prompt, its keys split: --tokens 512 --prefix 3584 --keys 0 --variants '' --splits 1,2,3,4,6,8
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402

try:
    import cupy as cp
except ImportError:  # tests/dev/test_prefill_attention_dev.py compiles PROBE_SRC without a GPU
    cp = None

import toolkit.backends.cuda_kernels as ck  # noqa: E402
from timing import graph_us  # noqa: E402
from toolkit.backends.cuda_kernels import CudaKernels  # noqa: E402
from toolkit.bench.sampler import torch_us  # noqa: E402
from toolkit.engine.build import BLOCK_SIZE as BS  # noqa: E402

SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen3-0.6b": (16, 8, 128), "llama-3.2-1b": (32, 8, 64),
          "qwen2.5-1.5b": (12, 2, 128)}
OPTIONS = ck.OPTIONS + ("-arch=sm_90a",)

PROBE_SRC = r'''
#include "dtype.cuh"
#include "mma.cuh"
#include "wgmma.cuh"
// Store a warpgroup's m64nN accumulators as a row-major [64][N] fp32 matrix (wgmma.cuh's layout).
template <int N> __device__ void store_acc(const float (&d)[N / 2], float* out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    for (int i = 0; i < N / 2; i++) out[(16 * warp + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * c + (i & 1)] = d[i];
}
// S[64][N] = A[64][K] B[N][K]^T, A and B row-major bf16 in global, staged K-major and swizzled as prefill_attention_wg
// stages Q and K.
template <int N, int K> __global__ void __launch_bounds__(128) probe_ss(const __nv_bfloat16* A, const __nv_bfloat16* B,
                                                                          float* S) {
    extern __shared__ __align__(16) unsigned char raw[];
    unsigned char* As = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
    unsigned char* Bs = As + 64 * K * 2;
    for (int c = threadIdx.x; c < 64 * K / 8; c += 128)
        cp_async16(As + sw128_offset(64, c / (K / 8), c % (K / 8)), A + c * 8, true);
    for (int c = threadIdx.x; c < N * K / 8; c += 128)
        cp_async16(Bs + sw128_offset(N, c / (K / 8), c % (K / 8)), B + c * 8, true);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    float d[N / 2];
    const __nv_bfloat16* tag = nullptr;
    wgmma_fence();
    for (int kk = 0; kk < K / 16; kk++)
        wgmma_ss(d, sw128_desc(As + (kk >> 2) * 64 * 128 + (kk & 3) * 32, 16),
                 sw128_desc(Bs + (kk >> 2) * N * 128 + (kk & 3) * 32, 16), kk > 0, tag);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(d);
    store_acc<N>(d, S);
}
// O[64][N] = P[64][KEYS] V[KEYS][N]: P row-major bf16 read straight into A fragments (mma.m16n8k16's A layout), V
// row-major staged as prefill_attention_wg stages a V tile (rows = keys, 64-column chunks), read MN-major.
template <int N, int KEYS> __global__ void __launch_bounds__(128) probe_rs(const __nv_bfloat16* P,
                                                                           const __nv_bfloat16* V, float* O) {
    extern __shared__ __align__(16) unsigned char raw[];
    unsigned char* Vs = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
    for (int c = threadIdx.x; c < KEYS * N / 8; c += 128)
        cp_async16(Vs + sw128_offset(KEYS, c / (N / 8), c % (N / 8)), V + c * 8, true);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const unsigned* p = reinterpret_cast<const unsigned*>(P);  // two bf16 a word
    const int r0 = 16 * warp + g, r1 = r0 + 8;
    unsigned a[KEYS / 16][4];
    for (int kk = 0; kk < KEYS / 16; kk++) {
        a[kk][0] = p[(r0 * KEYS + 16 * kk + 2 * c) / 2];
        a[kk][1] = p[(r1 * KEYS + 16 * kk + 2 * c) / 2];
        a[kk][2] = p[(r0 * KEYS + 16 * kk + 8 + 2 * c) / 2];
        a[kk][3] = p[(r1 * KEYS + 16 * kk + 8 + 2 * c) / 2];
    }
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
    const __nv_bfloat16* tag = nullptr;
    wgmma_keep(d);
    wgmma_keep(a);
    wgmma_fence();
    for (int kk = 0; kk < KEYS / 16; kk++) wgmma_rs(d, a[kk], sw128_desc(Vs + kk * 2048, KEYS * 128), tag);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(d);
    wgmma_keep(a);
    store_acc<N>(d, O);
}
'''
PROBES = [(n, k) for n in (64, 128) for k in (64, 128)]
PROBE_NAMES = [f"probe_ss<{n}, {k}>" for n, k in PROBES] + [f"probe_rs<{n}, {k}>" for n, k in PROBES]


def bf16_bits(x):
    """float32 -> bf16 bits (round to nearest even) as uint16, and the rounded values as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


def bad_blocks(got, ref, tol):
    """'ok' or a map of the 8 x 8 blocks of [64, N] with an error above tol (X) or not (.)."""
    err = np.abs(got - ref) > tol
    if not err.any():
        return "ok"
    rows = ["".join("X" if err[r:r + 8, c:c + 8].any() else "." for c in range(0, err.shape[1], 8))
            for r in range(0, 64, 8)]
    return f"{int(err.sum())} of {err.size} wrong; 8x8 blocks (rows down):\n      " + "\n      ".join(rows)


def probe():
    mod = cp.RawModule(code=ck.inline_headers(PROBE_SRC), options=OPTIONS, name_expressions=PROBE_NAMES)
    rng = np.random.default_rng(0)
    ok = True
    for n, k in PROBES:  # S = A B^T: A [64, k], B [n, k]
        a, af = bf16_bits(rng.standard_normal((64, k)))
        b, bf = bf16_bits(rng.standard_normal((n, k)))
        out = cp.zeros((64, n), cp.float32)
        f = mod.get_function(f"probe_ss<{n}, {k}>")
        smem = (64 + n) * k * 2 + 1024
        f.max_dynamic_shared_size_bytes = smem
        f((1,), (128,), (cp.asarray(a), cp.asarray(b), out), shared_mem=smem)
        ref = af.astype(np.float64) @ bf.astype(np.float64).T
        res = bad_blocks(cp.asnumpy(out), ref, 1e-3 * np.abs(ref).max())
        ok &= res == "ok"
        print(f"probe S = A B^T   N={n:3d} K={k:3d}: max|err| {np.abs(cp.asnumpy(out) - ref).max():.2e}  {res}")
    for n, keys in PROBES:  # O = P V: P [64, keys], V [keys, n]
        p, pf = bf16_bits(rng.standard_normal((64, keys)))
        v, vf = bf16_bits(rng.standard_normal((keys, n)))
        out = cp.zeros((64, n), cp.float32)
        f = mod.get_function(f"probe_rs<{n}, {keys}>")
        smem = keys * n * 2 + 1024
        f.max_dynamic_shared_size_bytes = smem
        f((1,), (128,), (cp.asarray(p), cp.asarray(v), out), shared_mem=smem)
        ref = pf.astype(np.float64) @ vf.astype(np.float64)
        res = bad_blocks(cp.asnumpy(out), ref, 1e-3 * np.abs(ref).max())
        ok &= res == "ok"
        print(f"probe O = P V     N={n:3d} keys={keys:3d}: max|err| {np.abs(cp.asnumpy(out) - ref).max():.2e}  {res}")
    print("probes:", "all ok" if ok else "FAILED")
    return ok


def paged_case(hq, hkv, d, prefix, tokens, rng):
    """One sequence of prefix + tokens keys in a shuffled paged cache; bf16 bits and float32 values of q, k, v."""
    n_keys = prefix + tokens
    n_blocks = -(-n_keys // BS) + 3
    table = rng.permutation(n_blocks)[None, :].astype(np.int32)
    kb, kf = bf16_bits(rng.standard_normal((n_blocks * BS, hkv, d)))
    vb, vf = bf16_bits(rng.standard_normal((n_blocks * BS, hkv, d)))
    qb, qf = bf16_bits(1.5 * rng.standard_normal((tokens, hq, d)))
    # Slots no key of the sequence owns (its last block's tail, the spare blocks) hold NaN in the bf16 cache, as
    # never-written cache memory may: a kernel that lets them into its output prints NON-FINITE.
    owned = np.zeros(n_blocks * BS, bool)
    keys = np.arange(n_keys)
    owned[table[0, keys // BS] * BS + keys % BS] = True
    kb[~owned] = vb[~owned] = 0x7FC0
    return table, (qb, kb, vb), (qf, kf, vf)


def causal_tflops(us, hq, d, prefix, tokens):
    keys = tokens * prefix + tokens * (tokens + 1) / 2  # query i sees prefix + i + 1 keys
    return 4 * d * hq * keys / (us * 1e-6) / 1e12


WGP_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prefill_attention_wgp.cu")
WGT_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prefill_attention_wgt.cu")
VARIANTS = {  # name: (template, extra template arguments, extra sources, K/V stages at (D, BN)): wg is the product's
    "wg": ("prefill_attention_wg", "", (), lambda d, bn: 2),
    "wgp": ("prefill_attention_wgp", "", (WGP_SRC,), lambda d, bn: 3),
    "wgpp": ("prefill_attention_wgpp", "", (WGP_SRC,), lambda d, bn: 3),
    # wgt: TMA loads into a ring of K/V stages on mbarriers (WgtStages in the .cu); wgtp: the same with wgp's loop;
    # wgtpp: with wgpp's ping-pong too; wgtf: wgt with the lean softmax (one MUFU an exp2, the scale in its FFMA)
    "wgt": ("prefill_attention_wgt", ", 0, false", (WGP_SRC, WGT_SRC), lambda d, bn: 4 if d * bn <= 64 * 64 else 3),
    "wgtp": ("prefill_attention_wgt", ", 1, false", (WGP_SRC, WGT_SRC), lambda d, bn: 4 if d * bn <= 64 * 64 else 3),
    "wgtpp": ("prefill_attention_wgt", ", 2, false", (WGP_SRC, WGT_SRC), lambda d, bn: 4 if d * bn <= 64 * 64 else 3),
    "wgtf": ("prefill_attention_wgt", ", 0, true", (WGP_SRC, WGT_SRC), lambda d, bn: 4 if d * bn <= 64 * 64 else 3),
}
WGT_BOX_ROWS = 16  # keys a TMA box (WGT_BOX_ROWS in the .cu)


def variant_source(variant):
    """The op's source, with the variant's appended (it uses the op's helpers)."""
    return "\n".join([ck.kernel_source("prefill_attention")] + [open(f).read() for f in VARIANTS[variant][2]])


_TMAPS = {}


def tensor_map(cache):
    """A TMA descriptor of a [num_slots, Hkv, D] 16-bit cache as the matrix [num_slots, Hkv * D]: boxes of 64
    columns x WGT_BOX_ROWS rows, 128-byte swizzle, zeros past the tensor; 128 bytes in device memory (the kernel reads
    it from there). Cached per array."""
    key = cache.data.ptr
    if key not in _TMAPS:
        from cuda.bindings import driver as d
        slots, cols = cache.shape[0], cache.shape[1] * cache.shape[2]
        err, tmap = d.cuTensorMapEncodeTiled(
            d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, cache.data.ptr,
            [d.cuuint64_t(cols), d.cuuint64_t(slots)], [d.cuuint64_t(cols * cache.itemsize)],
            [d.cuuint32_t(64), d.cuuint32_t(WGT_BOX_ROWS)], [d.cuuint32_t(1), d.cuuint32_t(1)],
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled: {err.name}")
        _TMAPS[key] = (cp.asarray(np.array(tmap.opaque, dtype=np.uint64)), cache)
    return _TMAPS[key][0]


def wg_launcher(ctype, d, bn, variant="wg", n_splits=1, kern=None):
    """A call of prefill_attention_wg<ctype, d, bn> (any tile size, not only the wrapper's WG_KEYS), or of a dev
    variant's kernel, on the wrapper's arguments. wg and wgt* take n_splits (merged by the product's merge kernel)."""
    template, targs, _, stages = VARIANTS[variant]
    name = f"{template}<{ctype}, {d}, {bn}{targs}>"
    mod = cp.RawModule(code=variant_source(variant), options=OPTIONS, name_expressions=[name])
    f = mod.get_function(name)
    smem = (ck.WG_QUERIES + 2 * stages(d, bn) * bn) * d * 2 + 1024
    f.max_dynamic_shared_size_bytes = smem

    def call(q, kc, vc, table, qsl, seq_lens, block_size, scale, out, max_q):
        hq, hkv, n_tok = q.shape[1], kc.shape[1], q.shape[0]
        args = (q, kc, vc, table, qsl, seq_lens, np.int32(block_size), np.int32(table.shape[1]),
                np.int32(kc.shape[0] // block_size), np.float32(scale), np.int32(hq), np.int32(hkv))
        ws_o = ws_ml = None
        if variant == "wg" or variant.startswith("wgt"):
            if n_splits > 1:
                ws_o, ws_ml = kern._prefill_workspace(n_tok, hq, d, n_splits)
            args += (np.int32(n_splits), ws_o, ws_ml)
        args += (out,)
        if variant.startswith("wgt"):
            assert block_size % WGT_BOX_ROWS == 0
            args += (tensor_map(kc), tensor_map(vc), np.int32(kc.shape[0]))
        f((hq, seq_lens.shape[0], -(-max_q // ck.WG_QUERIES) * n_splits), (256,), args, shared_mem=smem)
        if n_splits > 1:
            merge = kern._fn("prefill_attention", f"prefill_attention_merge<{ctype}>")
            merge((n_tok,), (128,), (ws_o, ws_ml, qsl, seq_lens, np.int32(seq_lens.shape[0]),
                                     np.int32(table.shape[1] * block_size), np.int32(n_splits),
                                     np.int32(ck.WG_QUERIES), np.int32(bn), np.int32(hq), np.int32(d), out))
    return call


def sdpa_us(qf, kf, vf, hq, hkv, tokens, reps):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    # Contiguous [1, H, T, D] K/V: the static cache layout the peer's prefill reads (no prefix).
    q = torch.tensor(qf, dtype=torch.bfloat16, device="cuda").transpose(0, 1)[None]
    k = torch.tensor(kf[:tokens], dtype=torch.bfloat16, device="cuda").transpose(0, 1)[None].contiguous()
    v = torch.tensor(vf[:tokens], dtype=torch.bfloat16, device="cuda").transpose(0, 1)[None].contiguous()
    q = q.contiguous()
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    for _ in range(3):
        fn()
    return float(np.median([torch_us(torch, fn, 20) for _ in range(reps)]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", action="store_true", help="check wgmma.cuh's pieces first")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prefix", type=int, default=0)
    ap.add_argument("--keys", default="64,128", help="K/V tile sizes of prefill_attention_wg to time")
    ap.add_argument("--variants", default="wgp,wgpp", help="dev variants of the wg kernel to time as well (VARIANTS)")
    ap.add_argument("--splits", default="", help="split counts to time the plan's wg kernel at (e.g. 1,2,4,8)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    dev = cp.cuda.Device()
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, sm_{dev.compute_capability}")
    if args.probe and not probe():
        print("(the attention timings below use the same pieces)")
    kern, ref_kern = CudaKernels("bfloat16"), CudaKernels("float32")
    rng = np.random.default_rng(1)
    print(f"{'shape':14s} {'kernel':16s} {'µs':>9s} {'TFLOPS':>7s} {'vs sdpa':>8s} {'max|err|':>9s}")
    for shape in args.shapes.split(","):
        hq, hkv, d = SHAPES[shape]
        table, (qb, kb, vb), (qf, kf, vf) = paged_case(hq, hkv, d, args.prefix, args.tokens, rng)
        n_keys = args.prefix + args.tokens
        qsl, seq_lens = cp.asarray([0, args.tokens], np.int32), cp.asarray([n_keys], np.int32)
        tbl, scale = cp.asarray(table), 1 / np.sqrt(d)
        ref = cp.zeros((args.tokens, hq, d), cp.float32)
        ref_kern.prefill_attention(cp.asarray(qf), cp.asarray(kf), cp.asarray(vf), tbl, qsl, seq_lens, BS, scale,
                                   ref, args.tokens)
        ref = cp.asnumpy(ref)
        q, kc, vc = cp.asarray(qb), cp.asarray(kb), cp.asarray(vb)
        out = cp.zeros((args.tokens, hq, d), cp.uint16)
        base = sdpa_us(qf, kf, vf, hq, hkv, args.tokens, args.repeats) if args.prefix == 0 else None
        kernels = [("tc", kern.prefill_attention_tc)]
        if kern.sm90:
            kernels.append((f"wg {ck.WG_KEYS[d]}", kern.prefill_attention_wg))
            plan = ck.prefill_splits(1, args.tokens, args.tokens, hq, d, kern.num_sms)
            for n in (int(x) for x in args.splits.split(",") if x):
                kernels.append((f"wg s={n}" + (" (plan)" if n == plan else ""),
                                lambda *a, n=n: kern.prefill_attention_wg(*a, n_splits=n)))
            kernels += [(f"wg {bn}", wg_launcher("__nv_bfloat16", d, bn))
                        for bn in map(int, args.keys.split(",")) if bn and bn != ck.WG_KEYS[d]]
            kernels += [(f"{v} {bn}", wg_launcher("__nv_bfloat16", d, bn, v)) for v in args.variants.split(",") if v
                        for bn in map(int, args.keys.split(",")) if bn]
            kernels += [(f"{v} {ck.WG_KEYS[d]} s={n}", wg_launcher("__nv_bfloat16", d, ck.WG_KEYS[d], v, n, kern))
                        for v in args.variants.split(",") if v.startswith("wgt")
                        for n in (int(x) for x in args.splits.split(",") if x) if n > 1]
        if base is not None:
            print(f"{shape:14s} {'sdpa':16s} {base:9.1f} {causal_tflops(base, hq, d, 0, args.tokens):7.1f}")
        for label, fn in kernels:
            call = lambda i, fn=fn: fn(q, kc, vc, tbl, qsl, seq_lens, BS, scale, out, args.tokens)  # noqa: E731
            out.fill(0)
            call(0)
            got = (cp.asnumpy(out).astype(np.uint32) << 16).view(np.float32)
            bad = int((~np.isfinite(got)).sum())
            err = float(np.abs(np.nan_to_num(got, nan=1e9) - ref).max())
            us = graph_us(cp, call, n=20, reps=args.repeats)
            vs = f"{base / us:7.2f}x" if base else ""
            print(f"{shape:14s} {label:16s} {us:9.1f} {causal_tflops(us, hq, d, args.prefix, args.tokens):7.1f} "
                  f"{vs:>8s} {err:9.2e}" + (f"  NON-FINITE {bad}" if bad else ""))
    for name, f in kern._fns.items():  # resident blocks follow from these (WG_BLOCKS_PER_SM in cuda_kernels.py)
        print(f"{name}: {getattr(f, 'num_regs', '?')} registers a thread, "
              f"{kern._smem_optin.get(name, 0)} B dynamic shared memory")


if __name__ == "__main__":
    main()
