"""Every CUDA kernel against its CPU twin (kernels/<op>.py) at Qwen2.5-0.5B shapes (hidden 896, Hq 14, Hkv 2,
D 64, intermediate 4864, vocab 151936) plus D = 128, GQA groups > 8, and the paged, batched step inputs of the
engine: batches up to 256, contexts up to 32K, ragged lengths, shuffled block tables, padding rows (slot -1,
seq_len 0), mixed query lengths (1 included) and query_start_loc starting past row 0.

Inputs are rounded to the device dtype first, so the fp32 CPU reference sees exactly the values the GPU sees;
the remaining error is the GPU's own rounding. Tolerances: fp32 max|err| <= 1e-4 * max|ref|; 16-bit
rel-L2 <= 1e-2 and max|err| <= 3e-2 * max|ref|. Every comparison prints its errors (pytest -s), and a failure
message carries them too, so a single run on the GPU box says what is wrong and by how much.
Cache slots the kernels must not read (the tail of a sequence's last block, unused blocks, and the blocks that
garbage block-table entries point to) are filled with NaN: touching one shows up as NaNs in the output.
"""
import functools

import numpy as np
import pytest
from tests.paged_cache import paged_cache

from kernels.activation import silu_mul
from kernels.decode_attention import decode_attention
from kernels.decode_attention_tc import decode_attention_tc, decode_attention_tc_stream
from kernels.embedding import embedding
from kernels.prefill_attention import prefill_attention
from kernels.rmsnorm import add_rmsnorm, add_rmsnorm_partials
from kernels.rope import rope_qkv

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import dev, rounded  # noqa: E402

pytestmark = pytest.mark.gpu

H, HQ, HKV, D, I, VOCAB = 896, 14, 2, 64, 4864, 151936
DTYPES = ["float32", "bfloat16"]
SENTINEL = 7.0  # rows the attention kernels must leave alone


@functools.lru_cache(maxsize=None)
def K(dtype):
    from toolkit.backends.cuda_kernels import CudaKernels

    return CudaKernels(dtype)


