"""How repetitive the default model's text is, greedy against sampled: distinct 2- and 3-grams.

    python experiments/repetition.py                       # greedy vs the model's generation_config.json
    python experiments/repetition.py --try temperature=0.8,top_p=0.95 --try temperature=1.0,top_k=40

20 fixed story openings, 200 tokens each (ignore_eos, so every completion has the same length), on the CPU.
For each setting it prints, as a markdown table:
    distinct-n   unique n-grams / all n-grams of a completion's token ids, averaged over the completions
                 (1.0: no n-gram repeats; a greedy loop of period p has about p / 200)
    ppl          the model's own perplexity of its completions (given the prompt): sampling raises it a
                 little; gibberish raises it a lot, so a setting that "wins" on distinct-n by producing
                 noise shows up here
Each request gets seed = its index, so a run is reproducible. The first completion of each setting goes
to stderr, to read.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.engine.build import build_engine  # noqa: E402
from toolkit.engine import SamplingParams  # noqa: E402

PROMPTS = [  # openings in the register of the model's corpus (Austen, Shakespeare, Milton, web prose)
    "Once upon a time", "It was a fine morning when", "Elizabeth walked into the garden and",
    "The king looked at his son and said", "Mr. Bennet was reading in the library when",
    "She had never before seen so", "The old man sat by the fire", "When the letter arrived,",
    "In the spring of that year", "He could not help thinking that", "The ship was lost at sea, and",
    "My dear sister,", "There was once a poor miller who", "The night was dark and",
    "Anne had not been long in the house before", "The soldiers marched into the town", "It is a truth",
    "The children ran down to the river", "Long ago, in a distant country,", "After dinner the ladies",
]
NEW_TOKENS = 200


def distinct_n(tokens, n: int) -> float:
    """Unique n-grams / all n-grams of one sequence (1.0 for one shorter than n: nothing repeats)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def generate_all(engine, prompts_ids, params_for) -> list[list[int]]:
    """Every prompt at once (one batch); params_for(i) -> SamplingParams."""
    out, index = [[] for _ in prompts_ids], {}
    for i, ids in enumerate(prompts_ids):
        index[engine.add_request(ids, params_for(i), detokenize=False)] = i
    while engine.has_unfinished():
        for o in engine.step():
            if o.error:
                raise RuntimeError(f"request {index[o.request_id]}: {o.error}")
            if o.token is not None:
                out[index[o.request_id]].append(o.token)
    return out


def completion_nll(engine, prompt, completion) -> float:
    """Mean -log p of the completion's tokens given the prompt and what came before (float64 softmax)."""
    ids = list(prompt) + list(completion)
    logits = engine.logits(ids[:-1]).astype(np.float64)[len(prompt) - 1:]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(completion)), completion].mean())


def measure(engine, prompts_ids, settings: dict, new_tokens: int) -> dict:
    base = {"max_tokens": new_tokens, "ignore_eos": True}
    outs = generate_all(engine, prompts_ids, lambda i: SamplingParams(**{**base, **settings, "seed": i}))
    nll = np.mean([completion_nll(engine, p, c) for p, c in zip(prompts_ids, outs)])
    return {"d2": np.mean([distinct_n(c, 2) for c in outs]), "d3": np.mean([distinct_n(c, 3) for c in outs]),
            "ppl": float(np.exp(nll)), "sample": engine.tokenizer.decode(outs[0]) if engine.tokenizer else ""}


def parse_setting(text: str) -> dict:
    """"temperature=0.8,top_p=0.95" -> {"temperature": 0.8, "top_p": 0.95} (checked by SamplingParams)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        out[key.strip()] = int(value) if key.strip() in ("top_k",) else float(value)
    SamplingParams(**out)
    return out


def label(settings: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in settings.items()) or "(none)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "weights" / "tiny-pd"))
    p.add_argument("--try", dest="tries", action="append", default=[], type=parse_setting, metavar="K=V,...",
                   help="another setting to measure (repeatable)")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    p.add_argument("--tokens", type=int, default=NEW_TOKENS, help="tokens per completion")
    args = p.parse_args(argv)
    engine = build_engine(args.model, device="cpu", max_num_seqs=len(PROMPTS))
    prompts_ids = [engine.tokenizer.encode(t) for t in PROMPTS[:args.prompts]]
    rows = [("greedy", {"temperature": 0.0}),
            ("generation_config.json: " + label(engine.generation_defaults), dict(engine.generation_defaults))]
    rows += [(label(s), s) for s in args.tries]
    print(f"{len(prompts_ids)} prompts x {args.tokens} tokens, CPU, {Path(args.model).name}\n")
    print("| setting | distinct-2 | distinct-3 | ppl | seconds |")
    print("|---|---|---|---|---|")
    for name, settings in rows:
        t0 = time.perf_counter()
        m = measure(engine, prompts_ids, settings, args.tokens)
        print(f"| {name} | {m['d2']:.3f} | {m['d3']:.3f} | {m['ppl']:.2f} | {time.perf_counter() - t0:.1f} |",
              flush=True)
        print(f"[{name}] {PROMPTS[0]}{m['sample']!r}\n", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
