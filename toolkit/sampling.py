"""Choose the next token from the logits of one engine step.

Greedy rows (T = 0) take an exact argmax (lowest index on ties), computed where the logits
live by the runner; only the chosen ids cross to the host. Rows with T > 0 use plain
temperature sampling from softmax(logits / T), each with the request's own seeded generator,
which draws exactly one number per token: the same seed gives the same text whatever else is
in the batch. (The full sampler, with top-k/top-p/min-p, penalties and the FP32-copy fast
path, is its own module to come; this is the minimal one the engine needs.)
"""
import numpy as np


def sample_temperature(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """One token from softmax(logits / temperature) (fp32 logits [V] on the host)."""
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())  # subtract the max: exp never overflows
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))