def host(a, dtype):
    h = cp.asnumpy(a)
    return (h.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else h.astype(np.float32)


def ints(x):
    return cp.asarray(np.ascontiguousarray(x, np.int32))


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


def rope_tables(n_pos, hd, theta=1e6):
    ang = np.outer(np.arange(n_pos), 1.0 / (theta ** (np.arange(0, hd, 2) / hd)))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def paged(rng, lens, hkv, hd, block_size=16, spare=5):
    """paged_cache() with bf16-representable values (exact in fp32 and, away from tiny values, in fp16)."""
    return paged_cache(rng, lens, hkv, hd, block_size, spare,
                       values=lambda shape: rounded(rng.standard_normal(shape, np.float32), "bfloat16"))


# -- elementwise ops (unchanged by paging) ----------------------------------------------------------------------
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
@pytest.mark.parametrize("S, T", [(8, 32), (8, 2), (4, 128), (1, 5), (3, 256)])
def test_add_rmsnorm_partials(dtype, S, T):
    """split_down's norm against its twin, and bit for bit add_rmsnorm given the partials' sum (fp32, in slice
    order) rounded to the compute dtype: the one rounding split_down adds is the GEMM output's own."""
    rng = np.random.default_rng(S * 1000 + T)
    parts = rng.standard_normal((S, T, H)).astype(np.float32)
    res = rounded(rng.standard_normal((T, H)) * 3, dtype)
    w = rounded(1 + 0.1 * rng.standard_normal(H), dtype)
    ref_res, ref_out = res.copy(), np.empty((T, H), np.float32)
    add_rmsnorm_partials(parts, ref_res, w, 1e-6, ref_out)
    d_res, d_out = dev(res, dtype), dev(np.zeros((T, H)), dtype)
    K(dtype).add_rmsnorm_partials(cp.asarray(parts), d_res, dev(w, dtype), 1e-6, d_out)
    check("add_rmsnorm_partials.out", host(d_out, dtype), ref_out, dtype)
    check("add_rmsnorm_partials.residual", host(d_res, dtype), ref_res, dtype)
    x = parts[0].copy()
    for p in parts[1:]:
        x += p
    p_res, p_out = dev(res, dtype), dev(np.zeros((T, H)), dtype)
    K(dtype).add_rmsnorm(dev(x, dtype), p_res, dev(w, dtype), 1e-6, p_out)
    assert (p_res == d_res).all() and (p_out == d_out).all()
    with pytest.raises(ValueError):  # more slices than the kernel holds
        K(dtype).add_rmsnorm_partials(cp.zeros((9, T, H), cp.float32), d_res, dev(w, dtype), 1e-6, d_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [2, 32, 128])
def test_linear_partials(dtype, T):
    """The down projection in slices (one strided-batched cuBLAS call): slice s of K's fp32 product, at the down
    projection's shape with the slices the step plan picks (toolkit/model/plan.py); their sum is the whole product."""
    from toolkit.model.plan import DOWN_SLICES

    be = _backend(dtype)
    S = next(s for top, s in DOWN_SLICES if T <= top)
    rng = np.random.default_rng(T)
    x, w = rounded(rng.standard_normal((T, I)), dtype), rounded(0.02 * rng.standard_normal((H, I)), dtype)
    parts, dx, dw = cp.zeros((S, T, H), cp.float32), dev(x, dtype), dev(w, dtype)
    cp.cuda.Device().synchronize()  # (the backend's stream does not wait for the default one)
    be.linear_partials(dx, dw, parts)
    be.stream.synchronize()
    got = cp.asnumpy(parts)
    ks = I // S
    for s in range(S):
        ref = x[:, s * ks:(s + 1) * ks].astype(np.float64) @ w[:, s * ks:(s + 1) * ks].T.astype(np.float64)
        check(f"linear_partials[{s}]", got[s], ref.astype(np.float32), "float32")
    check("linear_partials.sum", got.sum(0), (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32),
          "float32")
    with pytest.raises(ValueError):
        be.linear_partials(dev(x, dtype), dev(w, dtype), cp.zeros((3, T, H), cp.float32))  # 4864 / 3


def test_linear_partials_without_nvmath():
    """Without nvmath-python the backend's cuBLAS calls go through CuPy's wrapper (eager steps only): the same
    strided-batched call, the same partials to fp32 rounding."""
    from toolkit.backends.cuda import CudaBackend, _CupyGemm

    be, plain = CudaBackend("bfloat16"), _backend("bfloat16")
    be._gemm = _CupyGemm(cp, be.stream)
    rng = np.random.default_rng(5)
    x, w = dev(rng.standard_normal((32, I)), "bfloat16"), dev(0.02 * rng.standard_normal((H, I)), "bfloat16")
    a, b = cp.zeros((8, 32, H), cp.float32), cp.zeros((8, 32, H), cp.float32)
    cp.cuda.Device().synchronize()
    be.linear_partials(x, w, a)
    plain.linear_partials(x, w, b)
    cp.cuda.Device().synchronize()
    # (another handle, another workspace: cuBLAS may pick another algorithm, so fp32 rounding may differ)
    assert float(abs(a - b).max()) <= 1e-5 * float(abs(b).max())


@functools.lru_cache(maxsize=None)
def _backend(dtype):
    from toolkit.backends.cuda import CudaBackend

    return CudaBackend(dtype)


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


# -- rope + paged KV write ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, hd, variant, kind, offset", [
    (4096, 64, "bias", "prompt", 0), (7, 64, "bias", "prompt", 0), (33, 128, "qk_norm", "prompt", 0),
    (4096, 128, "qk_norm", "prompt", 0), (1, 64, "plain", "decode", 0), (256, 64, "bias", "decode", 0),
    (4096, 64, "bias", "prompt", 1), (2048, 128, "qk_norm", "prompt", 4)])
