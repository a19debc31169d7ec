"""Decode attention's launch plan (toolkit/backends/cuda_kernels.py), on the CPU: how many blocks share a GQA
group and how many splits a sequence gets; and which decode kernel the step plan picks (toolkit/model/plan.py's
decode_tc_pays). The kernel derives each block's heads from grid.x alone, so a plan must never leave a block
without heads or give one more than 8 (MAXG in kernels/decode_attention.cu)."""
import math
import re

from hypothesis import given, strategies as st

from toolkit.backends.cuda_kernels import (HEAD_SPLIT_KV_BYTES, MAX_SPLITS, STREAM_STAGES, TC_DECODE_KT,
                                          TC_ONE_SPLIT_TILES, decode_head_blocks, decode_splits, kernel_source,
                                          stream_splits)
from toolkit.model.plan import decode_tc_pays

QWEN05 = dict(n_kv_heads=2, group=7)  # Qwen2.5-0.5B: 14 q heads over 2 kv heads


@given(st.integers(1, 256), st.integers(1, 16), st.integers(1, 32), st.integers(1, 200),
       st.integers(0, 4 * HEAD_SPLIT_KV_BYTES))
def test_every_block_gets_between_one_and_eight_heads(batch, n_kv_heads, group, n_sm, kv_bytes):
    blocks = decode_head_blocks(batch, n_kv_heads, group, n_sm, kv_bytes)
    per_block = math.ceil(group / blocks)  # what the kernel computes from gridDim.x / Hkv
    assert 1 <= per_block <= 8
    assert math.ceil(group / per_block) == blocks  # no spare block: the last one has heads too
    if kv_bytes > HEAD_SPLIT_KV_BYTES:
        assert blocks == math.ceil(group / 8)  # long K/V: read once per group (or per 8 heads)


def test_tensor_core_kernel_where_a_group_is_one_block():
    """decode_tc_pays: the tensor-core kernel (a block a GQA group) for the plans where the CUDA-core kernel gives
    a group one block too; the CUDA-core kernel where it spreads a group over blocks (batch 1, short plans)."""
    pays = [decode_tc_pays(b, 2, 7, 64, 2, 132, L) for b, L in ((32, 512), (32, 4096), (256, 512), (1, 512),
                                                                  (1, 32768), (8, 512), (16, 512))]
    assert pays == [True, True, True, False, True, False, True]


def test_small_batch_short_context_spreads_a_group():
    # Batch 1, a 512-key plan: a block a head (14 blocks instead of 2 for all the model's heads).
    assert decode_head_blocks(1, **QWEN05, n_sm=132, kv_bytes=2 * 512 * 2 * 64 * 2) == 7
    # Batch 32 fills the GPU with whole groups, and its 512-key K/V (8.4 MB) is past the limit anyway.
    assert decode_head_blocks(32, **QWEN05, n_sm=132, kv_bytes=2 * 32 * 512 * 2 * 64 * 2) == 1
    # Batch 32 at a small K/V: enough blocks for about one per SM, no more (3 heads a block, 192 blocks).
    assert decode_head_blocks(32, **QWEN05, n_sm=132, kv_bytes=1 << 20) == 3
    # A group of 16 needs two blocks even when it may not spread.
    assert decode_head_blocks(1, n_kv_heads=2, group=16, n_sm=132, kv_bytes=1 << 30) == 2


@given(st.integers(1, 256), st.integers(1, 16), st.integers(1, 4), st.sampled_from([32, 64, 128, 256]),
       st.sampled_from([2, 4]), st.integers(1, 1 << 17))
def test_split_count_is_bounded(batch, n_kv_heads, head_blocks, D, itemsize, max_seq_len):
    n = decode_splits(batch, n_kv_heads, head_blocks, D, itemsize, 132, max_seq_len)
    assert 1 <= n <= MAX_SPLITS


def test_a_plan_within_the_one_split_limit_has_one_split():
    """Every sequence of a plan of up to the kernel's one-split limit is one split (split_chunk), so the plan
    launches no blocks for other splits: the tensor-core kernel's 256-key plan at batch 32 has 1 split, its
    512-key plan 5 (4 of them empty below 257 keys); the CUDA-core kernel's limit is 2 tiles."""
    tc = dict(n_kv_heads=2, head_blocks=1, D=64, itemsize=2, n_sm=132, kt=TC_DECODE_KT,
              one_split_tiles=TC_ONE_SPLIT_TILES)
    assert decode_splits(32, max_seq_len=256, **tc) == 1 and decode_splits(32, max_seq_len=129, **tc) == 1
    assert decode_splits(32, max_seq_len=512, **tc) == 5
    assert decode_splits(1, 2, 7, 64, 2, 132, 128) == 1  # CUDA-core: 2 tiles of 64 keys (bf16, D = 64)
    assert decode_splits(1, 2, 7, 64, 2, 132, 256) == 4
    # Which kernel runs does not move with the shorter bucket: a 256-key plan decides as a 512-key one.
    assert all(decode_tc_pays(b, 2, 7, 64, 2, 132, 256) == decode_tc_pays(b, 2, 7, 64, 2, 132, 512)
               for b in (1, 8, 16, 32, 256))


