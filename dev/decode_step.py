"""What the decode-step benchmarks share (decode_attribution.py): a pure decode step staged at one context length
for every request, and the time of a captured graph replayed back to back."""
import statistics

import numpy as np

from toolkit.engine.step import StepBatch


def uniform_step(runner, B: int, length: int):
    """Stage a pure decode step of B requests, each with `length` tokens of context (its new token at position
    length - 1, in blocks of its own), and a greedy sampler batch for it (fast path). Returns (step, sampler batch),
    what runner.graph_body takes."""
    bs = runner.kv.block_size
    nb = -(-length // bs)
    tables = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
    batch = StepBatch(np.zeros(B, np.int32), np.full(B, length - 1, np.int32),
                      (tables[:, (length - 1) // bs] * bs + (length - 1) % bs).astype(np.int32),
                      np.arange(B + 1, dtype=np.int32), np.full(B, length, np.int32), tables, B,
                      runner.context_bucket(length))
    runner.be.bind_thread()
    sb = runner.sampler.prepare([None] * B, batch.seq_lens, np.ones(B, bool), B, True)
    step = runner.stager.stage(batch)
    runner.sampler.stage(sb)
    return step, sb


def replay_us(be, graph, replays: int = 200, repeats: int = 5) -> tuple:
    """(median, stddev) over `repeats` of the µs a replay of `graph` takes, `replays` back to back, after 20."""
    cp = be.cp
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(20):
        be.replay(graph)
    out = []
    for _ in range(repeats):
        start.record(be.stream)
        for _ in range(replays):
            be.replay(graph)
        end.record(be.stream)
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / replays)
    return statistics.median(out), statistics.pstdev(out)
