"""Continuous batching without a model: budgets, chunked prefill, preemption, policies."""
from toolkit.engine.block_manager import BlockManager
from toolkit.engine.scheduler import Scheduler
from toolkit.engine.sequence import SamplingParams, Sequence, Status


def seq(n, start=0):
    return Sequence(list(range(start, start + n)), SamplingParams())


def step(sched):
    """Schedule, then pretend the model ran: advance, and append a token where one is due."""
    out = sched.schedule()
    for s, n in zip(out.seqs, out.num_new):
        s.num_computed += n
        if s.num_computed == s.num_tokens:
            s.token_ids.append(7)
    return out


def test_budgets_and_chunked_prefill():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=10, policy="mixed")
    a, b, c = seq(8), seq(6, 100), seq(3, 200)
    for s in (a, b, c):
        sched.add(s)
    out = step(sched)
    assert out.seqs == [a, b] and out.num_new == [8, 2]  # b is chunked into the leftover budget
    assert c.status is Status.WAITING  # max_num_seqs
    out = step(sched)
    assert out.seqs == [a, b] and out.num_new == [1, 4] and out.num_decodes == 1  # decodes first
    assert b.num_generated == 1


def test_preempts_newest_and_recomputes():
    bm = BlockManager(4, 4)  # 16 slots
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, policy="mixed")
    old, new = seq(7), seq(7, 50)
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefill: 2 blocks each, cache full
    assert bm.num_free == 0
    step(sched)  # positions 7: still in block 2 for both
    out = step(sched)  # position 8 needs a third block for old: new is preempted
    assert out.preempted == [new] and out.seqs == [old]
    assert new.status is Status.WAITING and new.num_computed == 0 and new.block_table == []
    assert new.num_generated == 2 and sched.waiting[0] is new  # its tokens are kept, first in line


def test_alone_and_too_big_finishes():
    bm = BlockManager(2, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    s = seq(7)
    sched.add(s)
    step(sched)
    step(sched)
    out = sched.schedule()  # position 8 needs a third block that does not exist
    assert out.out_of_memory == [s] and not out.seqs


def test_alternate_policy_separates_prefill_and_decode():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64, policy="alternate")
    a = seq(5)
    sched.add(a)
    step(sched)
    b = seq(5, 100)
    sched.add(b)
    out = step(sched)
    assert out.seqs == [b] and out.num_decodes == 0  # a's decode waits for the prefill step
    out = step(sched)
    assert out.seqs == [a, b] and out.num_decodes == 2


def test_alternate_decodes_while_the_queue_cannot_be_admitted():
    """A waiting request that does not fit yet must not stall the running ones (they free the room)."""
    bm = BlockManager(3, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, policy="alternate")
    a = seq(6)
    sched.add(a)
    step(sched)  # a holds 2 blocks
    big = seq(8, 100)  # needs 2 blocks + 1 for its first token: only 1 is free
    sched.add(big)
    out = step(sched)
    assert out.seqs == [a] and out.num_decodes == 1 and big.status is Status.WAITING
