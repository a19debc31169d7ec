"""decode_attention's rope_in_attention variant (kernels/decode_attention.cu, ROPE = true) on the GPU: rope_qkv's
work done inside the attention must give the very bits of rope_qkv followed by the plain kernel: the same output,
and the same K/V written into the caches. Every decode case of test_gpu_kernels (ragged batches up to 256, contexts
up to 32K that split, GQA groups over 8 heads, head dims 32-256, padding rows), with a bias or Qwen3's q/k norms."""
import numpy as np
import pytest
from tests.kernels.test_gpu_kernels import DECODE_CASES, K, decode_case, dev, host, ints, rope_tables

cp = pytest.importorskip("cupy")
from tests.gpu_arrays import rounded  # noqa: E402

pytestmark = pytest.mark.gpu


def slot_of(table, bs, key):
    return int(table[key // bs]) * bs + key % bs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("variant", ["bias", "qk_norm"])
@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_fused_equals_rope_then_attention(dtype, variant, name):
    hq, hkv, hd, _, max_len, bs = DECODE_CASES[name]
    _, kc, vc, table, seq_lens, _ = decode_case(name)
    B, NH = len(seq_lens), hq + 2 * hkv
    rng = np.random.default_rng(B + hd)
    qkv = rounded(rng.standard_normal((B, NH * hd)), dtype)
    bias = rounded(0.5 * rng.standard_normal(NH * hd), dtype) if variant == "bias" else None
    qn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    kn = rounded(1 + 0.2 * rng.standard_normal(hd), dtype) if variant == "qk_norm" else None
    cos, sin = rope_tables(max(max_len, int(seq_lens.max())) + 1, hd)
    positions = np.maximum(seq_lens - 1, 0).astype(np.int32)
    slots = np.array([slot_of(table[b], bs, L - 1) if L else -1 for b, L in enumerate(seq_lens)], np.int32)
    kc, vc = kc.copy(), vc.copy()
    kc[slots[slots >= 0]] = np.nan  # the new token's K/V: must be written before the attention reads them
    vc[slots[slots >= 0]] = np.nan
    k = K(dtype)
    d = [None if a is None else dev(a, dtype) for a in (qkv, bias, qn, kn)]
    rope = (*d, 1e-6, cp.asarray(cos), cp.asarray(sin), ints(positions), ints(slots))
    runs = []
    for fused in (False, True):
        q = dev(np.zeros((B, hq, hd)), dtype)
        kcd, vcd = dev(kc, dtype), dev(vc, dtype)
        out = dev(np.full((B, hq, hd), 7.0), dtype)
        if not fused:
            k.rope_qkv(*rope, hq, hkv, q, kcd, vcd)
        k.decode_attention(q, kcd, vcd, ints(table), ints(seq_lens), bs, 1 / np.sqrt(hd), out, max_len,
                           rope if fused else None)
        runs.append([host(a, dtype) for a in (out, kcd, vcd)])
    (out0, k0, v0), (out1, k1, v1) = runs
    assert not np.isnan(out0).any(), "the unfused reference read an unwritten slot"
    np.testing.assert_array_equal(out1, out0)
    np.testing.assert_array_equal(k1, k0)  # NaN == NaN here: the untouched slots stay as they were
    np.testing.assert_array_equal(v1, v0)


@pytest.mark.parametrize("bad", ["cos", "positions", "q_norm"])
def test_bad_rope_inputs_are_refused_by_both_paths(bad):
    """rope_qkv and decode attention's rope variant share one input check: the same bad input is a one-line
    ValueError naming the op, before any launch."""
    hq, hkv, hd, bs = 14, 2, 64, 16
    B, NH, dtype = 3, hq + 2 * hkv, "bfloat16"
    qkv = dev(np.zeros((B, NH * hd)), dtype)
    cos, sin = rope_tables(64, hd)
    if bad == "cos":
        cos, sin = cos[:, :hd // 4], sin[:, :hd // 4]
    positions = ints(np.zeros(B - 1 if bad == "positions" else B, np.int32))
    qn = dev(np.ones(hd + 2 if bad == "q_norm" else hd), dtype)
    rope = (qkv, None, qn, dev(np.ones(hd), dtype), 1e-6, cp.asarray(cos), cp.asarray(sin), positions,
            ints(np.arange(B, dtype=np.int32)))
    k = K(dtype)
    kc, vc = dev(np.zeros((64, hkv, hd)), dtype), dev(np.zeros((64, hkv, hd)), dtype)
    with pytest.raises(ValueError, match="^rope_qkv: "):
        k.rope_qkv(*rope, hq, hkv, dev(np.zeros((B, hq, hd)), dtype), kc, vc)
    table, seq_lens = ints(np.arange(4, dtype=np.int32).reshape(1, 4).repeat(B, 0)), ints(np.ones(B, np.int32))
    with pytest.raises(ValueError, match=r"^decode_attention\(rope\): "):
        k.decode_attention(dev(np.zeros((B, hq, hd)), dtype), kc, vc, table, seq_lens, bs, 0.125,
                           dev(np.zeros((B, hq, hd)), dtype), 64, rope)
