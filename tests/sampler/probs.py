"""The distribution the sampler draws from, for the tests: `filtered_probs(logits, params)`.

The engine's sampler lives in toolkit/sampler/ (the gate, the FP32 copy, the processing kernels and
Gumbel-max sampling). This module runs the very same processing ops on a [B, V] logits array, NumPy
(the CPU twins) or CuPy (the CUDA kernels), and turns the result into probabilities:

    logits -> FP32 copy -> logit bias -> penalties -> bans -> temperature -> min_p -> top-k -> top-p
           -> softmax (a greedy row: all the mass on its argmax, lowest index on ties)

Gumbel-max sampling draws exactly from these probabilities, so a χ² test of the sampler's tokens
against them checks the sampler end to end.
"""
import functools

import numpy as np

from toolkit.sampler.batch import SamplingStager
from toolkit.sampler.sampler import ALL_STAGES, process
from toolkit.sampler.state import RequestSampling


@functools.cache
def _backend(name: str, dtype: str | None):
    from toolkit.backends import make_backend
    return make_backend(name, dtype)


def _backend_for(logits):
    if isinstance(logits, np.ndarray):
        return _backend("cpu", None)
    return _backend("cuda", {"float32": "float32", "float16": "float16", "uint16": "bfloat16"}[str(logits.dtype)])


def filtered_probs(logits, params, histories=None) -> np.ndarray:
    """float64 [B, V] probabilities the sampler draws row b's next token from, after all processing.

    logits: [B, V] NumPy (CPU twins) or CuPy (CUDA kernels; bf16 as uint16 bits) array. params: one
    SamplingParams per row. histories: per row (prompt ids, output ids) for the penalties, bad words
    and min_tokens (default: none). Stop ids for min_tokens are the row's stop_token_ids."""
    be = _backend_for(logits)
    B, V = logits.shape
    histories = histories or [((), ())] * B
    states = []
    for p, (prompt, output) in zip(params, histories):
        words = [w for w in p.bad_words if not isinstance(w, str)]
        s = RequestSampling(p, list(prompt), V, 0, p.stop_token_ids, words)
        for t in output:
            s.on_token(int(t))
        states.append(s)
    longest = max([len(a) + len(b) for a, b in histories] + [1])
    stager = SamplingStager(be, B, longest)
    sb = stager.prepare(states, np.zeros(B, np.int32), np.ones(B, bool), B, fast_path_on=False)
    stager.stage(sb)
    x = be.empty((B, V), np.float32)
    be.to_fp32(logits, x)
    process(be, x, stager.device(B), ALL_STAGES)
    x = be.to_host(x).astype(np.float64)
    probs = np.zeros_like(x)
    for b, s in enumerate(states):
        row = x[b]
        if s.greedy or not np.isfinite(row).any():
            probs[b, int(np.argmax(row))] = 1.0
            continue
        e = np.exp(row - row.max())
        probs[b] = e / e.sum()
    return probs