def test_rope_qkv(dtype, T, hd, variant, kind, offset):
    """'prompt': consecutive positions from a cached prefix into shuffled slots; 'decode': one token per sequence at
    scattered positions up to 32K, rows 1, 6, 11, ... padding rows (slot -1: q written, no K/V). The kernel's run
    width follows the step's size (rope_layout: 16-byte runs at 4,096 tokens, one pair a lane at one token) and the
    pointers' alignment: `offset` elements before qkv's first start it off a 16-byte boundary (narrower runs)."""
    rng = np.random.default_rng(T + hd)
    n_pos, NH, n_slots = 32768, HQ + 2 * HKV, T + 300
    qkv = rounded(rng.standard_normal((T, NH * hd)), dtype)
    bias = rounded(0.5 * rng.standard_normal(NH * hd), dtype) if variant == "bias" else None
    qn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    kn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    cos, sin = rope_tables(n_pos, hd)
    slots = rng.permutation(n_slots)[:T].astype(np.int32)
    if kind == "prompt":
        positions = np.arange(100, 100 + T, dtype=np.int32)
    else:
        positions = rng.integers(0, n_pos, T).astype(np.int32)
        positions[-1] = n_pos - 1
        slots[1::5] = -1
    q_ref = np.zeros((T, HQ, hd), np.float32)
    kc_ref, vc_ref = np.zeros((n_slots, HKV, hd), np.float32), np.zeros((n_slots, HKV, hd), np.float32)
    rope_qkv(qkv, bias, qn, kn, 1e-6, cos, sin, positions, slots, HQ, HKV, q_ref, kc_ref, vc_ref)
    q_out = dev(np.zeros((T, HQ, hd)), dtype)
    kc, vc = dev(kc_ref * 0, dtype), dev(vc_ref * 0, dtype)
    opt = [None if a is None else dev(a, dtype) for a in (bias, qn, kn)]
    d_qkv = dev(np.concatenate([np.zeros(offset), qkv.reshape(-1)]), dtype)[offset:].reshape(qkv.shape)
    K(dtype).rope_qkv(d_qkv, *opt, 1e-6, cp.asarray(cos), cp.asarray(sin), ints(positions), ints(slots),
                      HQ, HKV, q_out, kc, vc)
    check("rope_qkv.q", host(q_out, dtype), q_ref, dtype)
    check("rope_qkv.k_cache", host(kc, dtype), kc_ref, dtype)  # unwritten slots: 0 on both sides
    check("rope_qkv.v_cache", host(vc, dtype), vc_ref, dtype)
    written = np.zeros(n_slots, bool)
    written[slots[slots >= 0]] = True
    assert not host(kc, dtype)[~written].any() and not host(vc, dtype)[~written].any(), \
        "rope_qkv wrote cache slots outside slot_mapping"


def test_rope_qkv_skips_rows_it_cannot_place():
    """A position outside the rope table skips the whole row; a slot past the cache skips the K/V writes. The CPU
    twin rejects both (ValueError); the GPU must simply never write out of bounds."""
    dtype, hd, NH, n_pos, n_slots = "bfloat16", 64, HQ + 2 * HKV, 64, 32
    cos, sin = rope_tables(n_pos, hd)
    qkv = dev(np.ones((4, NH * hd)), dtype)
    q_out = dev(np.full((4, HQ, hd), SENTINEL), dtype)
    kc, vc = dev(np.zeros((n_slots, HKV, hd)), dtype), dev(np.zeros((n_slots, HKV, hd)), dtype)
    K(dtype).rope_qkv(qkv, None, None, None, 1e-6, cp.asarray(cos), cp.asarray(sin), ints([n_pos, -3, 5, 6]),
                      ints([0, 1, n_slots, 3]), HQ, HKV, q_out, kc, vc)
    q = host(q_out, dtype)
    assert (q[:2] == SENTINEL).all(), "rows outside the rope table must not be written"
    assert (q[2:] != SENTINEL).all(), "rows inside the table must be written"
    k, v = host(kc, dtype), host(vc, dtype)
    assert not k[[0, 1]].any() and not v[[0, 1]].any(), "K/V written for a position outside the table"
    assert k[3].any() and v[3].any() and not np.delete(k, 3, 0).any(), "only slot 3 may be written"


