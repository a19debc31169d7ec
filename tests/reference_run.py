"""Run an engine the way tests/fixtures/*/reference.npz was made by transformers.

Prefill the 32 prompt tokens (logits at every position), then feed the
reference's greedy tokens one by one through the paged KV cache (decode logits).
"""
import numpy as np

from toolkit.engine import SamplingParams

FIXTURE_NAMES = ("llama", "llama3", "mistral", "qwen2", "qwen3")


def reference_logits(engine, ref) -> tuple[np.ndarray, np.ndarray]:
    return engine.score(ref["input_ids"], ref["generated_ids"][:-1])


def greedy_tokens(engine, ids, n: int) -> list[int]:
    return [o.token for o in engine.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True))]
