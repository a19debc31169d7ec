"""Perplexity of a model on a token stream, the way weights/train.py measures it.

The stream is cut into non-overlapping windows of `window` tokens; positions
restart at 0 in each window and its first token is context only. The mean
negative log-likelihood over every predicted token gives ppl = exp(mean NLL).
"""
import numpy as np


def window_nll_sums(engine, tokens: np.ndarray, window: int = 1024) -> list[float]:
    """Sum of -log p(next token) over each window (float64 log-softmax of the fp32 logits)."""
    sums = []
    for lo in range(0, len(tokens) - 1, window):
        ids = np.asarray(tokens[lo:lo + window], dtype=np.int32)
        if len(ids) < 2:
            break
        logits = engine.logits(ids[:-1]).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        sums.append(float(-logp[np.arange(len(ids) - 1), ids[1:]].sum()))
    return sums


def perplexity(engine, tokens: np.ndarray, window: int = 1024) -> tuple[float, float]:
    """(mean NLL, perplexity) over every predicted token of `tokens`."""
    sums = window_nll_sums(engine, tokens, window)
    n_windows = len(sums)
    predicted = sum(min(window, len(tokens) - lo) - 1 for lo in range(0, window * n_windows, window))
    nll = sum(sums) / predicted
    return nll, float(np.exp(nll))
