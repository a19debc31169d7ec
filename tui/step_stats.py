"""Aggregated step timings for the live panel, in plain Python (no Textual): every number the panel shows.

`StepStats` takes each engine step's `StepTiming` and keeps: current and mean ms per decode step and tok/s
(since the options or batch size last changed), the last prefill, the recent decode steps for the sparkline
with the positions where a switch was toggled, per-phase means over eager steps (phases are whatever
`StepTiming.sections_ms` holds, plus "host" and "detokenize"), and the A/B table: for every `EngineOptions`
switch, the steps seen with it on and with it off. Everything is generic, so switches and sections added by
later issues appear with no change here. A step's time is its device time (`gpu_ms`), or its wall time where
a step has no device time.
"""
from __future__ import annotations

from collections import deque

from toolkit.engine.options import EngineOptions

WINDOW = 64  # decode steps on the sparkline; steps in the phase means
HOST, DETOKENIZE = "host", "detokenize"


def step_ms(step) -> float:
    """Device time of the step, or its wall time where it has none (0)."""
    return step.gpu_ms if step.gpu_ms > 0 else step.wall_ms


def sampler_bytes(step):
    """FP32 bytes the sampler materialised, or None for a step that does not say (no sampler path recorded)."""
    return step.sampler_bytes if step.sampler_path else None


def is_eager(step) -> bool:
    return bool(step.sections_ms) and not step.graph


def _mean(total: float, n: int):
    return total / n if n else None


class _Acc:
    """Running sum and count."""
    __slots__ = ("total", "n")

    def __init__(self):
        self.total, self.n = 0.0, 0

    def add(self, v: float):
        self.total += v
        self.n += 1

    @property
    def mean(self):
        return _mean(self.total, self.n)


class _Side:
    """One state (on or off) of one switch in the A/B table."""
    __slots__ = ("steps", "step", "sampler", "prefill")

    def __init__(self):
        self.steps = 0
        self.step, self.sampler, self.prefill = _Acc(), _Acc(), _Acc()

    def as_dict(self) -> dict:
        return {"steps": self.steps, "step_ms": self.step.mean, "sampler_ms": self.sampler.mean,
                "prefill_ms": self.prefill.mean}


