"""decode_attention's rope_in_attention variant (kernels/decode_attention.cu, ROPE = true) on the GPU: rope_qkv's
work done inside the attention must give the very bits of rope_qkv followed by the plain kernel: the same output,
and the same K/V written into the caches. Every decode case of test_gpu_kernels (ragged batches up to 256, contexts
up to 32K that split, GQA groups over 8 heads, head dims 32-256, padding rows), with a bias or Qwen3's q/k norms."""
import numpy as np
import pytest
from test_gpu_kernels import DECODE_CASES, K, decode_case, dev, host, ints, rope_tables

cp = pytest.importorskip("cupy")
from gpu_arrays import rounded  # noqa: E402

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
