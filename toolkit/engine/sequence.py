"""One request as the engine tracks it: its tokens, its KV blocks, its parameters, its progress.

    token_ids        prompt + every token generated so far
    num_computed     how many of them have their K/V in the cache; the next step feeds
                     token_ids[num_computed : num_computed + n]
    block_table      the KV blocks holding those tokens, in order (block i holds positions
                     i*block_size .. (i+1)*block_size - 1)

A step that feeds a request's last unfed token produces logits, from which the sampler picks
its next token; a step that feeds only part of a long prompt (chunked prefill) produces none.
Preemption frees the blocks and resets num_computed to 0: the request later recomputes
everything (the prefix cache may hand most of it back).
"""
import enum
import itertools
from dataclasses import dataclass, field

import numpy as np

from ..sampler.params import SamplingParams  # noqa: F401  (re-exported: existing imports)
from toolkit.engine.timings import StatsAccumulator


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt_ids: list
    params: SamplingParams
    request_id: str = ""
    token_ids: list = field(default_factory=list)
    num_computed: int = 0
    block_table: list = field(default_factory=list)
    block_hashes: list = field(default_factory=list)  # chained hashes of the full blocks committed so far
    table_array: object = None  # block_table's first table_filled ids as int32 (block_manager.table_array)
    table_filled: int = 0
    status: Status = Status.WAITING
    detokenizer: object = None
    seed: int = 0
    sampling: object = None  # RequestSampling (toolkit/sampler/state.py), set by the engine at admission
    text: str = ""  # the text emitted so far (stop strings are searched in its tail)
    held: str = ""  # new text held back while it may be the start of a stop string
    stats: StatsAccumulator = field(default_factory=StatsAccumulator)
    arrival_index: int = field(default_factory=lambda: next(_ids))  # admission order (preempt newest)

    def __post_init__(self):
        self.token_ids = list(self.prompt_ids)
        if not self.request_id:
            self.request_id = str(self.arrival_index)
        self.seed = self.params.seed if self.params.seed is not None else \
            int(np.random.SeedSequence().entropy % 2 ** 64)
        self.stats.prompt_tokens = len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_unfed(self) -> int:
        return len(self.token_ids) - self.num_computed
