"""`python -m toolkit chat`: talk to a model in the terminal.

In a terminal this starts the terminal UI (tui/: the chat beside live per-step timings and switch
toggles). `--plain`, or a stdin or stdout that is not a terminal, gives the line-based chat below:
one line per turn; Ctrl-C stops the current reply, not the session; in a terminal the input line has
history and editing (readline).

Each turn renders the whole conversation with the model's chat template; the
engine's prefix cache already holds the earlier turns' KV blocks, so only the
new turn is prefilled (the summary line says how many tokens were reused).
When the history no longer fits, the oldest turns are dropped. `/reset` starts over, `/quit`
(or end of input) leaves. Reads stdin, so it also works piped.

Each input line is read in binary and checked like a `generate` prompt (toolkit/cli/requests.py): a
line that is not UTF-8, or longer than 64 bytes per context token, is one `error:` line and the
chat goes on.
"""
import argparse
import dataclasses
import signal
import sys

from toolkit.engine.build import build_engine
from ..engine import SamplingParams
from ..errors import ToolkitError
from toolkit.cli.requests import Limits, RequestError, check_size, check_text, read_lines
from .common import (add_engine_args, add_model_args, check_max_tokens, engine_kwargs, non_negative_float,
                     non_negative_int, run, say, seed_int)
from .records import Sink

DEFAULT_TEMPERATURE = 0.7
DEFAULT_MAX_TOKENS = 512


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit chat", description="Chat with a model in the terminal.")
    add_model_args(p)
    p.add_argument("--plain", action="store_true",
                   help="the line-based chat instead of the terminal UI (automatic when stdin or stdout "
                        "is not a terminal)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--max-tokens", type=non_negative_int, default=None,
                   help=f"reply length limit, at most the context (default: {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=non_negative_float, default=None,
                   help=f"0 is greedy, and so is anything below 1e-5 (default: the model's "
                        f"generation_config.json, else {DEFAULT_TEMPERATURE})")
    p.add_argument("--seed", type=seed_int, default=None, help="sampling seed in [0, 2^64) (default: random)")
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


class _TextAsBytes:
    """A text stream (tests pass io.StringIO) read like stdin.buffer: surrogates stay detectable."""

    def __init__(self, text):
        self.text = text

    def readline(self, n: int = -1) -> bytes:
        return self.text.readline(n).encode("utf-8", "surrogatepass")


def _checked(text: str, limits: Limits) -> str:
    check_size(check_text(text, "the message"), limits, "the message")
    return text


def _typed_lines(limits: Limits):
    """Lines typed at a terminal, through readline (history, editing). Ctrl-C here only clears the line."""
    try:
        import readline  # noqa: F401  (input() uses it once imported)
    except ImportError:  # not on every platform
        pass
    while True:
        try:
            text = input("> ")
        except EOFError:
            return
        except KeyboardInterrupt as e:
            if getattr(e, "signum", signal.SIGINT) != signal.SIGINT:
                raise
            say("(Ctrl-D or /quit leaves)")
            continue
        try:
            yield _checked(text, limits).strip()
        except RequestError as e:
            say(f"error: {e}")


def _lines(stdin, stdout, limits: Limits):
    """User lines as text; an unusable one is reported here and skipped."""
    if stdin is sys.stdin and _is_terminal(stdin) and _is_terminal(sys.stdout):
        yield from _typed_lines(limits)
        return
    source = stdin.buffer if hasattr(stdin, "buffer") else _TextAsBytes(stdin)
    lines = read_lines(source, limits.prompt_bytes)
    while True:
        if stdin.isatty():
            stdout.write("> ")
        item = next(lines, None)
        if item is None:
            return
        lineno, raw = item
        try:
            if raw is None:
                raise RequestError(f"the message is longer than {limits.prompt_bytes:,} bytes (64 bytes per "
                                   f"context token of {limits.max_context})")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1})") from None
            _checked(text, limits)
        except RequestError as e:
            say(f"error: line {lineno}: {e}")
            continue
        yield text.strip()


