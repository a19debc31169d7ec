"""Run an engine the way tests/fixtures/*/reference.npz was made by transformers.

Prefill the 32 prompt tokens (logits at every position), then feed the
reference's greedy tokens one by one through the KV cache (decode logits).
"""
import numpy as np

from toolkit.engine import Engine

FIXTURE_NAMES = ("llama", "llama3", "mistral", "qwen2", "qwen3")


def reference_logits(engine: Engine, ref) -> tuple[np.ndarray, np.ndarray]:
    ids = ref["input_ids"].astype(np.int32)
    timer = engine.backend.timer()
    be, model = engine.backend, engine.model
    prompt = be.to_host(model.forward(ids, 0, timer, all_logits=True))
    decode = []
    for i, tok in enumerate(ref["generated_ids"][:-1]):
        logits = model.forward(np.array([tok], np.int32), len(ids) + i, timer)
        decode.append(be.to_host(logits)[0])
    return prompt, np.stack(decode)


def greedy_tokens(engine: Engine, ids, n: int) -> list[int]:
    return [r.token for r in engine.generate(ids, max_tokens=n, ignore_eos=True)]

