"""The sampling flags of `generate`: one per SamplingParams field (toolkit/sampler/params.py).

Every flag defaults to None, so that a value nobody gave lets the model's generation_config.json show
through (precedence: generation_config.json < flags < JSONL fields, cli/records.py). Each value is checked
by SamplingParams itself as it is parsed, so a bad flag is an argparse error (exit 2) before the model loads,
with the same words as the error record a bad JSONL field gets.
"""
import argparse
import dataclasses

from ..errors import ToolkitError
from ..sampler.params import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams  # noqa: F401
from .common import check_max_tokens, non_negative_int

_ROOM = 2 ** 62  # max_tokens while one flag is checked alone (min_tokens is bounded by the real one later)


def param_type(name: str, parse):
    """An argparse type: parse the text, then let SamplingParams judge the value."""
    def convert(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if parse is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            SamplingParams(**{"max_tokens": _ROOM, "temperature": 1.0, name: v})
        except ToolkitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return v
    return convert


def _bias(text: str) -> tuple:
    tok, sep, bias = text.partition("=")
    try:
        pair = (int(tok), float(bias))
    except ValueError:
        pair = None
    if not sep or pair is None:
        raise argparse.ArgumentTypeError(f"expected TOKEN=BIAS (like 13=-5.0), got {text!r}")
    return param_type("logit_bias", lambda _: (pair,))(text)[0]


def _word(name: str):
    def convert(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"{name} must be a non-empty string")
        return text
    return convert


def add_sampling_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("sampling (defaults: the model's generation_config.json, else off; a JSONL "
                             "request's own fields override these)")
    g.add_argument("--max-tokens", type=non_negative_int, default=None,
                   help=f"tokens to generate per request, at most the context (default: {DEFAULT_MAX_TOKENS}, "
                        "or less when the context ends first)")
    for name, parse, text in (
            ("temperature", float, "0 is greedy, and so is anything below 1e-5"),
            ("top_k", int, "keep the k most likely tokens (0 or -1: off)"),
            ("top_p", float, "keep the smallest set of tokens whose probability reaches p, in (0, 1] (1: off)"),
            ("min_p", float, "drop tokens below min_p x the top token's probability, in [0, 1] (0: off)"),
            ("repetition_penalty", float, "> 0; divides positive logits of prompt and output tokens, multiplies "
                                          "negative ones (1: off)"),
            ("frequency_penalty", float, "in [-2, 2]; subtracted once per occurrence in the output (0: off)"),
            ("presence_penalty", float, "in [-2, 2]; subtracted once if the token occurs in the output (0: off)")):
        g.add_argument("--" + name.replace("_", "-"), type=param_type(name, parse), default=None, help=text)
    g.add_argument("--logit-bias", type=_bias, action="append", default=None, metavar="TOKEN=BIAS",
                   help="add BIAS (in [-100, 100]) to TOKEN's logit; repeatable")
    g.add_argument("--bad-words", type=_word("--bad-words"), action="append", default=None, metavar="WORD",
                   help="never generate WORD (as written and with a leading space); repeatable")
    g.add_argument("--stop", type=_word("--stop"), action="append", default=None, metavar="STR",
                   help="stop when STR appears in the output, and leave it out; repeatable")
    g.add_argument("--ignore-eos", action="store_true", default=None, help="do not stop at the end-of-text token")
    g.add_argument("--min-tokens", type=param_type("min_tokens", int), default=None,
                   help="do not stop (EOS, stop tokens) before this many tokens")
    g.add_argument("--seed", type=param_type("seed", int), default=None,
                   help="sampling seed in [0, 2^64) (default: random, and recorded in each JSONL record)")
    g.add_argument("--logprobs", type=param_type("logprobs", int), default=None, metavar="N",
                   help=f"record the sampled token's logprob and the top N (0 to {MAX_LOGPROBS}) in JSONL records")


def flag_params(args) -> dict:
    """The SamplingParams fields the command line sets (a flag not given, or a field with no flag, is left out)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(SamplingParams)
            if getattr(args, f.name, None) is not None}


def check_sampling_args(parser: argparse.ArgumentParser, args):
    """The flags together: repeated flags within their counts, each token biased once, min_tokens <= max_tokens."""
    # Without --max-tokens a JSONL request may still set its own, so only plain prompts are held to the default.
    room = _ROOM if getattr(args, "prompts_file", None) else DEFAULT_MAX_TOKENS
    try:
        SamplingParams(**{"max_tokens": room, "temperature": 1.0, **flag_params(args)})
    except ToolkitError as e:
        parser.error(str(e))


def check_against_model(args, engine):
    """What only the loaded model can judge. A flag applies to every request, so a bad value is a usage error
    (exit 2) before anything runs, not one error record per request (a JSONL field's own bad value is that)."""
    check_max_tokens(args.max_tokens, engine.max_context, engine.cfg)
    for tok, bias in args.logit_bias or ():
        if tok >= engine.cfg.vocab_size:  # (negative ids are refused as the flag is parsed)
            raise ToolkitError(f"--logit-bias {tok}={bias:g}: token {tok} is outside the vocabulary "
                               f"[0, {engine.cfg.vocab_size})")