def _reply(engine, ids, params, out, reply: list):
    """Stream one reply; Ctrl-C (SIGINT) stops it at the next step and the chat goes on."""
    rid = engine.add_request(ids, params)
    stats = None
    try:
        while engine.has_unfinished():
            for r in engine.step():
                if r.request_id != rid:
                    continue
                if r.error:
                    raise ToolkitError(r.error)
                reply.append(r.text)
                out.write(r.text)
                stats = r.stats
    except KeyboardInterrupt as e:
        if getattr(e, "signum", signal.SIGINT) != signal.SIGINT:
            raise  # SIGTERM ends the session
        engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
        out.write(" [stopped]")
    return stats


def _chat(args, stdin, stdout) -> int:
    if stdin is None or stdout is None:
        raise ToolkitError(f"std{'in' if stdin is None else 'out'} is closed")
    out = Sink(stdout, "stdout")
    engine = build_engine(args.model, **engine_kwargs(args))
    if engine.chat_template is None:
        raise ToolkitError(f"{args.model}: this model has no chat template")
    check_max_tokens(args.max_tokens, engine.max_context, engine.cfg)
    limits = Limits(engine.max_context)
    if args.system:
        try:
            check_size(check_text(args.system, "--system"), limits, "--system")
        except RequestError as e:
            raise ToolkitError(str(e)) from None
    # generation_config.json's sampling defaults (the terminal UI takes them too), then the flags.
    base = SamplingParams(**{"max_tokens": DEFAULT_MAX_TOKENS, "temperature": DEFAULT_TEMPERATURE,
                             **getattr(engine, "generation_defaults", {})})
    given = {k: getattr(args, k) for k in ("max_tokens", "temperature") if getattr(args, k) is not None}
    base = dataclasses.replace(base, **given)
    say(f"{engine.device_note}\n/reset starts over, /quit leaves.")
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    seed = args.seed
    for line in _lines(stdin, out, limits):
        if not line:
            continue
        if line == "/quit":
            return 0
        if line == "/reset":
            messages = list(system)
            say("(new conversation)")
            continue
        messages.append({"role": "user", "content": line})
        reply, stats = [], None
        try:
            ids = _fit(engine, messages, reserve=min(base.max_tokens, engine.max_context // 2))
            params = dataclasses.replace(base, seed=seed)
            stats = _reply(engine, ids, params, out, reply)
        except ToolkitError as e:  # e.g. one message longer than the context: say so, keep chatting
            messages.pop()
            say(f"error: {e}")
            continue
        seed = None if seed is None else (seed + 1) % 2 ** 64  # a fresh but reproducible draw each turn
        out.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply).strip()})
        if stats is not None:
            say(f"[{stats.prompt_tokens} prompt tok ({stats.cached_tokens} reused), {stats.prefill_tps:.0f} tok/s | "
                f"{stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s]")
    return 0


def _is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, AttributeError):  # a closed or odd stream
        return False


def _tui(args) -> int:
    """The terminal UI; the model loads inside it, so a load failure is an error screen, not a traceback."""
    from tui.app import ChatApp
    from tui.session import ChatSession, default_params

    def load():
        check_max_tokens(args.max_tokens, args.max_context or 2 ** 31)
        session = ChatSession.open(args.model, system=args.system or "", **engine_kwargs(args))
        check_max_tokens(args.max_tokens, session.engine.max_context, session.engine.cfg)
        changes = {n: getattr(args, n) for n in ("max_tokens", "temperature", "seed") if getattr(args, n) is not None}
        session.configure(params=dataclasses.replace(default_params(session.engine.model_dir), **changes))
        return session

    app = ChatApp(load)
    app.run()
    if app.load_error:  # also on the terminal once the screen is gone
        say(f"error: {app.load_error}")
    return app.return_code or 0


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if not args.plain and _is_terminal(sys.stdin) and _is_terminal(sys.stdout):
        return run(lambda _: _tui(args), argv, args.debug)
    return run(lambda _: _chat(args, sys.stdin, sys.stdout), argv, args.debug)