class StepStats:
    """Aggregates of the steps seen so far (pure Python).

    Decode numbers come from steps with kind "decode"; prefill numbers from the
    other steps ("prefill", "mixed"). `mean_decode_ms` and `decode_tps` are over
    the decode steps since the options or the batch size last changed, so they
    show the configuration now running; the A/B table keeps everything.
    """

    def __init__(self, option_names=None, window: int = WINDOW):
        self.option_names = tuple(EngineOptions.names() if option_names is None else option_names)
        self.window = window
        self.reset()

    def reset(self) -> None:
        self.steps = 0  # all steps added
        self.decode_steps = 0
        self.current_ms = self.current_tps = None  # the last decode step
        self.current_batch = 0
        self.prefill_ms = self.prefill_tps = None  # the last prefill (or mixed) step
        self.prefill_tokens = self.prefill_cached = 0
        self.sampler_bytes = None  # the last decode step's, where StepTiming reports it
        self._run_key = None
        self._run_ms = 0.0
        self._run_tokens = 0
        self._run_steps = 0
        self._recent = deque(maxlen=self.window)  # decode step ms
        self._marks = deque()  # (absolute decode step number, label)
        self._pending = []  # labels for the next decode step's mark
        self._last_options = None
        self._phases = {"decode": deque(maxlen=self.window), "prefill": deque(maxlen=self.window)}
        self._phase_order = []
        self._ab = {name: {True: _Side(), False: _Side()} for name in self.option_names}

    # ---- input
    def add(self, step) -> None:
        self.steps += 1
        ms = step_ms(step)
        decode = step.kind == "decode"
        opts = step.options
        if opts is not None and self._last_options is not None and opts != self._last_options:
            for name in self.option_names:
                old, new = getattr(self._last_options, name, None), getattr(opts, name, None)
                if old != new and new is not None:
                    self.mark(f"{name} {'on' if new else 'off'}")
        if opts is not None:
            self._last_options = opts
        if decode:
            self._add_decode(step, ms)
        else:
            self.prefill_ms = ms
            self.prefill_tokens, self.prefill_cached = step.n_tokens, step.cached_tokens
            self.prefill_tps = step.n_tokens / ms * 1e3 if ms > 0 else None
        if is_eager(step):
            phases = dict(step.sections_ms)
            phases[HOST] = step.other_ms
            phases[DETOKENIZE] = step.detokenize_ms
            for k in phases:
                if k not in self._phase_order:
                    self._phase_order.append(k)
            self._phases["decode" if decode else "prefill"].append(phases)
        if opts is not None:
            sampling = step.sampler_ms if decode else None
            for name, sides in self._ab.items():
                v = getattr(opts, name, None)
                if v is None:
                    continue
                side = sides[bool(v)]
                side.steps += 1
                if decode:
                    side.step.add(ms)
                    if sampling is not None:
                        side.sampler.add(sampling)
                else:
                    side.prefill.add(ms)

    def _add_decode(self, step, ms: float) -> None:
        self.decode_steps += 1
        self.current_ms = ms
        self.current_batch = step.n_seqs
        self.current_tps = step.n_tokens / ms * 1e3 if ms > 0 else None
        b = sampler_bytes(step)
        if b is not None:
            self.sampler_bytes = b
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
        first = self.decode_steps - len(self._recent)
        while self._marks and self._marks[0][0] < first:
            self._marks.popleft()

    def mark(self, label: str) -> None:
        """Mark the next decode step on the sparkline (a toggle takes effect at the next step)."""
        if label not in self._pending:
            self._pending.append(label)

    # ---- outputs
    @property
    def mean_decode_ms(self):
        return _mean(self._run_ms, self._run_steps)

    @property
    def decode_tps(self):
        return self._run_tokens / self._run_ms * 1e3 if self._run_ms > 0 else None

    @property
    def recent(self) -> list:
        """The last `window` decode step times (ms), oldest first."""
        return list(self._recent)

    @property
    def toggle_marks(self) -> list:
        """[(index into `recent`, label)] where a toggle took effect."""
        first = self.decode_steps - len(self._recent)
        return [(i - first, label) for i, label in self._marks if i >= first]

    def phases(self) -> list:
        """Every phase name seen: sections in first-seen order, then host and detokenize."""
        tail = [HOST, DETOKENIZE]
        return [k for k in self._phase_order if k not in tail] + [k for k in tail if k in self._phase_order]

    def phase_means(self, kind: str = "decode") -> dict:
        """Mean ms of each phase over the last `window` eager steps of `kind` ("decode" or "prefill").

        Graph replays have no sections and are left out. A phase is averaged
        over the steps that report it.
        """
        acc = {}
        for phases in self._phases[kind]:
            for k, v in phases.items():
                acc.setdefault(k, _Acc()).add(v)
        return {k: acc[k].mean for k in self.phases() if k in acc}

    def ab_table(self) -> dict:
        """{switch: {"on": {"steps", "step_ms", "sampler_ms", "prefill_ms"}, "off": {...}}}.

        steps counts every step run in that state; step_ms and sampler_ms are
        means over decode steps, prefill_ms over prefill steps; None where no
        step was seen.
        """
        return {name: {"on": sides[True].as_dict(), "off": sides[False].as_dict()}
                for name, sides in self._ab.items()}

    def weights_gbps(self, weight_bytes: int):
        """GB/s of weights read: one full read of the weights per mean decode step."""
        m = self.mean_decode_ms
        return weight_bytes / (m / 1e3) / 1e9 if m and weight_bytes else None
