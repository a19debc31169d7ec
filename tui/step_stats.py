"""Aggregated step timings for the live panel, in plain Python (no Textual): every number the panel shows.

`StepStats` takes each engine step's `StepTiming` and keeps: current and mean ms per decode step and tok/s
(since the options or batch size last changed), the last prefill, the recent decode steps for the sparkline
with the positions where a toggle took effect, per-phase means over eager steps (phases are whatever
`StepTiming.sections_ms` holds, plus "host" and "detokenize"), and the A/B comparison.

The A/B comparison compares like with like. A step's time depends on its shape far more than on any toggle
(a decode step of 32 rows is not a decode step of one), so each toggle's "on" and "off" means come from steps
of one shape: the same kind, batch size and context bucket (`step_shape`), with every other toggle in the
same state (flipping two toggles at once leaves neither comparable). A toggle whose "off" forces another off
(PDL runs only in CUDA graphs) is compared with that one free (`implied_off`). Only the groups that have both
"on" and "off" steps become rows, each with its sample counts.

A step's time is its device time (`gpu_ms`), or its wall time where a step has no device time.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from toolkit.engine.options import EngineOptions

WINDOW = 64  # decode steps on the sparkline; steps in the phase means
HOST, DETOKENIZE = "host", "detokenize"
MIN_PROMPT_BUCKET = 16  # prefill steps are grouped by prompt tokens: 16, 32, 64, ...
KIND_ORDER = {"decode": 0, "mixed": 1, "prefill": 2}


def step_ms(step) -> float:
    """Device time of the step, or its wall time where it has none (0)."""
    return step.gpu_ms if step.gpu_ms > 0 else step.wall_ms


@dataclass(frozen=True, order=True)
class Shape:
    """What a step's time depends on besides the toggles: kind, batch size (requests in the step) and size.

    `size` is the decode attention's context bucket for a decode step (`StepTiming.context_bucket`, the bucket
    its plan and CUDA graph were made for) and the prompt tokens of the step rounded up to a power of two for
    a prefill or mixed step (prefix-cached tokens included, so that prefix caching on and off compare the same
    prompts)."""
    kind_order: int
    batch: int
    size: int
    kind: str

    @property
    def label(self) -> str:
        if self.kind == "decode":
            return f"dec b{self.batch} c{self.size or '?'}"
        return f"{'pre' if self.kind == 'prefill' else 'mix'} b{self.batch} t{self.size}"


def step_shape(step) -> Shape:
    if step.kind == "decode":
        size = step.context_bucket
    else:
        size = max(MIN_PROMPT_BUCKET, 1 << (step.n_tokens + step.cached_tokens - 1).bit_length())
    return Shape(KIND_ORDER.get(step.kind, 3), step.n_seqs, size, step.kind)


def implied_off(backend, names: tuple) -> dict:
    """{toggle: toggles that switching it off also switches off on this backend} (PDL needs CUDA graphs), from
    EngineOptions.effective, so the A/B comparison of the first leaves the others free."""
    on = EngineOptions().effective(backend)
    out = {}
    for n in names:
        off = EngineOptions().with_(**{n: False}).effective(backend)
        out[n] = frozenset(m for m in names if m != n and getattr(on, m) and not getattr(off, m))
    return out


@dataclass(slots=True)
class _Acc:
    """Running sum and count."""
    total: float = 0.0
    n: int = 0

    def add(self, v: float):
        self.total += v
        self.n += 1

    @property
    def mean(self):
        return self.total / self.n if self.n else None


@dataclass(frozen=True)
class ABRow:
    """One like-with-like comparison: `toggle` on and off over steps of one shape, the other toggles alike."""
    toggle: str
    shape: Shape
    others_off: tuple  # other toggles off on both sides, where another group of this shape had them on
    on_n: int
    on_ms: float
    off_n: int
    off_ms: float

    @property
    def key(self) -> str:
        return f"{self.toggle}|{self.shape.kind}|{self.shape.batch}|{self.shape.size}|{','.join(self.others_off)}"

    @property
    def ratio(self):
        """off / on: above 1 the toggle saves time."""
        return self.off_ms / self.on_ms if self.on_ms else None


class StepStats:
    """Aggregates of the steps seen so far: decode numbers from "decode" steps, prefill numbers from the others
    ("prefill", "mixed")."""

    def __init__(self, option_names=None, implied: dict | None = None):
        self.option_names = tuple(EngineOptions.names() if option_names is None else option_names)
        self.implied = dict(implied or {})
        self.steps = 0  # all steps added
        self.decode_steps = 0
        self.current_ms = self.current_tps = None  # the last decode step
        self.current_batch = 0
        self.prefill_ms = self.prefill_tps = None  # the last prefill (or mixed) step
        self.prefill_tokens = self.prefill_cached = 0
        self.sampler_bytes = None  # the last decode step's, where StepTiming reports it
        self.last_options = None  # the options the last step ran with (what ran, not what was asked)
        # The decode run: steps since the options or batch size last changed, so that mean_decode_ms and
        # decode_tps show the configuration now running (the A/B comparison keeps everything).
        self._run_key, self._run_ms, self._run_tokens, self._run_steps = None, 0.0, 0, 0
        self._recent = deque(maxlen=WINDOW)  # decode step ms
        self._marks = []  # (absolute decode step number, label)
        self._pending = []  # labels for the next decode step's mark
        self._phases = {"decode": deque(maxlen=WINDOW), "prefill": deque(maxlen=WINDOW)}
        self._phase_order = {}  # every phase seen, in first-seen order (a dict as an ordered set)
        # toggle -> (shape, the other toggles' states) -> {True: step ms, False: step ms}
        self._ab = {name: {} for name in self.option_names}

    # ---- input
    def add(self, step) -> None:
        self.steps += 1
        ms = step_ms(step)
        decode = step.kind == "decode"
        opts = step.options
        if opts is not None:
            if self.last_options is not None and opts != self.last_options:
                for name in self.option_names:
                    old, new = getattr(self.last_options, name, None), getattr(opts, name, None)
                    if old != new and new is not None:
                        self.mark(f"{name} {'on' if new else 'off'}")
            self.last_options = opts
            self._add_ab(step, opts, ms)
        if decode:
            self._add_decode(step, ms)
        else:
            self.prefill_ms = ms
            self.prefill_tokens, self.prefill_cached = step.n_tokens, step.cached_tokens
            self.prefill_tps = step.n_tokens / ms * 1e3 if ms > 0 else None
        if step.sections_ms and not step.graph:  # graph replays have no sections
            phases = {**step.sections_ms, HOST: step.other_ms, DETOKENIZE: step.detokenize_ms}
            self._phase_order.update(dict.fromkeys(phases))
            self._phases["decode" if decode else "prefill"].append(phases)

    def _add_ab(self, step, opts, ms: float) -> None:
        shape = step_shape(step)
        state = {n: bool(getattr(opts, n)) for n in self.option_names if getattr(opts, n, None) is not None}
        for name, value in state.items():
            free = self.implied.get(name, frozenset()) | {name}
            others = tuple((n, v) for n, v in state.items() if n not in free)
            self._ab[name].setdefault((shape, others), {True: _Acc(), False: _Acc()})[value].add(ms)

    def _add_decode(self, step, ms: float) -> None:
        self.decode_steps += 1
        self.current_ms = ms
        self.current_batch = step.n_seqs
        self.current_tps = step.n_tokens / ms * 1e3 if ms > 0 else None
        if step.sampler_path:  # the FP32 bytes the sampler materialised (a step without a sampler path does not say)
            self.sampler_bytes = step.sampler_bytes
        key = (step.options, step.n_seqs)
        if key != self._run_key:
            self._run_key, self._run_ms, self._run_tokens, self._run_steps = key, 0.0, 0, 0
        self._run_ms += ms
        self._run_tokens += step.n_tokens
        self._run_steps += 1
        self._recent.append(ms)
        if self._pending:
            self._marks.append((self.decode_steps - 1, ", ".join(self._pending)))
            self._pending = []

    def mark(self, label: str) -> None:
        """Mark the next decode step on the sparkline (a toggle takes effect at the next step)."""
        if label not in self._pending:
            self._pending.append(label)

    # ---- outputs
    @property
    def mean_decode_ms(self):
        return self._run_ms / self._run_steps if self._run_steps else None

    @property
    def decode_tps(self):
        return self._run_tokens / self._run_ms * 1e3 if self._run_ms > 0 else None

    @property
    def recent(self) -> list:
        """The last WINDOW decode step times (ms), oldest first."""
        return list(self._recent)

    @property
    def toggle_marks(self) -> list:
        """[(index into `recent`, label)] where a toggle took effect (marks older than `recent` are left out)."""
        first = self.decode_steps - len(self._recent)
        return [(i - first, label) for i, label in self._marks if i >= first]

    def phases(self) -> list:
        """Every phase name seen: sections in first-seen order, then host and detokenize."""
        tail = [HOST, DETOKENIZE]
        return [k for k in self._phase_order if k not in tail] + [k for k in tail if k in self._phase_order]

    def phase_means(self, kind: str = "decode") -> dict:
        """Mean ms of each phase over the last WINDOW eager steps of `kind` ("decode" or "prefill"), each over the
        steps that report it."""
        acc = {}
        for phases in self._phases[kind]:
            for k, v in phases.items():
                acc.setdefault(k, _Acc()).add(v)
        return {k: acc[k].mean for k in self.phases() if k in acc}

    def ab_rows(self) -> list:
        """The like-with-like comparisons that have steps both ways, in toggle order, then by shape. A row names
        the other toggles that were off in it only where they tell it from another group of the same shape."""
        rows = []
        for name in self.option_names:
            groups = sorted(self._ab[name].items())  # by (shape, others): keys never tie
            varies = {}  # shape -> the other toggles seen both ways among its groups
            for (shape, others), _ in groups:
                seen = varies.setdefault(shape, {})
                for n, v in others:
                    seen.setdefault(n, set()).add(v)
            for (shape, others), sides in groups:
                on, off = sides[True], sides[False]
                if on.n and off.n:
                    off_named = tuple(n for n, v in others if not v and len(varies[shape][n]) > 1)
                    rows.append(ABRow(name, shape, off_named, on.n, on.mean, off.n, off.mean))
        return rows

    def weights_gbps(self, weight_bytes: int):
        """GB/s of weights read: one full read of the weights per mean decode step."""
        m = self.mean_decode_ms
        return weight_bytes / (m / 1e3) / 1e9 if m and weight_bytes else None
