"""Every CUDA kernel against its CPU twin (kernels/<op>.py) at Qwen2.5-0.5B shapes (hidden 896, Hq 14, Hkv 2,
D 64, intermediate 4864, vocab 151936) plus D = 128, start_pos > 0, long contexts and GQA groups > 8.

Inputs are rounded to the device dtype first, so the fp32 CPU reference sees exactly the values the GPU sees;
the remaining error is the GPU's own rounding. Tolerances: fp32 max|err| <= 1e-4 * max|ref|; 16-bit
rel-L2 <= 1e-2 and max|err| <= 3e-2 * max|ref|. Every comparison prints its errors (pytest -s), and a failure
message carries them too, so a single run on the GPU box says what is wrong and by how much.
Cache rows the kernels must not read are filled with NaN: touching one shows up as NaNs in the output.
"""
import functools

import ml_dtypes
import numpy as np
import pytest

from kernels.activation import silu_mul
from kernels.argmax import argmax
from kernels.decode_attention import decode_attention
from kernels.embedding import embedding
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm
from kernels.rope import rope_qkv

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

H, HQ, HKV, D, I, VOCAB = 896, 14, 2, 64, 4864, 151936
DTYPES = ["float32", "bfloat16"]


@functools.lru_cache(maxsize=None)
def K(dtype):
    from toolkit.backends.cuda_kernels import CudaKernels

    return CudaKernels(dtype)


def rounded(x, dtype):
    """fp32 host copy of x as the device holds it in `dtype`."""
    x = np.asarray(x, np.float32)
    if dtype == "float32":
        return x.copy()
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).astype(np.float32)


def dev(x, dtype):
    """Host fp32 -> device array in the storage type (bf16 as uint16 bits)."""
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        return cp.asarray(x.astype(ml_dtypes.bfloat16).view(np.uint16))
    return cp.asarray(x.astype(np.float16 if dtype == "float16" else np.float32))


