"""Choose the next token from the logits.

T = 0 is an exact argmax (lowest index on ties), computed where the logits
live; the only data crossing to the host is the chosen id. T > 0 is plain
temperature sampling from softmax(logits / T) with a per-request seeded
generator, so the same seed reproduces the same text. (The full sampler:
top-k/top-p/min-p, penalties and the FP32-copy fast path, is its own module
to come; this is the minimal one the engine needs.)
"""
from typing import Callable

import numpy as np

Sampler = Callable[[object, object], int]  # (logits [1, V] on the backend, backend) -> token id


def make_sampler(temperature: float = 0.0, seed: int | None = None) -> Sampler:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return lambda logits, backend: backend.argmax(logits)
    rng = np.random.default_rng(seed)

    def sample(logits, backend) -> int:
        x = backend.to_host(logits[-1:])[0].astype(np.float64) / temperature
        p = np.exp(x - x.max())  # subtract the max: exp never overflows
        cdf = np.cumsum(p)
        return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))

    return sample