# -- paged decode attention ----------------------------------------------------------------------------------------
DECODE_CASES = {  # name: (Hq, Hkv, D, lens, max_seq_len, block_size)
    "long": (HQ, HKV, 64, [1, 100, 4096, 4095, 0, 32768, 20001, 17], 32768, 16),
    "b256": (HQ, HKV, 64, "ragged256", 2048, 16),
    "b32x4096": (HQ, HKV, 64, [4096] * 31 + [0], 4096, 16),
    "d128": (HQ, HKV, 128, [777, 1, 5000], 8192, 16),
    "group16": (32, 2, 128, [1500, 3], 2048, 32),   # GQA group 16 > 8 q heads per block
    # Short plans at a small batch: a GQA group over several blocks (decode_head_blocks), lengths around one split
    # of ONE_SPLIT_TILES tiles (bf16 D=64: 128 keys, fp32: 64) and past it.
    "short_b1": (HQ, HKV, 64, [100], 512, 16),
    "short_ragged": (HQ, HKV, 64, [1, 65, 129, 256], 256, 16),
    "group16_short": (32, 2, 128, [3, 130], 256, 32),
    "d256": (8, 2, 256, [1000, 3, 0], 1024, 16),
    "d32_bs7": (4, 4, 32, [5, 300, 64], 512, 7),    # tiny-model head dim; blocks that do not divide a tile
    # The bench's decode at batch 32: every length around the tensor-core kernel's 64-key tiles, 16-key warp slices
    # and its one-split limit (4 tiles), and past it.
    "b32_short": (HQ, HKV, 64, [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 0] * 2, 512, 16),
    # The bench suite's long contexts at its other shapes' heads (qwen3-0.6b, llama-3.2-1b, qwen2.5-1.5b): lengths
    # around the stream kernel's ring (3 or 4 tiles in flight) and split boundaries, a padding row.
    "qwen3_8k": (16, 8, 128, [8192, 8191, 193, 4097, 0, 2048], 8192, 16),
    "llama_8k": (32, 8, 64, [8192, 1, 257, 6000], 8192, 16),
    "qwen15_2k": (12, 2, 128, [2048, 2047, 129, 1000, 3], 2048, 16),
    "b128x2048": (HQ, HKV, 64, [2048] * 120 + [1, 64, 65, 192, 193, 256, 257, 0], 2048, 16),
}
KINDS = {"cuda_cores": "decode_attention", "tc": "decode_attention_tc", "stream": "decode_attention_stream"}


@functools.lru_cache(maxsize=None)
def decode_case(name):
    hq, hkv, hd, lens, max_len, bs = DECODE_CASES[name]
    rng = np.random.default_rng(len(name) + hd)
    if lens == "ragged256":
        lens = rng.integers(1, max_len + 1, 256)
        lens[[0, 77, 200]] = 0
        lens[[1, 100]] = max_len, 1
    kc, vc, table = paged(rng, [int(x) for x in lens], hkv, hd, bs)
    q = rounded(2 * rng.standard_normal((len(lens), hq, hd)), "bfloat16")
    ref = np.full_like(q, np.nan)
    seq_lens = np.asarray(lens, np.int32)
    decode_attention(q, kc, vc, table, seq_lens, bs, 1 / np.sqrt(hd), ref)
    return q, kc, vc, table, seq_lens, ref


@pytest.mark.parametrize("dtype, kind", [("float32", "cuda_cores"), ("bfloat16", "cuda_cores"),
                                         ("float16", "cuda_cores"), ("bfloat16", "tc"), ("float16", "tc"),
                                         ("bfloat16", "stream"), ("float16", "stream")])
