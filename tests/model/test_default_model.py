"""The embedded default model (weights/tiny-pd) on the CPU backend."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from toolkit.cli.common import default_model
from toolkit.engine.build import build_engine

WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
PROMPTS = ("Once upon a time", "The king said unto", "It is a truth universally acknowledged")


@pytest.fixture(scope="module")
def engine():
    if default_model() is None:
        pytest.skip("no default model in weights/")
    return build_engine(default_model(), device="cpu")


def test_greedy_is_deterministic(engine):
    ids = engine.tokenizer.encode(PROMPTS[0])
    runs = [[r.token for r in engine.generate(ids, max_tokens=48)] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) > 8


def test_generated_words_come_from_the_corpus(engine):
    vocab = set((WEIGHTS / "wordlist.txt").read_text().split())
    words = []
    for prompt in PROMPTS:
        text = "".join(r.text for r in engine.generate(engine.tokenizer.encode(prompt), max_tokens=64))
        words += re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower())
    known = sum(w in vocab for w in words) / len(words)
    print(f"{len(words)} words, {known:.1%} in the corpus word list")
    assert len(words) > 60 and known >= 0.9


def perplexity(engine, tokens: np.ndarray, window: int) -> tuple[float, float]:
    """(mean NLL, perplexity) over every predicted token, the way weights/train.py measures it: the stream cut into
    non-overlapping windows whose positions restart at 0, each window's first token context only; float64
    log-softmax of the fp32 logits."""
    nll, predicted = 0.0, 0
    for lo in range(0, len(tokens) - 1, window):
        ids = np.asarray(tokens[lo:lo + window], dtype=np.int32)
        if len(ids) < 2:
            break
        logits = engine.logits(ids[:-1]).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
        predicted += len(ids) - 1
    return nll / predicted, float(np.exp(nll / predicted))


def test_perplexity_matches_training(engine):
    """The toolkit's own validation perplexity vs PyTorch's figure from training (within 1%)."""
    training = json.loads((Path(default_model()) / "training.json").read_text())
    tokens = np.fromfile(WEIGHTS / "val.bin", dtype=np.uint16)
    assert len(tokens) == training["val_tokens"]
    nll, ppl = perplexity(engine, tokens, window=training["config"]["max_position_embeddings"])
    print(f"toolkit CPU perplexity {ppl:.4f}, PyTorch (training) {training['val_ppl']:.4f}")
    assert abs(ppl / training["val_ppl"] - 1) < 0.01
