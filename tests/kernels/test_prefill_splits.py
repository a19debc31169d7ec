"""prefill_attention_wg's key splits and prefill_attention_merge (kernels/prefill_attention.cu), through their CPU
twins in kernels/prefill_attention.py: the split rule covers every key of every row exactly once, the partials a
split writes merge into the whole attention, and the host's split count keeps a wave of blocks. The GPU kernels are
checked against the same reference in tests/kernels/test_gpu_kernels.py (test_prefill_attention_splits)."""
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels.prefill_attention import (MIN_SPLIT_KEYS, prefill_attention_merge, prefill_attention_splits,
                                       split_keys)
from tests.kernels.test_cpu_kernels import attention_atol, make_batch, ref_attention
from toolkit.backends.cuda_kernels import (PREFILL_MAX_SPLITS, WG_BLOCKS_PER_SM, WG_KEYS, WG_QUERIES,
                                           prefill_splits, prefill_workspace_rows)

CU = (Path(__file__).parents[2] / "kernels" / "prefill_attention.cu").read_text()


def test_the_floor_of_a_split_is_the_kernels():
    assert int(re.search(r"WG_MIN_SPLIT_KEYS = (\d+);", CU).group(1)) == MIN_SPLIT_KEYS
    assert all(MIN_SPLIT_KEYS % bn == 0 for bn in WG_KEYS.values())  # splits start on a tile


@settings(max_examples=300, deadline=None)
@given(kv_len=st.integers(1, 40_000), n=st.integers(1, PREFILL_MAX_SPLITS), bn=st.sampled_from([64, 128]))
def test_splits_cover_every_key_once_in_whole_tiles(kv_len, n, bn):
    chunk = split_keys(kv_len, n, bn)
    assert chunk % bn == 0 and chunk >= MIN_SPLIT_KEYS
    used = -(-kv_len // chunk)  # the non-empty splits: [s * chunk, min((s + 1) * chunk, kv_len))
    assert used <= n
    covered = np.zeros(kv_len, int)
    for s in range(used):
        covered[s * chunk:min((s + 1) * chunk, kv_len)] += 1
    assert (covered == 1).all()


# (seq_lens, q_lens, Hq, Hkv, D, bs, rows before, rows after): prefixes deep into the cache, a prompt with none, a
# one-token chunk, a padding sequence, tiles of 16 queries and 8 keys with splits of at least 16 keys.
CASES = [
    ([300], [40], 4, 2, 8, 16, 0, 0),
    ([250, 37, 1, 0, 180], [50, 37, 1, 0, 3], 6, 2, 8, 8, 3, 2),
    ([129, 64], [129, 17], 4, 4, 16, 4, 0, 5),
]


@pytest.mark.parametrize("n_splits", [1, 2, 3, 8])
@pytest.mark.parametrize("case", CASES)
def test_split_partials_merge_into_the_whole_attention(case, n_splits):
    seq_lens, q_lens, Hq, Hkv, D, bs, lead, trail = case
    rng = np.random.default_rng(sum(seq_lens) + n_splits)
    q, k, v, tables, qsl, lens, out = make_batch(rng, seq_lens, q_lens, Hq, Hkv, D, bs, lead, trail)
    scale, bq, bn, floor = D ** -0.5, 16, 8, 16
    ws_o, ws_ml = prefill_attention_splits(q, k, v, tables, qsl, lens, bs, scale, n_splits, bq, bn, floor)
    prefill_attention_merge(ws_o, ws_ml, qsl, lens, tables.shape[1] * bs, bq, bn, out, floor)
    want = ref_attention(q, k, v, tables, qsl, lens, bs, scale, out)
    assert np.isfinite(out).all()
    np.testing.assert_array_less(np.abs(out - want), attention_atol(q, k, v, lens, scale) + 1e-30)
    assert (out[:lead] == 7.0).all() and (out[qsl[-1]:] == 7.0).all()  # rows outside the batch are untouched


def test_a_long_prefix_at_the_kernels_tiles():
    """The real tile sizes (128 queries, 64 keys, splits of at least 256 keys): a 200-token chunk after 900 cached
    tokens, 4 splits, where the split boundaries cut the chunk's own keys too."""
    rng = np.random.default_rng(7)
    q, k, v, tables, qsl, lens, out = make_batch(rng, [1100], [200], 2, 1, 8, 16)
    ws_o, ws_ml = prefill_attention_splits(q, k, v, tables, qsl, lens, 16, 0.3, 4, WG_QUERIES, 64)
    assert np.isnan(ws_ml[0, :, 3]).all() and np.isfinite(ws_ml[-1, :, 3]).all()  # row 0 (key 900) is in no split 3
    prefill_attention_merge(ws_o, ws_ml, qsl, lens, tables.shape[1] * 16, WG_QUERIES, 64, out)
    np.testing.assert_array_less(np.abs(out - ref_attention(q, k, v, tables, qsl, lens, 16, 0.3, out)),
                                 attention_atol(q, k, v, lens, 0.3) + 1e-30)


@pytest.mark.parametrize("heads, D, tokens, want", [
    (14, 64, 4096, 1),   # Qwen2.5-0.5B, a whole 4,096-token prompt: 448 blocks fill 132 SMs
    (14, 64, 512, 4),    # its 512-token chunk: 56 blocks
    (32, 64, 512, 2),    # Llama-3.2-1B's chunk
    (16, 128, 512, 2),   # Qwen3-0.6B's (one block an SM at head dim 128)
    (14, 64, 128, PREFILL_MAX_SPLITS),
])
def test_the_split_count_keeps_one_wave(heads, D, tokens, want):
    n = prefill_splits(1, tokens, tokens, heads, D, 132)
    assert n == want
    blocks = heads * -(-tokens // WG_QUERIES)
    assert n == 1 or n * blocks <= WG_BLOCKS_PER_SM[D] * 132


def test_the_split_count_counts_the_query_tiles_of_a_batch():
    """Many short requests: ~tokens / 128 + requests tiles, not requests x the longest one's."""
    assert prefill_splits(64, 100, 64 * 30, 14, 64, 132) == 1  # 64 requests' 64 x 14 blocks already fill the GPU
    assert prefill_splits(2, 2048, 2100, 14, 64, 132) == 1
    assert prefill_splits(2, 300, 310, 14, 64, 132) == 3  # 2 requests: 5 tiles of 14 heads, not 6


def test_eager_steps_of_any_row_count_share_a_few_workspaces():
    """The split workspace is kept for good (a graph holds its address), so eager steps of every row count up to the
    step budget must map to a handful of sizes, each holding its steps' rows."""
    rows = [prefill_workspace_rows(n) for n in range(1, 8193)]
    assert all(r >= n for n, r in zip(range(1, 8193), rows))
    assert all(r < 2 * n for n, r in zip(range(1, 8193), rows) if n > 128)
    assert len(set(rows)) == 7  # 128, 256, ..., 8192