@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_attention(dtype, kind, name):
    """The three kernels against the CPU twin: decode_attention (CUDA cores) everywhere, and decode_attention_tc and
    its long-context form decode_attention_tc_stream where they apply (16-bit, D 64 or 128, GQA groups up to 16);
    elsewhere those refuse the shape."""
    hq, hkv, hd, _, max_len, bs = DECODE_CASES[name]
    q, kc, vc, table, seq_lens, ref = decode_case(name)
    out = dev(np.full_like(q, SENTINEL), dtype)
    kern = K(dtype)
    launch = getattr(kern, KINDS[kind])
    args = (dev(q, dtype), dev(kc, dtype), dev(vc, dtype), ints(table), ints(seq_lens), bs, 1 / np.sqrt(hd), out,
            max_len)
    if kind != "cuda_cores" and not (hd in (64, 128) and hq // hkv <= 16):
        with pytest.raises(ValueError, match="decode_attention_tc"):
            launch(*args)
        return
    launch(*args)
    if kind != "cuda_cores":  # the kernel's own twin, at the plan's split count
        plan = kern._decode_plans[(len(seq_lens), hq, hkv, hd, max_len, kind, None)]
        ref = np.full_like(q, np.nan)
        twin = decode_attention_tc_stream if kind == "stream" else decode_attention_tc
        twin(q, kc, vc, table, seq_lens, bs, 1 / np.sqrt(hd), ref, int(plan[2]))
    got = host(out, dtype)
    assert not got[seq_lens == 0].any(), "padding rows (seq_len 0) must be zeros"
    check(f"{KINDS[kind]}({name}: B={len(seq_lens)}, Hq={hq}, Hkv={hkv}, "
          f"D={hd}, max len {seq_lens.max()})", got, ref, dtype)


@pytest.mark.parametrize("n_splits", [1, 2, 3, 7, 64, 300])
def test_decode_attention_stream_at_any_split_count(n_splits):
    """decode_attention_tc_stream at split counts its plan may not pick (dev/decode_attention_long.py sweeps them):
    one split of 128 tiles, splits that end mid-ring, more splits than tiles; the merge's thread sharing (a GQA
    group of 2 at D = 128: 64 columns, 2 threads a column) and its 8-deep loads."""
    dtype, (hq, hkv, hd) = "bfloat16", (16, 8, 128)
    rng = np.random.default_rng(n_splits)
    lens = [8192, 5000, 1, 0, 300]
    kc, vc, table = paged(rng, lens, hkv, hd, 16)
    q = rounded(2 * rng.standard_normal((len(lens), hq, hd)), "bfloat16")
    seq_lens = np.asarray(lens, np.int32)
    out = dev(np.full_like(q, SENTINEL), dtype)
    K(dtype).decode_attention_stream(dev(q, dtype), dev(kc, dtype), dev(vc, dtype), ints(table), ints(seq_lens), 16,
                                     1 / np.sqrt(hd), out, 8192, n_splits=n_splits)
    ref = np.full_like(q, np.nan)
    decode_attention_tc_stream(q, kc, vc, table, seq_lens, 16, 1 / np.sqrt(hd), ref, n_splits)
    check(f"decode_attention_stream(n_splits={n_splits})", host(out, dtype), ref, dtype)


@pytest.mark.parametrize("kind", list(KINDS))
def test_decode_step_replays_in_a_cuda_graph(kind):
    """rope_qkv + decode_attention (either kernel) for a batch of 4 captured once, replayed with new positions,
    slots, lengths and block tables written into the same device buffers (a padding row included), against the CPU
    twins."""
    dtype, B, bs, max_len, NH = "bfloat16", 4, 16, 1024, HQ + 2 * HKV
    kern, rng = K(dtype), np.random.default_rng(7)
    M = max_len // bs
    n_slots = B * M * bs
    kc_ref = rounded(rng.standard_normal((n_slots, HKV, D)), dtype)
    vc_ref = rounded(rng.standard_normal((n_slots, HKV, D)), dtype)
    cos, sin = rope_tables(max_len, D)
    d_cos, d_sin = cp.asarray(cos), cp.asarray(sin)
    d_qkv, d_q = dev(np.zeros((B, NH * D)), dtype), dev(np.zeros((B, HQ, D)), dtype)
    d_out = dev(np.zeros((B, HQ, D)), dtype)
    d_kc, d_vc = dev(kc_ref, dtype), dev(vc_ref, dtype)
    pos, slots, lens = ints(np.zeros(B)), ints(np.full(B, -1)), ints(np.zeros(B))
    d_table = ints(np.zeros((B, M)))

    decode = getattr(kern, KINDS[kind])

    def step():
        kern.rope_qkv(d_qkv, None, None, None, 1e-6, d_cos, d_sin, pos, slots, HQ, HKV, d_q, d_kc, d_vc)
        decode(d_q, d_kc, d_vc, d_table, lens, bs, 0.125, d_out, max_len)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        step()  # compile + allocate the workspace outside the capture (all padding rows: no cache writes)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        for lengths in ([5, 700, 1, 0], [1024, 33, 0, 512]):
            seq_lens = np.array(lengths, np.int32)
            table = rng.permutation(B * M).reshape(B, M).astype(np.int32)  # a fresh shuffle per replay
            p = np.maximum(seq_lens - 1, 0).astype(np.int32)
            s = np.where(seq_lens > 0, table[np.arange(B), p // bs] * bs + p % bs, -1).astype(np.int32)
            qkv = rounded(rng.standard_normal((B, NH * D)), dtype)
            for d, h in ((d_qkv, dev(qkv, dtype)), (pos, ints(p)), (slots, ints(s)), (lens, ints(seq_lens)),
                         (d_table, ints(table))):
                d[...] = h
            graph.launch(stream)
            stream.synchronize()
            q_ref = np.zeros((B, HQ, D), np.float32)
            rope_qkv(qkv, None, None, None, 1e-6, cos, sin, p, s, HQ, HKV, q_ref, kc_ref, vc_ref)
            w = s[s >= 0]
            kc_ref[w], vc_ref[w] = rounded(kc_ref[w], dtype), rounded(vc_ref[w], dtype)
            ref = np.empty((B, HQ, D), np.float32)
            decode_attention(rounded(q_ref, dtype), kc_ref, vc_ref, table, seq_lens, bs, 0.125, ref)
            check(f"graph replay at seq_lens={lengths}", host(d_out, dtype), ref, dtype)


# -- paged varlen prefill attention -------------------------------------------------------------------------------
PREFILL_CASES = {  # name: (Hq, Hkv, D, q_lens, cached prefixes, block_size, first row, rows after)
    "prompt4096": (HQ, HKV, 64, [4096], [0], 16, 0, 0),
    "mixed_d128": (HQ, HKV, 128, [1, 77, 300, 64, 1000, 5], [0, 100, 0, 4000, 300, 30000], 16, 7, 3),
    "mixed_d64": (HQ, HKV, 64, [130, 1, 64, 500, 2], [32000, 9, 0, 700, 0], 16, 3, 0),
    "chunks_b64": (HQ, HKV, 64, "chunks64", None, 16, 0, 5),
    "bs8_d64": (HQ, HKV, 64, [200, 65], [63, 1], 8, 1, 1),   # a 64-key tile spans 8 blocks
    "d256": (8, 2, 256, [40, 9], [3, 0], 16, 2, 0),           # CUDA cores only (> 48 KB smem)
    "llama_2k": (32, 8, 64, [2048, 300], [0, 1500], 16, 0, 0),   # Llama-3.2-1B's heads: a prompt, a chunk
    "qwen15b_2k": (12, 2, 128, [2048, 129], [0, 640], 16, 0, 0),  # Qwen2.5-1.5B's heads
    # The last 512-token chunk of a 4,096-token prompt: wg splits its keys (prefill_splits: 4 at D 64, 2 at 128).
    "chunk512_d64": (HQ, HKV, 64, [512], [3584], 16, 0, 0),
    "chunk512_d128": (16, 8, 128, [512], [3584], 16, 2, 3),   # Qwen3-0.6B's heads
}


@functools.lru_cache(maxsize=None)
def prefill_case(name):
    hq, hkv, hd, q_lens, prefixes, bs, first, after = PREFILL_CASES[name]
    rng = np.random.default_rng(len(name) + hd)
    if q_lens == "chunks64":  # chunked prefill of 64 requests: ragged chunks over ragged cached prefixes
        q_lens, prefixes = rng.integers(1, 100, 64).tolist(), rng.integers(0, 2000, 64).tolist()
    seq_lens = np.array([p + n for p, n in zip(prefixes, q_lens)], np.int32)
    kc, vc, table = paged(rng, seq_lens.tolist(), hkv, hd, bs)
    qsl = (first + np.concatenate([[0], np.cumsum(q_lens)])).astype(np.int32)
    N = int(qsl[-1]) + after
    q = np.full((N, hq, hd), np.nan, np.float32)  # rows outside the sequences: NaN, must never be read
    q[first:qsl[-1]] = rounded(1.5 * rng.standard_normal((qsl[-1] - first, hq, hd)), "bfloat16")
    ref = np.full_like(q, SENTINEL)
    prefill_attention(q, kc, vc, table, qsl, seq_lens, bs, 1 / np.sqrt(hd), ref)
    return q, kc, vc, table, qsl, seq_lens, ref, max(q_lens)


@pytest.mark.parametrize("dtype, kind", [("float32", "cuda_cores"), ("bfloat16", "tc"), ("bfloat16", "cuda_cores"),
                                         ("float16", "tc"), ("bfloat16", "wg"), ("float16", "wg")])
@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_prefill_attention(dtype, kind, name):
    """prefill_attention (CUDA cores) and, where they apply (16-bit, D 64 or 128; wg on an sm_90 GPU),
    prefill_attention_tc and prefill_attention_wg against the CPU twin; elsewhere tc and wg refuse the shape."""
    hq, hkv, hd, _, _, bs, first, _ = PREFILL_CASES[name]
    kern = K(dtype)
    if kind == "wg" and not kern.sm90:
        pytest.skip("prefill_attention_wg needs an sm_90 GPU")
    if kind == "cuda_cores" and name in ("llama_2k", "qwen15b_2k"):
        pytest.skip("the model-shape cases are for the tensor-core kernels (the CUDA-core kernel has prompt4096)")
    q, kc, vc, table, qsl, seq_lens, ref, max_q = prefill_case(name)
    out = dev(np.full_like(q, SENTINEL), dtype)
    args = (dev(q, dtype), dev(kc, dtype), dev(vc, dtype), ints(table), ints(qsl), ints(seq_lens), bs,
            1 / np.sqrt(hd), out, max_q)
    fn = {"cuda_cores": kern.prefill_attention, "tc": kern.prefill_attention_tc, "wg": kern.prefill_attention_wg}[kind]
    if kind != "cuda_cores" and hd not in (64, 128):
        with pytest.raises(ValueError, match=f"prefill_attention_{kind}"):
            fn(*args)
        return
    fn(*args)
    got = host(out, dtype)
    outside = np.ones(len(q), bool)
    outside[qsl[0]:qsl[-1]] = False
    assert (got[outside] == SENTINEL).all(), "rows outside query_start_loc[0]..query_start_loc[B] were written"
    check(f"prefill_attention({kind}, {name}: B={len(seq_lens)}, D={hd}, max q_len {max_q}, "
          f"max len {seq_lens.max()})", got, ref, dtype)


@pytest.mark.parametrize("n_splits", [None, 2, 3, 8])
@pytest.mark.parametrize("name", [n for n, c in PREFILL_CASES.items() if c[2] in (64, 128)])
def test_prefill_attention_splits(name, n_splits):
    """prefill_attention_wg with each query tile's keys in n_splits blocks (None: prefill_splits' count for the
    case) and prefill_attention_merge combining them, against the CPU twin; rows outside the batch untouched."""
    kern = K("bfloat16")
    if not kern.sm90:
        pytest.skip("prefill_attention_wg needs an sm_90 GPU")
    hd, bs = PREFILL_CASES[name][2], PREFILL_CASES[name][5]
    q, kc, vc, table, qsl, seq_lens, ref, max_q = prefill_case(name)
    out = dev(np.full_like(q, SENTINEL), "bfloat16")
    kern.prefill_attention_wg(dev(q, "bfloat16"), dev(kc, "bfloat16"), dev(vc, "bfloat16"), ints(table), ints(qsl),
                              ints(seq_lens), bs, 1 / np.sqrt(hd), out, max_q, n_splits=n_splits)
    got = host(out, "bfloat16")
    outside = np.ones(len(q), bool)
    outside[qsl[0]:qsl[-1]] = False
    assert (got[outside] == SENTINEL).all(), "rows outside query_start_loc[0]..query_start_loc[B] were written"
    check(f"prefill_attention_wg({name}, {n_splits} splits, block size {bs})", got, ref, "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_attention_merge(dtype):
    """The merge kernel alone against its twin, on the twin's partials of a 200-token chunk after 900 cached tokens
    in 4 splits of the kernel's tiles (rows whose position precedes a split hold NaN there: never read)."""
    from kernels.prefill_attention import prefill_attention_merge, prefill_attention_splits
    from toolkit.backends.cuda_kernels import WG_QUERIES

    rng = np.random.default_rng(3)
    lead, trail, bs, hq, hkv, hd = 2, 3, 16, HQ, HKV, 64
    seq_lens = np.array([1100, 40], np.int32)
    kc, vc, table = paged(rng, seq_lens.tolist(), hkv, hd, bs)
    qsl = (lead + np.array([0, 200, 240])).astype(np.int32)
    q = rounded(rng.standard_normal((qsl[-1] + trail, hq, hd)), "bfloat16")
    ws_o, ws_ml = prefill_attention_splits(q, kc, vc, table, qsl, seq_lens, bs, 0.125, 4, WG_QUERIES, 64)
    ref = np.full(q.shape, SENTINEL, np.float32)
    prefill_attention_merge(ws_o, ws_ml, qsl, seq_lens, table.shape[1] * bs, WG_QUERIES, 64, ref)
    kern, out = K(dtype), dev(np.full(q.shape, SENTINEL), dtype)
    merge = kern._fn("prefill_attention", f"prefill_attention_merge<{kern.ctype}>")
    merge((len(q),), (128,), (cp.asarray(ws_o, cp.float32), cp.asarray(ws_ml, cp.float32), ints(qsl),
                              ints(seq_lens), np.int32(2), np.int32(table.shape[1] * bs), np.int32(4),
                              np.int32(WG_QUERIES), np.int32(64), np.int32(hq), np.int32(hd), out))
    got = host(out, dtype)
    assert (got[:lead] == SENTINEL).all() and (got[qsl[-1]:] == SENTINEL).all()
    check("prefill_attention_merge (4 splits)", got, ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("M", [1, 2, 4])
@pytest.mark.parametrize("I, Kin", [(4864, 896), (37, 2048), (8960, 1536)])
def test_gemv_swiglu(dtype, M, I, Kin):
    """The gate_up GEMV with SwiGLU as its epilogue (Qwen2.5-0.5B's and -1.5B's MLP; 37 units of 2 or 4 warps)
    against its twin, and bit for bit against the two kernels it replaces (gemv into gate_up, then silu_mul)."""
    from kernels.gemv import gemv_swiglu

    rng = np.random.default_rng(M * I + Kin)
    x, w = rounded(rng.standard_normal((M, Kin)), dtype), rounded(0.05 * rng.standard_normal((2 * I, Kin)), dtype)
    ref = np.empty((M, I), np.float32)
    gemv_swiglu(x, w, ref)
    k, xd, wd = K(dtype), dev(x, dtype), dev(w, dtype)
    out = dev(np.zeros((M, I)), dtype)
    k.gemv_swiglu(xd, wd, out)
    got = host(out, dtype)
    check(f"gemv_swiglu(M={M}, I={I})", got, ref, dtype)
    gate_up, act = dev(np.zeros((M, 2 * I)), dtype), dev(np.zeros((M, I)), dtype)
    k.gemv(xd, wd, gate_up)
    k.silu_mul(gate_up, act)
    np.testing.assert_array_equal(got, host(act, dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("M, N, Kin, logits", [(1, 1152, 896, False), (4, 896, 4864, False), (3, 9728, 896, False),
                                               (1, VOCAB, 896, True), (2, 40, 24, True), (3, 37, 2048, False),
                                               (2, 1000, 8960, False), (1, 1536, 8960, True)])
def test_gemv(dtype, M, N, Kin, logits):
    """Shapes for every warps-per-row choice (gemv_warps_per_row: 1 at K = 896 in bf16, up to 8 at K = 8,960),
    and N not a multiple of the rows a block takes (37 rows, 2 or 4 a block)."""
    from kernels.gemv import gemv

    rng = np.random.default_rng(M * N)
    x, w = rounded(rng.standard_normal((M, Kin)), dtype), rounded(0.05 * rng.standard_normal((N, Kin)), dtype)
    ref = np.empty((M, N), np.float32)
    gemv(x, w, ref)
    out = cp.empty((M, N), cp.float32) if logits else dev(np.zeros((M, N)), dtype)
    K(dtype).gemv(dev(x, dtype), dev(w, dtype), out)
    check("gemv", host(out, "float32" if logits else dtype), ref, "float32" if logits and dtype == "float32"
          else dtype)

