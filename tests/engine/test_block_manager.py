"""KV block bookkeeping: allocation, reference counts, prefix hashes, eviction."""
import pytest

from toolkit.engine.block_manager import BlockManager, slot_mapping
from toolkit.engine.sequence import SamplingParams, Sequence

BS = 4


def seq(tokens):
    return Sequence(list(tokens), SamplingParams())


def run_prefill(bm, s):
    """Admit s with its prefix hits, allocate the rest and mark everything computed (as a step would)."""
    hits = bm.match_prefix(s)
    bm.admit(s, hits)
    cached = len(hits) * BS
    s.num_computed = cached
    n = s.num_tokens - cached
    assert bm.needed(s, n) <= bm.num_free
    bm.append_slots(s, n)
    bm.commit(s, s.num_computed + n)
    s.num_computed += n
    return cached


def test_allocate_and_release():
    bm = BlockManager(8, BS)
    s = seq(range(10))
    assert bm.needed(s, 10) == 3
    run_prefill(bm, s)
    assert len(s.block_table) == 3 and bm.num_free == 5
    assert slot_mapping(s.block_table, 0, 10, BS)[4] == s.block_table[1] * BS  # position 4: second block
    bm.append_slots(s, 2)  # positions 10, 11 fit the third block
    assert len(s.block_table) == 3
    bm.append_slots(s, 3)
    assert len(s.block_table) == 4 and bm.num_free == 4
    bm.release(s)
    assert bm.num_free == 8 and s.block_table == []


def test_prefix_hits_share_blocks():
    bm = BlockManager(16, BS)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    run_prefill(bm, a)
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 99])  # shares two full blocks
    assert run_prefill(bm, b) == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    c = seq([1, 2, 3, 5, 5, 6, 7, 8, 9])  # differs inside the first block: no hit at all
    assert run_prefill(bm, c) == 0


def test_last_token_is_always_recomputed():
    bm = BlockManager(16, BS)
    run_prefill(bm, seq(range(8)))
    again = seq(range(8))  # identical: only the first block may be reused, its last token must run
    assert run_prefill(bm, again) == 4


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(4, BS)
    a = seq(range(9))
    run_prefill(bm, a)
    bm.release(a)
    assert bm.num_free == 4
    b = seq(range(9))
    assert run_prefill(bm, b) == 8  # revived from the free list
    bm.release(b)
    c = seq(range(100, 116))  # needs every block: the cached ones are evicted
    run_prefill(bm, c)
    bm.release(c)
    assert run_prefill(bm, seq(range(9))) == 0


def test_prefix_caching_off():
    bm = BlockManager(8, BS, prefix_caching=False)
    run_prefill(bm, seq(range(9)))
    assert run_prefill(bm, seq(range(9))) == 0 and bm.cached == {}


def test_generated_tokens_are_committed_too():
    """A reply's blocks become reusable prefix (a multi-turn chat resends it)."""
    bm = BlockManager(8, BS)
    a = seq(range(6))
    run_prefill(bm, a)
    for t in (50, 51):  # two decode steps
        a.token_ids.append(t)
        bm.append_slots(a, 1)
        bm.commit(a, a.num_computed + 1)
        a.num_computed += 1
    follow_up = seq(list(range(6)) + [50, 51, 7])
    assert run_prefill(bm, follow_up) == 8


@pytest.mark.parametrize("n", [1, 4, 5, 16])
def test_needed_counts_blocks(n):
    bm = BlockManager(8, BS)
    s = seq(range(3))
    assert bm.needed(s, n) == -(-n // BS)


def test_table_array_follows_the_table_through_growth_and_release():
    """The int32 copy the runner stacks each step is extended in place as blocks are added; a release starts it
    over, so a re-admitted request of the same length never reads its old blocks (runner.prepare, host time)."""
    from toolkit.engine.block_manager import table_array

    bm = BlockManager(64, BS)
    s = seq(range(10))
    run_prefill(bm, s)
    assert table_array(s).tolist() == s.block_table
    for _ in range(40):  # decode: the table grows past the array's first capacity (16)
        s.token_ids.append(7)
        bm.append_slots(s, 1)
        s.num_computed += 1
        assert table_array(s).tolist() == s.block_table
    old = list(s.block_table)
    bm.release(s)
    other = seq(range(100, 110))  # takes the freed blocks, so s gets different ids back
    run_prefill(bm, other)
    s.token_ids = list(range(len(s.token_ids)))
    s.num_computed = 0
    bm.append_slots(s, len(s.token_ids))
    assert len(s.block_table) == len(old) and s.block_table != old
    assert table_array(s).tolist() == s.block_table
