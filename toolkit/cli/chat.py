"""`python -m toolkit chat`: talk to a model in the terminal.

In a terminal this starts the terminal UI (tui/: the chat beside live per-step timings and switch
toggles). `--plain`, or a stdin or stdout that is not a terminal, gives the line-based chat below:
one line per turn; Ctrl-C stops the current reply, not the session; in a terminal the input line has
history and editing (readline).

Both run one conversation logic, tui/session.py's ChatSession (whole conversation re-rendered each turn,
the prefix cache reusing earlier turns, old turns dropped to fit). `/reset` starts over, `/quit` (or end of
input) leaves. Reads stdin, so it also works piped; the exit code is 1 when any line failed, else 0.

Each input line is read in binary and checked like a `generate` prompt (toolkit/cli/requests.py): a
line that is not UTF-8, or longer than 64 bytes per context token, is one `error:` line and the
chat goes on.
"""
import argparse
import contextlib
import os
import signal
import sys

from ..engine import SamplingParams
from ..errors import ToolkitError
from toolkit.model.hub import is_terminal, resolve_model
from toolkit.cli.requests import Limits, RequestError, check_size, check_text, read_lines
from .common import (EXIT_OK, EXIT_SOME_FAILED, Interrupted, add_engine_args, add_model_args, check_max_tokens,
                     engine_kwargs, non_negative_int, run, say, signals)
from .records import Sink
from .sampling_flags import param_type
from tui.session import DEFAULT_MAX_TOKENS, ChatSession

DEFAULT_TEMPERATURE = 0.7


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit chat", description="Chat with a model in the terminal.")
    add_model_args(p)
    p.add_argument("--plain", action="store_true",
                   help="the line-based chat instead of the terminal UI (automatic when stdin or stdout "
                        "is not a terminal)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--max-tokens", type=non_negative_int, default=None,
                   help=f"reply length limit, at most the context (default: {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=param_type("temperature", float), default=None,
                   help=f"0 is greedy, and so is anything below 1e-5 (default: the model's "
                        f"generation_config.json, else {DEFAULT_TEMPERATURE})")
    p.add_argument("--seed", type=param_type("seed", int), default=None,
                   help="sampling seed in [0, 2^64) (default: random)")
    add_engine_args(p)
    return p


def _checked(text: str, limits: Limits) -> str:
    check_size(check_text(text, "the message"), limits, "the message")
    return text


def _typed_lines(limits: Limits):
    """Lines typed at a terminal, through readline (history, editing). Ctrl-C here only clears the line."""
    with contextlib.suppress(ImportError):  # readline is not on every platform
        import readline  # noqa: F401  (input() uses it once imported)
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
            yield None


def _lines(stdin, stdout, limits: Limits):
    """User lines as text; an unusable one is reported here and comes as None."""
    if stdin is sys.stdin and is_terminal(stdin) and is_terminal(sys.stdout):
        yield from _typed_lines(limits)
        return
    lines = read_lines(stdin.buffer, limits.prompt_bytes)
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
            yield None
            continue
        yield text.strip()


def _stream(session, turn, out):
    """Write the reply as it comes. Ctrl-C (SIGINT) stops it at the next step and the chat goes on; SIGTERM
    ends the session. Signals wait for a safe point (signals.deferred), so no output is lost midway."""
    with signals.deferred():
        while turn.streaming:
            for o in session.stream(turn, cancelled=lambda: signals.pending is not None):
                turn.apply(o)
                out.write(o.text)
            try:
                signals.check()
            except Interrupted as e:
                if e.signum != signal.SIGINT:
                    raise
                session.cancel(turn)
    if turn.finish[0] == "abort":
        out.write(" [stopped]")


def converse(session, lines, out) -> int:
    """The line-based chat on a ChatSession: each line a turn, its reply on `out`, notes on stderr.
    `lines` gives None for a line already reported as unusable. Returns 1 when any line failed, else 0."""
    failed = False
    for line in lines:
        if line is None:
            failed = True
            continue
        if not line:
            continue
        if line == "/quit":
            break
        if line == "/reset":
            session.clear()
            say("(new conversation)")
            continue
        try:
            turn = session.start(line)
        except ToolkitError as e:  # the template rejected the conversation
            say(f"error: {e}")
            failed = True
            continue
        if turn.note:
            say(turn.note)
        _stream(session, turn, out)
        session.finish(turn)
        error = turn.errors[0]
        if turn.texts[0] or not error:
            out.write("\n")
        if error:  # e.g. one message longer than the context: say so, keep chatting
            say(f"error: {error}")
            failed = True
            continue
        st = turn.stats[0]
        say(f"[{st.prompt_tokens} prompt tok ({st.cached_tokens} reused), {st.prefill_tps:.0f} tok/s | "
            f"{st.generated_tokens} tok, {st.decode_tps:.1f} tok/s]")
    return EXIT_SOME_FAILED if failed else EXIT_OK


def _chat(args, stdin, stdout) -> int:
    if stdin is None or stdout is None:
        raise ToolkitError(f"std{'in' if stdin is None else 'out'} is closed")
    out = Sink(stdout, "stdout")
    session = _session(args)
    try:
        mode = "" if session.chat_mode else "\n(no chat template: each line continues the text)"
        say(f"{session.engine.device_note}{mode}\n/reset starts over, /quit leaves.")
        return converse(session, _lines(stdin, out, Limits(session.engine.max_context)), out)
    finally:
        session.close()


def _session(args):
    """The ChatSession both chats run: the model, the flags checked against its context, and the sampling
    parameters: generation_config.json's defaults (else temperature 0.7), then the flags."""
    check_max_tokens(args.max_tokens, args.max_context or 2 ** 31)  # before the model loads, where it can
    session = ChatSession.open(args.model, system=args.system or "",
                               special_in_content=args.allow_special_in_content, **engine_kwargs(args))
    try:
        check_max_tokens(args.max_tokens, session.engine.max_context, session.engine.cfg)
        if args.system:
            check_size(check_text(args.system, "--system"), Limits(session.engine.max_context), "--system")
    except (ToolkitError, RequestError) as e:
        session.close()
        raise ToolkitError(str(e)) from None
    given = {n: getattr(args, n) for n in ("max_tokens", "temperature", "seed") if getattr(args, n) is not None}
    session.configure(params=SamplingParams(**{"max_tokens": DEFAULT_MAX_TOKENS, "temperature": DEFAULT_TEMPERATURE,
                                               **getattr(session.engine, "generation_defaults", {}), **given}))
    return session


def _tui(args) -> int:
    """The terminal UI; the model loads inside it, so a load failure is an error screen, not a traceback."""
    from tui.app import ChatApp

    if args.model is not None and not os.path.lexists(args.model):  # a Hub id: fetch it while the terminal can
        resolve_model(args.model)                                    # still show the download's progress bars
    app = ChatApp(lambda: _session(args))
    app.run()
    if app.load_error:  # also on the terminal once the screen is gone
        say(f"error: {app.load_error}")
    return app.return_code or 0


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if not args.plain and is_terminal(sys.stdin) and is_terminal(sys.stdout):
        return run(_tui, args)
    return run(lambda a: _chat(a, sys.stdin, sys.stdout), args)