@given(st.integers(1, 256), st.integers(1, 16), st.integers(1, 200), st.integers(1, 1 << 17))
def test_stream_split_count_is_bounded(batch, n_kv_heads, n_sm, max_seq_len):
    """stream_splits: between 1 and the plan's tiles (a split is never shorter than a tile at full context) and
    MAX_SPLITS."""
    n = stream_splits(batch, n_kv_heads, n_sm, max_seq_len)
    assert 1 <= n <= min(MAX_SPLITS, math.ceil(max_seq_len / TC_DECODE_KT))


def test_stream_splits_fill_the_gpu_and_keep_the_merge_small():
    """Batch 1 at 8,192 keys (Qwen2.5-0.5B: 2 kv heads) is spread over 64 blocks, a quarter of the double-buffered
    kernel's 128 splits (its one-block merge reads every split); a batch that fills the GPU by itself gets few
    splits."""
    assert stream_splits(1, n_kv_heads=2, n_sm=132, max_seq_len=8192) == 32  # the most (4 tiles a split)
    assert stream_splits(1, n_kv_heads=2, n_sm=132, max_seq_len=2048) == 16  # 2 tiles a split
    assert decode_splits(1, 2, 1, 64, 2, 132, 8192, TC_DECODE_KT, TC_ONE_SPLIT_TILES) == 128
    assert stream_splits(32, n_kv_heads=2, n_sm=132, max_seq_len=8192) == 4  # 256 blocks: one wave of 264
    assert stream_splits(128, n_kv_heads=2, n_sm=132, max_seq_len=8192) == 1


def test_the_plan_streams_long_context_buckets():
    """make_plan: decode attention on the stream kernel from STREAM_MIN_LEN on (16-bit, D 64 or 128), the
    short-context kernels below it; fp32 never; at D = 64 and K/V of STREAM_TC_TILES tiles a layer, the
    double-buffered tensor-core kernel (decode_stream_pays)."""
    from types import SimpleNamespace

    from toolkit.engine.options import EngineOptions
    from toolkit.model.plan import STREAM_MIN_LEN, decode_stream_pays, make_plan

    cfg = SimpleNamespace(hidden_size=896, intermediate_size=4864, head_dim=64, num_heads=14, num_kv_heads=2,
                          qkv_size=1152, qk_norm=False, vocab_size=151936)

    def kind(dtype, batch, bucket):
        be = SimpleNamespace(dtype=dtype, name="cuda", num_sms=132, sm90=True)
        return make_plan(be, cfg, batch, batch, bucket, EngineOptions()).decode_attention

    assert [kind("bfloat16", b, STREAM_MIN_LEN) for b in (1, 32, 128)] == ["stream"] * 3
    assert kind("bfloat16", 32, STREAM_MIN_LEN // 2) == "tc" and kind("bfloat16", 1, 256) == "cuda_cores"
    assert kind("float32", 32, 8192) == "cuda_cores"
    assert kind("bfloat16", 128, 4096) == "stream" and kind("bfloat16", 128, 16384) == "tc"  # 16K / 64K tiles
    assert decode_stream_pays(128, 8, 128, 16384)  # head dim 128: always from STREAM_MIN_LEN on


def test_stream_ring_depth_matches_the_kernel_source():
    """The host sizes the stream kernel's shared memory from STREAM_STAGES (Q and that many K and V tiles): it must
    be what decode_attention_tc.cu's dt_stream_stages compiles to, or the kernel would run past its shared memory
    (a deeper ring) or leave part of it unused (a shallower one)."""
    m = re.search(r"dt_stream_stages\(int D\) \{ return D == 64 \? (\d+) : (\d+); \}",
                  kernel_source("decode_attention_tc"))
    assert m, "dt_stream_stages not found"
    assert STREAM_STAGES == {64: int(m.group(1)), 128: int(m.group(2))}
