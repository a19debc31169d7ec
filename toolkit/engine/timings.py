"""Where the time of each step goes, as immutable values that travel beside the tokens.

`StepTiming` is one engine step (a prefill, a decode, or a mix of both for
several requests). Two clocks:
  * `gpu_ms`: the device time of the whole step, from two CUDA events around
    everything launched for it (its graph replay or its eager kernels, and the
    sampler). The events are read after the step's one synchronisation (the
    sampled ids coming back), so timing adds no synchronisation of its own.
    On the CPU the work is synchronous and this is the model+sampler wall time.
  * `wall_ms`: host time from scheduling to the outputs, detokenization included.
The per-section split (embedding, attention, mlp, lm_head, sampling) needs an
event pair per layer and section, so only eager steps have it; a graph replay
is one launch, and its `sections_ms` is empty (`graph=True` says why).

`RequestStats` is a snapshot of one request's running totals, made fresh for
each output, so an earlier output's numbers never change under its reader.
"""
import operator
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

# Model sections, the sparse-prefill split of prefill attention, then the sampler's phases.
SECTIONS = ("embedding", "attention", "indexer", "topk", "combine", "sparse_attention", "mlp", "lm_head",
            "gate", "fp32", "processing", "sample", "logprobs")
_EMPTY = MappingProxyType({})


@dataclass(frozen=True)
class StepTiming:
    index: int  # step number since the engine started
    kind: str  # "prefill", "decode" or "mixed"
    n_tokens: int  # tokens run through the model (all requests)
    n_seqs: int  # requests in the step
    wall_ms: float = 0.0
    gpu_ms: float = 0.0
    sections_ms: MappingProxyType = field(default_factory=lambda: _EMPTY)  # SECTIONS -> ms, eager steps only
    graph: bool = False  # replayed from a captured CUDA graph
    options: object = None  # the EngineOptions in force (as run: see EngineOptions.effective)
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache by requests admitted in this step
    detokenize_ms: float = 0.0
    sampler_path: str = ""  # "fast": sampled from the model's logits as they are; "slow": from an FP32 copy
    sampler_why: str = ""  # why the slow path ran: "switched off", or the first request beyond the fast path's limits
    sampler_bytes: int = 0  # FP32 logits bytes the sampler materialised this step (0 on the fast path)
    # Prefill attention of the step (toolkit/model/sparse.py): "dense", "sparse-exact" (every query saw every complete
    # block: the result is dense attention), "sparse-approx" (some query kept only its top-k), "sparse-skipped"
    # (some query had more blocks than it keeps, but the selection kept so many keys that the dense kernel ran:
    # exact; EngineOptions.sparse_max_keep_pct), "" (pure decode).
    prefill_path: str = ""
    plan: object = None  # the StepPlan: the kernel that ran each op (toolkit/model/plan.py)
    context_bucket: int = 0  # the context length decode attention's plan (and graph) was sized for
    # Queued on the device before the step before it had its tokens back (LLMEngine._launch_next): its scheduling
    # and staging ran while the device worked, and wall_ms counts from the step before's tokens.
    queued: bool = False

    @property
    def other_ms(self) -> float:
        """Host time outside the device work and detokenization that the device waited for: scheduling, staging,
        Python (a queued step's host work ran while the device worked, and mostly does not count here)."""
        return max(0.0, self.wall_ms - self.gpu_ms - self.detokenize_ms)


class RequestStats(NamedTuple):
    """One request's totals at the moment of one output. A NamedTuple, not a frozen dataclass: one is made for
    every output (~150,000 in a `bench throughput` run), and a frozen dataclass's __init__ took ~2.4 µs of host
    time where a tuple takes ~0.4 (dev/host_overhead.py)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (not prefilled)
    generated_tokens: int = 0
    ttft_ms: float = 0.0  # arrival -> first token
    prefill_ms: float = 0.0  # wall time of the steps that prefilled this request
    prefill_gpu_ms: float = 0.0  # device time of those steps (each step's whole, as prefill_ms)
    decode_ms_total: float = 0.0  # wall time of the decode steps that produced its tokens
    decode_steps: int = 0
    preemptions: int = 0
    prefill_path: str = ""  # dense / sparse-exact / sparse-skipped / sparse-approx (the least exact of its steps)
    sampler_path: str = ""  # fast / slow over the steps that sampled its tokens; mixed: some of each
    sampler_fp32_bytes: int = 0  # FP32 logits bytes those steps materialised for its row (0 on the fast path)

    @property
    def prefill_tps(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / (self.prefill_ms / 1e3) if self.prefill_ms > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / (self.decode_ms_total / 1e3) if self.decode_ms_total > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        return self.decode_ms_total / self.decode_steps if self.decode_steps else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "generated_tokens": self.generated_tokens, "ttft_ms": round(self.ttft_ms, 3),
                "prefill_ms": round(self.prefill_ms, 3), "prefill_gpu_ms": round(self.prefill_gpu_ms, 3),
                "prefill_tok_per_s": round(self.prefill_tps, 2),
                "decode_ms_per_step": round(self.ms_per_step, 3), "decode_tok_per_s": round(self.decode_tps, 2),
                "preemptions": self.preemptions, "prefill_path": self.prefill_path, "sampler_path": self.sampler_path,
                "sampler_fp32_bytes": self.sampler_fp32_bytes}


def in_order(laps) -> dict:
    """(section, ms) laps -> {section: total ms} for the sections this step lapped, in SECTIONS order (a decode
    step has no indexer, a greedy fast-path step no processing: they are left out, not reported as 0)."""
    total = {}
    for section, ms in laps:
        total[section] = total.get(section, 0.0) + ms
    return {k: total[k] for k in SECTIONS if k in total}


class NullTimer:
    """Stands in for a timer where no per-section laps are wanted (graph capture, quiet steps)."""

    def start(self):
        pass

    def lap(self, section: str):
        pass


# RequestStats' fields in order, read in one call (a snapshot is made for every output; see RequestStats).
_stats_now = operator.attrgetter(*RequestStats._fields)


class StatsAccumulator:
    """The mutable side of RequestStats, owned by the request's Sequence: its fields, plus the arrival time."""

    def __init__(self):
        vars(self).update(RequestStats()._asdict())
        self.arrival = time.perf_counter()

    def add_sampler_step(self, path: str, fp32_bytes: int):
        """A step sampled this request's next token on `path` ("fast" / "slow"), materialising fp32_bytes for it."""
        self.sampler_path = path if self.sampler_path in ("", path) else "mixed"
        self.sampler_fp32_bytes += fp32_bytes

    def snapshot(self) -> RequestStats:
        return RequestStats._make(_stats_now(self))
