"""One request as the engine tracks it: its tokens, its KV blocks, its parameters, its progress.

    token_ids        prompt + every token generated so far
    num_computed     how many of them have their K/V in the cache; the next step feeds
                     token_ids[num_computed : num_computed + n]
    block_table      the KV blocks holding those tokens, in order (block i holds positions
                     i*block_size .. (i+1)*block_size - 1)

A step that feeds a request's last unfed token produces logits, from which the sampler picks
its next token; a step that feeds only part of a long prompt (chunked prefill) produces none. Preemption frees the blocks and resets num_computed to
0: the request later recomputes everything (the prefix cache may hand most of it back).
"""
import enum
import itertools
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from ..errors import ToolkitError
from ..timings import StatsAccumulator


# Temperatures below this sample as greedy (vLLM's _SAMPLING_EPS): logits / 1e-320 overflow to inf, and
# softmax(inf - inf) is NaN; the limit T -> 0 of temperature sampling is the argmax anyway.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy; 0 < T < GREEDY_BELOW is taken as 0
    seed: int | None = None  # None: drawn at random (and recorded on the Sequence)
    ignore_eos: bool = False
    stop_token_ids: tuple = ()

    def __post_init__(self):
        # The CLI's admission boundary (toolkit/requests.py) checks these first with friendlier messages;
        # this is the last line for every other caller (chat, bench, the UI, tests).
        def integer(v):  # bool is an Integral too, and never a count or a seed
            return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))

        if not integer(self.max_tokens) or self.max_tokens < 0:
            raise ToolkitError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        t = self.temperature
        try:
            ok = isinstance(t, numbers.Real) and not isinstance(t, (bool, np.bool_)) and math.isfinite(t) and t >= 0
        except OverflowError:  # an int beyond the float range
            ok = False
        if not ok:
            raise ToolkitError(f"temperature must be a finite number >= 0, got {t!r}")
        if t < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)  # frozen: the one normalisation, made here
        if self.seed is not None and not (integer(self.seed) and 0 <= self.seed < 2 ** 64):
            raise ToolkitError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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
    status: Status = Status.WAITING
    finish_reason: str | None = None
    detokenizer: object = None
    seed: int = 0
    rng: object = None
    stats: StatsAccumulator = field(default_factory=StatsAccumulator)
    arrival_index: int = field(default_factory=lambda: next(_ids))  # admission order (preempt newest)

    def __post_init__(self):
        self.token_ids = list(self.prompt_ids)
        if not self.request_id:
            self.request_id = str(self.arrival_index)
        self.seed = self.params.seed if self.params.seed is not None else \
            int(np.random.SeedSequence().entropy % 2 ** 64)
        self.rng = np.random.default_rng(self.seed)
        self.stats.prompt_tokens = len(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_unfed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