def host(a, dtype):
    h = cp.asnumpy(a)
    return (h.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else h.astype(np.float32)


def check(name, got, ref, dtype):
    diff = got.astype(np.float64) - ref.astype(np.float64)
    nans = int(np.isnan(got).sum())
    max_rel = float(np.abs(diff).max() / max(float(np.abs(ref).max()), 1e-30))
    rel_l2 = float(np.linalg.norm(diff) / max(float(np.linalg.norm(ref)), 1e-30))
    worst = np.unravel_index(np.nanargmax(np.abs(diff)), diff.shape) if diff.size and not nans else None
    msg = (f"{name} [{dtype}] shape {got.shape}: max|err|/max|ref| = {max_rel:.2e}, rel-L2 = {rel_l2:.2e}, "
           f"NaNs = {nans}, worst at {worst}")
    print(msg)
    ok = max_rel <= 1e-4 if dtype == "float32" else (rel_l2 <= 1e-2 and max_rel <= 3e-2)
    assert ok and nans == 0, msg


def sp_dev(start_pos):
    return cp.asarray(np.array([start_pos], np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [H, 99])  # 99: rows that are not whole 16-byte chunks take the element path
def test_embedding(dtype, H):
    rng = np.random.default_rng(0)
    V = 20000  # the gather does not depend on V; a full-vocab fp32 table would cost 0.5 GB of host RAM
    table = rounded(rng.standard_normal((V, H)), dtype)
    ids = np.array([0, V - 1, 17, 17, 12345] + list(rng.integers(0, V, 59)), np.int32)
    ref = np.empty((len(ids), H), np.float32)
    embedding(ids, table, ref)
    out = dev(np.zeros((len(ids) + 1, H)), dtype)
    bad = cp.asarray(np.append(ids, -5).astype(np.int32))  # an out-of-range id must give a zero row, not a fault
    K(dtype).embedding(bad, dev(table, dtype), out)
    got = host(out, dtype)
    check("embedding", got[:-1], ref, dtype)
    assert np.array_equal(got[:-1], ref), "embedding must copy rows bit-exactly"
    assert not got[-1].any(), "out-of-range id must produce a zero row"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, with_x, H", [(4096, True, H), (1, True, H), (3, False, H), (5, True, 99)])
def test_add_rmsnorm(dtype, T, with_x, H):
    rng = np.random.default_rng(T)
    x = rounded(rng.standard_normal((T, H)), dtype) if with_x else None
    res = rounded(rng.standard_normal((T, H)) * 3, dtype)
    w = rounded(1 + 0.1 * rng.standard_normal(H), dtype)
    ref_res, ref_out = res.copy(), np.empty((T, H), np.float32)
    add_rmsnorm(x, ref_res, w, 1e-6, ref_out)
    d_res, d_out = dev(res, dtype), dev(np.zeros((T, H)), dtype)
    K(dtype).add_rmsnorm(None if x is None else dev(x, dtype), d_res, dev(w, dtype), 1e-6, d_out)
    check("add_rmsnorm.out", host(d_out, dtype), ref_out, dtype)
    check("add_rmsnorm.residual", host(d_res, dtype), ref_res, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, start_pos, hd, variant", [(4096, 0, 64, "bias"), (7, 100, 64, "bias"),
                                                       (33, 5, 128, "qk_norm"), (1, 4000, 64, "plain")])
def test_rope_qkv(dtype, T, start_pos, hd, variant):
    rng = np.random.default_rng(T + hd)
    S, NH = 4096 + 64, HQ + 2 * HKV
    qkv = rounded(rng.standard_normal((T, NH * hd)), dtype)
    bias = rounded(0.5 * rng.standard_normal(NH * hd), dtype) if variant == "bias" else None
    qn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    kn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    inv = 1.0 / (1e6 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(S), inv)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q_ref = np.zeros((T, HQ, hd), np.float32)
    kc_ref, vc_ref = np.zeros((HKV, S, hd), np.float32), np.zeros((HKV, S, hd), np.float32)
    rope_qkv(qkv, bias, qn, kn, 1e-6, cos, sin, start_pos, HQ, HKV, q_ref, kc_ref, vc_ref)
    q_out = dev(np.zeros((T, HQ, hd)), dtype)
    kc, vc = dev(np.zeros((HKV, S, hd)), dtype), dev(np.zeros((HKV, S, hd)), dtype)
    opt = [None if a is None else dev(a, dtype) for a in (bias, qn, kn)]
    K(dtype).rope_qkv(dev(qkv, dtype), *opt, 1e-6, cp.asarray(cos), cp.asarray(sin), sp_dev(start_pos),
                      HQ, HKV, q_out, kc, vc)
    rows = slice(start_pos, start_pos + T)
    check("rope_qkv.q", host(q_out, dtype), q_ref, dtype)
    check("rope_qkv.k_cache", host(kc, dtype)[:, rows], kc_ref[:, rows], dtype)
    check("rope_qkv.v_cache", host(vc, dtype)[:, rows], vc_ref[:, rows], dtype)
    untouched = np.ones(S, bool)
    untouched[rows] = False
    assert not host(kc, dtype)[:, untouched].any() and not host(vc, dtype)[:, untouched].any(), \
        "rope_qkv wrote cache rows outside start_pos..start_pos+T-1"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, inter", [(4096, I), (1, I), (5, 37)])
def test_silu_mul(dtype, T, inter):
    rng = np.random.default_rng(T)
    gu = rounded(3 * rng.standard_normal((T, 2 * inter)), dtype)
    ref = np.empty((T, inter), np.float32)
    silu_mul(gu, ref)
    out = dev(np.zeros((T, inter)), dtype)
    K(dtype).silu_mul(dev(gu, dtype), out)
    check("silu_mul", host(out, dtype), ref, dtype)


@functools.lru_cache(maxsize=None)
def prefill_case(T, start_pos, hd, hq=HQ, hkv=HKV):
    """bf16-representable inputs (exact in fp32 and, away from tiny values, in fp16), NaN past the valid keys."""
    rng = np.random.default_rng(T + start_pos + hd)
    n, S = start_pos + T, start_pos + T + 100
    q = rounded(1.5 * rng.standard_normal((T, hq, hd)), "bfloat16")
    kc = np.full((hkv, S, hd), np.nan, np.float32)
    vc = np.full((hkv, S, hd), np.nan, np.float32)
    kc[:, :n] = rounded(rng.standard_normal((hkv, n, hd)), "bfloat16")
    vc[:, :n] = rounded(rng.standard_normal((hkv, n, hd)), "bfloat16")
    ref = np.empty_like(q)
    prefill_attention(q, kc, vc, start_pos, 1 / np.sqrt(hd), ref)
    return q, kc, vc, ref


@pytest.mark.parametrize("dtype, tc", [("float32", False), ("bfloat16", True), ("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("T, start_pos, hd", [(4096, 0, 64), (1000, 300, 128), (77, 5, 64), (64, 0, 128),
                                              (40, 3, 256)])  # D=256: generic kernel (also with tc=True), >48 KB smem
def test_prefill_attention(dtype, tc, T, start_pos, hd):
    q, kc, vc, ref = prefill_case(T, start_pos, hd)
    out = dev(np.zeros_like(q), dtype)
    K(dtype).prefill_attention(dev(q, dtype), dev(kc, dtype), dev(vc, dtype), sp_dev(start_pos), 1 / np.sqrt(hd),
                               out, tensor_cores=tc)
    check(f"prefill_attention({'tensor cores' if tc else 'generic'}, T={T}, start_pos={start_pos}, D={hd})",
          host(out, dtype), ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("S, hd, hq, hkv, lengths", [(4096, 64, HQ, HKV, (1, 100, 4096, 4095)),
                                                     (4096, 128, HQ, HKV, (777,)),
                                                     (32768, 64, HQ, HKV, (32768, 20001)),
                                                     (2048, 128, 32, 2, (1500,)),   # GQA group 16 > 8 per block
                                                     (1024, 256, 8, 2, (1000, 3))])
def test_decode_attention(dtype, S, hd, hq, hkv, lengths):
    rng = np.random.default_rng(S + hd)
    n = max(lengths)
    kc = np.full((hkv, S, hd), np.nan, np.float32)
    vc = np.full((hkv, S, hd), np.nan, np.float32)
    kc[:, :n] = rounded(rng.standard_normal((hkv, n, hd)), dtype)
    vc[:, :n] = rounded(rng.standard_normal((hkv, n, hd)), dtype)
    d_kc, d_vc = dev(kc, dtype), dev(vc, dtype)
    for length in lengths:  # one CudaKernels, one workspace: later lengths replay what a graph would
        q = rounded(2 * rng.standard_normal((hq, hd)), dtype)
        ref = np.empty_like(q)
        decode_attention(q, kc, vc, length, 1 / np.sqrt(hd), ref)
        out = dev(np.zeros_like(q), dtype)
        K(dtype).decode_attention(dev(q, dtype), d_kc, d_vc, sp_dev(length - 1), 1 / np.sqrt(hd), out)
        check(f"decode_attention(S={S}, D={hd}, Hq={hq}, Hkv={hkv}, length={length})", host(out, dtype), ref, dtype)


def test_decode_step_replays_in_a_cuda_graph():
    """rope_qkv + decode_attention captured once, replayed at new positions by updating start_pos only."""
    dtype, S, NH = "bfloat16", 1024, HQ + 2 * HKV
    kern, rng = K(dtype), np.random.default_rng(7)
    kc0 = rounded(rng.standard_normal((HKV, S, D)), dtype)
    vc0 = rounded(rng.standard_normal((HKV, S, D)), dtype)
    ang = np.outer(np.arange(S), 1.0 / (1e4 ** (np.arange(0, D, 2) / D)))
    cos, sin = cp.asarray(np.cos(ang).astype(np.float32)), cp.asarray(np.sin(ang).astype(np.float32))
    d_qkv, d_q = dev(np.zeros((1, NH * D)), dtype), dev(np.zeros((1, HQ, D)), dtype)
    d_out = dev(np.zeros((HQ, D)), dtype)
    d_kc, d_vc, pos = dev(kc0, dtype), dev(vc0, dtype), sp_dev(0)

    def step():
        kern.rope_qkv(d_qkv, None, None, None, 1e-6, cos, sin, pos, HQ, HKV, d_q, d_kc, d_vc)
        kern.decode_attention(d_q[0], d_kc, d_vc, pos, 0.125, d_out)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        step()  # compile + allocate the workspace outside the capture (writes k/v row 0 from the zero qkv)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        kc_ref, vc_ref = kc0.copy(), vc0.copy()  # the reference cache follows every write the GPU makes
        kc_ref[:, 0] = vc_ref[:, 0] = 0.0
        for p in (5, 700):
            qkv = rounded(rng.standard_normal((1, NH * D)), dtype)
            d_qkv[...] = dev(qkv, dtype)
            pos[...] = p
            graph.launch(stream)
            stream.synchronize()
            q_ref = np.zeros((1, HQ, D), np.float32)
            rope_qkv(qkv, None, None, None, 1e-6, cp.asnumpy(cos), cp.asnumpy(sin), p, HQ, HKV, q_ref, kc_ref, vc_ref)
            kc_ref[:, p], vc_ref[:, p] = rounded(kc_ref[:, p], dtype), rounded(vc_ref[:, p], dtype)
            ref = np.empty((HQ, D), np.float32)
            decode_attention(rounded(q_ref[0], dtype), kc_ref, vc_ref, p + 1, 0.125, ref)
            check(f"graph replay at start_pos={p}", host(d_out, dtype), ref, dtype)


def test_argmax():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((6, VOCAB)).astype(np.float32)
    rows[1, [150000, 7, 5000]] = 50.0          # ties: lowest index wins
    rows[2] = 1.0                                # all equal -> 0
    rows[3, [1234, 99]] = np.nan                 # like np.argmax: the first NaN
    rows[4] = -np.inf                            # all -inf -> 0
    rows[5, VOCAB - 1] = 100.0                   # the very last entry
    out = cp.zeros(6, cp.int32)
    want = [argmax(r) for r in rows]
    for attempt in range(2):  # the second call checks that the kernel left its workspace clean
        K("float32").argmax(cp.asarray(rows), out)
        got = cp.asnumpy(out).tolist()
        print(f"argmax (call {attempt + 1}): got {got}, want {want}")
        assert got == want
    one = cp.zeros(1, cp.int32)  # the decode path: the last row of the logits, as a [1, V] view
    K("float32").argmax(cp.asarray(rows)[-1:], one)
    assert int(one[0]) == VOCAB - 1
    odd = rng.standard_normal(1001).astype(np.float32)  # V not a multiple of 4: the scalar path
    K("float32").argmax(cp.asarray(odd), one)
    assert int(one[0]) == argmax(odd)
