"""`python -m toolkit chat`: talk to a model in the terminal, one line per turn.

Each turn renders the whole conversation with the model's chat template; the
engine's prefix cache already holds the earlier turns' KV blocks, so only the
new turn is prefilled (the summary line says how many tokens were reused).
When the history no longer fits, the oldest turns are dropped. `/reset` starts over, `/quit`
(or end of input) leaves. Reads stdin, so it also works piped.
"""
import argparse
import sys

from ..assembly import build_engine
from ..engine import SamplingParams
from ..errors import ToolkitError
from .common import add_engine_args, add_model_args, engine_kwargs, non_negative_float, non_negative_int, run

DEFAULT_TEMPERATURE = 0.7
DEFAULT_MAX_TOKENS = 512


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit chat", description="Chat with a model in the terminal.")
    add_model_args(p)
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--max-tokens", type=non_negative_int, default=DEFAULT_MAX_TOKENS,
                   help=f"reply length limit (default: {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=non_negative_float, default=DEFAULT_TEMPERATURE,
                   help=f"0 is greedy (default: {DEFAULT_TEMPERATURE})")
    p.add_argument("--seed", type=non_negative_int, default=None)
    add_engine_args(p)
    return p


def _fit(engine, messages: list, reserve: int) -> list[int]:
    """Prompt ids for `messages`, dropping the oldest turns until `reserve` tokens of reply fit."""
    while True:
        ids = engine.tokenizer.encode(engine.chat_template.render(messages), add_special_tokens=False)
        first = 1 if messages[0]["role"] == "system" else 0
        if len(ids) + reserve < engine.max_context or len(messages) - first <= 1:
            return ids
        del messages[first:first + 2]  # one user turn and its reply


def _chat(args, stdin, stdout) -> int:
    engine = build_engine(args.model, **engine_kwargs(args))
    if engine.chat_template is None:
        raise ToolkitError(f"{args.model}: this model has no chat template")
    print(f"{engine.device_note}\n/reset starts over, /quit leaves.", file=sys.stderr, flush=True)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    seed = args.seed
    while True:
        if stdin.isatty():
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            return 0
        line = line.strip()
        if not line:
            continue
        if line == "/reset":
            messages = list(system)
            print("(new conversation)", file=sys.stderr, flush=True)
            continue
        messages.append({"role": "user", "content": line})
        reply, stats = [], None
        try:
            ids = _fit(engine, messages, reserve=min(args.max_tokens, engine.max_context // 2))
            params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=seed)
            for r in engine.generate(ids, params):
                reply.append(r.text)
                stdout.write(r.text)
                stdout.flush()
                stats = r.stats
        except ToolkitError as e:  # e.g. one message longer than the context: say so, keep chatting
            messages.pop()
            print(f"error: {e}", file=sys.stderr, flush=True)
            continue
        seed = None if seed is None else seed + 1  # a fresh but reproducible draw each turn
        stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply).strip()})
        if stats is not None:
            print(f"[{stats.prompt_tokens} prompt tok ({stats.cached_tokens} reused), {stats.prefill_tps:.0f} tok/s | "
                  f"{stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s]", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    return run(lambda _: _chat(args, sys.stdin, sys.stdout), argv, args.debug)
