"""Rows and settings for the fast path's equality tests (CPU twin here, the GPU in test_gpu_fast_path.py): every
sampling setting, random and adversarial logits, histories that move tokens across the top-k boundary."""
import math

import numpy as np

from tests.sampler.probs import filtered_probs
from toolkit.engine.timings import NullTimer
from toolkit.sampler.params import SamplingParams
from toolkit.sampler.sampler import Sampler
from toolkit.sampler.state import RequestSampling

SETTINGS = [  # each a SamplingParams' keywords; seeds are added per row
    dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1),  # the default model's
    dict(temperature=0.7, top_k=50, top_p=0.9),
    dict(temperature=1.0, top_p=0.95),
    dict(temperature=1.0, top_p=0.95, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4),
    dict(temperature=0.6, top_k=5),
    dict(temperature=1.3, min_p=0.1),
    dict(temperature=0.9, min_p=0.05, top_k=20, top_p=0.5),
    dict(temperature=0.0, repetition_penalty=1.5, logit_bias={1: 3.0, 7: -2.0}),
    dict(temperature=1.0, logit_bias={0: 5.0, 3: -100.0, 9: 0.25}),
    dict(temperature=0.5, bad_words=((4,), (2, 6)), min_tokens=3, stop_token_ids=(8,)),
    dict(temperature=2.0, top_k=1),
    dict(temperature=1.0, top_p=0.01, presence_penalty=-2.0),
    dict(temperature=0.7, top_k=3, frequency_penalty=2.0, logprobs=3),
]


def logits_rows(rng, kind: str, B: int, V: int) -> np.ndarray:
    """float32 [B, V] rounded to bf16 (the GPU's logits), of one kind: llm-like, flat, integer (ties), all equal,
    a few huge, some -inf, one NaN row."""
    x = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    if kind == "llm":
        for b in range(B):
            x[b, rng.choice(V, min(V, 12), replace=False)] += rng.uniform(4, 12, min(V, 12)).astype(np.float32)
    elif kind == "ints":
        x = rng.integers(-4, 4, (B, V)).astype(np.float32)
    elif kind == "equal":
        x[:] = 1.5
    elif kind == "huge":
        x[:, rng.choice(V, 3, replace=False)] = np.float32(3e38)
        x[:, rng.choice(V, 2, replace=False)] = np.float32(1e30)
    elif kind == "neginf":
        x[:, rng.random(V) < 0.7] = -np.inf
    x = (x.view(np.uint32) + 0x8000 & 0xFFFF0000).view(np.float32)
    if kind == "nan":
        x[0, V // 2] = np.nan
    return x


def states_for(rng, B: int, V: int, near_top: np.ndarray = None) -> list:
    """One RequestSampling per row, a setting each (cycling), with a history drawn around the row's top tokens
    (so penalties move tokens across the top-k and top-p boundaries)."""
    out = []
    for b in range(B):
        kw = dict(SETTINGS[b % len(SETTINGS)])
        if "logit_bias" in kw:
            kw["logit_bias"] = {t % V: v for t, v in kw["logit_bias"].items()}
        p = SamplingParams(max_tokens=64, seed=int(rng.integers(0, 2 ** 63)), **kw)
        pool = near_top[b] if near_top is not None else np.arange(V)
        prompt = rng.choice(pool, int(rng.integers(1, min(len(pool), 12) + 1))).tolist()
        s = RequestSampling(p, prompt, V, p.seed, p.stop_token_ids, [w for w in p.bad_words])
        for t in rng.choice(pool, int(rng.integers(0, 8))).tolist():
            s.on_token(int(t))
        if p.bad_words and rng.random() < 0.5:
            s.on_token(2)  # the prefix of the bad word (2, 6): token 6 is banned next
        out.append(s)
    return out


def draw(be, logits, states, fast: bool, position: int = 5, max_context: int = 64) -> np.ndarray:
    """The sampler's tokens for one step, on the fast path or the FP32 path (asserting which one ran); logits on
    the backend's device, in its logits dtype."""
    B, V = logits.shape
    sampler = Sampler(be, V, B, max_context)
    sb = sampler.prepare(states, np.full(B, position, np.int32) + np.arange(B, dtype=np.int32), np.ones(B, bool),
                         B, fast)
    assert sb.fast == fast
    sampler.stage(sb)
    sampler.sample(logits, sb, NullTimer())
    return np.array(be.ids_to_host(sampler.sampled, B))


def top_tokens(x: np.ndarray, n: int = 60) -> np.ndarray:
    return np.argsort(-np.nan_to_num(x, nan=0.0), axis=1, kind="stable")[:, :n]


CHI2 = {  # the chi-squared tests' settings (CPU twin and GPU)
    "default model": dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1),
    "top_p alone": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=0.7, min_p=0.1),
    "penalties": dict(temperature=1.2, frequency_penalty=0.7, presence_penalty=0.5, top_k=30),
    "bias and bans": dict(temperature=0.9, logit_bias={3: 2.0, 11: -1.5}, bad_words=((5,),), top_p=0.9),
}


def chi2_case(row: np.ndarray, settings: dict) -> tuple:
    """(the exact distribution, the request's sampler state) of `row` under `settings`, seed 77, with one history
    (prompt [1, 2, 3, 9], output [4, 4, 10]): what the chi-squared tests draw from."""
    p = SamplingParams(seed=77, **settings)
    prompt, output = [1, 2, 3, 9], [4, 4, 10]
    state = RequestSampling(p, prompt, row.size, 77, (), p.bad_words)
    for t in output:
        state.on_token(t)
    return filtered_probs(row[None], [p], [(prompt, output)])[0], state


def assert_follows(counts: np.ndarray, want: np.ndarray):
    """Drawn token `counts` follow `want`: masked tokens are never drawn, and chi-squared stays below its p = 1e-4
    critical value with df degrees of freedom (Wilson-Hilferty)."""
    assert counts[want == 0].sum() == 0
    live = want > 0
    expected = want[live] * counts.sum()
    chi2 = ((counts[live] - expected) ** 2 / expected).sum()
    df = live.sum() - 1
    assert chi2 < df * (1 - 2 / (9 * df) + 3.719 * math.sqrt(2 / (9 * df))) ** 3
