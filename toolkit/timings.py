"""Where the time of each step goes, as plain data every front end reads.

One `StepTiming` per forward step (the prefill, then each decode step). The
device sections (embedding, attention, mlp, lm_head, sampling) are measured
on the device's own clock: CUDA events on the GPU, `perf_counter` on the CPU.
Detokenization is host work, timed with `perf_counter`. `other_ms` is the
wall time no section covers: Python overhead, launch latency, the final
device->host copy. Sections add up to `total_ms` by construction.
"""
import time
from dataclasses import dataclass, field

SECTIONS = ("embedding", "attention", "mlp", "lm_head", "sampling")


@dataclass
class StepTiming:
    kind: str  # "prefill" or "decode"
    n_tokens: int  # tokens processed in this step (prompt length for the prefill)
    total_ms: float = 0.0
    sections_ms: dict = field(default_factory=dict)  # SECTIONS -> ms
    detokenize_ms: float = 0.0

    @property
    def other_ms(self) -> float:
        return max(0.0, self.total_ms - sum(self.sections_ms.values()) - self.detokenize_ms)


class CpuTimer:
    """Laps on the host clock: NumPy/Numba work is synchronous, so wall time is device time."""

    def __init__(self):
        self._laps = []

    def start(self):
        self._laps.clear()
        self._t = time.perf_counter()

    def lap(self, section: str):
        now = time.perf_counter()
        self._laps.append((section, now - self._t))
        self._t = now

    def sections_ms(self) -> dict:
        out = dict.fromkeys(SECTIONS, 0.0)
        for section, dt in self._laps:
            out[section] += dt * 1e3
        return out


@dataclass
class RunStats:
    """Summary of one request: what the CLI prints and the JSONL `timings` holds."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: list = field(default_factory=list)  # per decode step

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / (self.prefill_ms / 1e3) if self.prefill_ms > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        total = sum(self.decode_ms)
        return len(self.decode_ms) / (total / 1e3) if total > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        return sum(self.decode_ms) / len(self.decode_ms) if self.decode_ms else 0.0

    def as_dict(self) -> dict:
        return {
            "prefill_ms": round(self.prefill_ms, 3),
            "prefill_tok_per_s": round(self.prefill_tps, 2),
            "decode_ms_per_step": [round(x, 3) for x in self.decode_ms],
            "decode_tok_per_s": round(self.decode_tps, 2),
        }
