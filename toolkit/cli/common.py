"""What every subcommand shares: model/device flags, checked flag values, signals and exit codes.

Exit codes (README, "Exit codes and bad input"):
    0    every request succeeded
    1    some requests produced error records (the others ran)
    2    a usage or configuration error (one `error:` line; argparse's own errors exit 2 too)
    3    an internal error: a bug (one `internal error:` line; --debug shows the traceback)
    130  interrupted by SIGINT, 143 by SIGTERM (128 + the signal number, as a shell reports it)
    141  stdout was closed by its reader (`| head`): the run stops quietly, like any Unix filter
"""
import argparse
import contextlib
import functools
import math
import os
import signal
import sys
import threading
import traceback

from ..errors import ToolkitError
from toolkit.engine.build import BLOCK_SIZE, MIN_CONTEXT, default_model
from toolkit.engine.options import EngineOptions

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE, EXIT_INTERNAL, EXIT_BROKEN_PIPE = 0, 1, 2, 3, 141
MAX_SIZE = 2 ** 31 - 1  # sizes (tokens, sequences) beyond this are typos, and overflow int32 buffers


# -- flag values: every bad value is an argparse error (exit 2, usage line) ----------------------------------
def _int(text: str, lo: int, hi: int) -> int:
    try:
        v = int(text)
    except ValueError:  # also "1e3", "2.5" and 5,000-digit strings
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
    if v > hi:
        raise argparse.ArgumentTypeError(f"must be at most {hi}, got {text}")
    return v


positive_int = functools.partial(_int, lo=1, hi=MAX_SIZE)
non_negative_int = functools.partial(_int, lo=0, hi=MAX_SIZE)
# The minimums build_engine enforces, stated here too so the flag's own error gives the real bound.
context_int = functools.partial(_int, lo=MIN_CONTEXT, hi=MAX_SIZE)
kv_tokens_int = functools.partial(_int, lo=BLOCK_SIZE, hi=MAX_SIZE)


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:  # nan, inf and 1e400 (= inf) included
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def add_model_args(parser: argparse.ArgumentParser, model_required: bool = True):
    default = default_model()
    parser.add_argument("--model", default=default, required=model_required and default is None,
                        help="Hugging Face model folder, or Hub id ORG/NAME[@REVISION] (downloaded into the "
                             "Hugging Face cache; HF_HOME, HF_HUB_OFFLINE and HF_TOKEN apply)"
                             + (f" (default: {default})" if default else ""))
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="backend; auto picks CUDA when a GPU is usable (default: auto)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="CUDA compute dtype (default: the checkpoint's; the CPU always uses float32)")
    parser.add_argument("--max-context", type=context_int, default=None,
                        help="longest sequence (prompt + reply) in tokens (default: min(model maximum, 4096))")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


# Shorter spellings of some --no-<toggle> flags (the README uses these).
ALIASES = {"sampler_fast_path": ["--no-fast-path"]}


def add_engine_args(parser: argparse.ArgumentParser):
    """Batching, KV-cache and the toggles, shared by generate and chat; and how they read chat messages."""
    parser.add_argument("--allow-special-in-content", action="store_true",
                        help="read special-token strings (<|im_start|>) inside chat message content as those "
                             "tokens, not as text (by default only the chat template writes special tokens)")
    g = parser.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="requests running at once (default: 256 on the GPU, 16 on the CPU)")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="tokens fed per step; longer prompts are prefilled in chunks (default: 8192 GPU, 2048 CPU)")
    g.add_argument("--kv-cache-tokens", type=kv_tokens_int, default=None,
                   help="KV-cache size in tokens (default: half the free GPU memory; 16384 on the CPU)")
    # One flag per toggle, --no-<toggle> (every toggle is on by default): a toggle added to EngineOptions
    # appears here by itself.
    for name in EngineOptions.names():
        g.add_argument(f"--no-{name.replace('_', '-')}", *ALIASES.get(name, []), dest=name, action="store_false",
                       default=True, help=f"turn off: {_escaped_help(name)}")
    add_sparse_args(g)


def _escaped_help(name: str) -> str:
    """An option's help text for argparse, which formats help strings with % (sparse_max_keep_pct's says "%")."""
    return EngineOptions.help(name).replace("%", "%%")


def add_sparse_args(group):
    """--attention sparse|dense and the sparse prefill's parameters (generate, chat and bench)."""
    d = EngineOptions()
    group.add_argument("--attention", choices=("sparse", "dense"), default=None,
                       help="prefill attention: sparse (sliding window + top-k key blocks; exact while it covers "
                            "every block) or dense (default: sparse)")
    for name in EngineOptions.param_names():
        group.add_argument("--" + name.replace("_", "-"), type=positive_int, default=None,
                           help=f"{_escaped_help(name)} (default: {getattr(d, name)})")


def sparse_options(args, options: EngineOptions) -> EngineOptions:
    """`options` with --attention and the sparse parameters applied; bad combinations are a ToolkitError."""
    changes = {n: getattr(args, n) for n in EngineOptions.param_names() if getattr(args, n, None) is not None}
    if getattr(args, "attention", None) is not None:
        changes["sparse_prefill"] = args.attention == "sparse"
    options = options.with_(**changes)
    options.validate()
    return options


def engine_kwargs(args) -> dict:
    """build_engine() keyword arguments from the parsed model + engine flags."""
    return dict(device=args.device, dtype=args.dtype, max_context=args.max_context,
                kv_cache_tokens=args.kv_cache_tokens, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                options=sparse_options(args, EngineOptions(**{n: getattr(args, n) for n in EngineOptions.names()})))


def check_max_tokens(max_tokens: int | None, max_context: int, cfg=None):
    """An explicit --max-tokens must fit the context (the default is only a cap, clipped by it). With the
    model's config the message says whether --max-context can still be raised."""
    if max_tokens is not None and max_tokens > max_context:
        remedy = "lower --max-tokens"
        hint = cfg.context_hint(max_context, remedy) if cfg else f"raise --max-context or {remedy}"
        raise ToolkitError(f"--max-tokens {max_tokens} exceeds the context of {max_context} tokens ({hint})")


# -- signals ----------------------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM. A KeyboardInterrupt, so one `except KeyboardInterrupt` handles both."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGINT and SIGTERM raise Interrupted in the main thread (Python's default for SIGTERM is to die
    without a word, losing the records of a batch). Inside `deferred()` a first signal only sets
    `pending`, which `check()` raises at a safe point (between engine steps, never halfway through a
    record); a second one raises at once, for a user who really means it."""

    def __init__(self):
        self.pending, self._defer = None, False

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():  # only the main thread may
            yield self
            return
        old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.pending, self._defer = None, False

    def _handler(self, signum, frame):
        if self._defer and self.pending is None:
            self.pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self):
        self._defer = True
        try:
            yield
        finally:
            self._defer = False

    def check(self):
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)


signals = Signals()  # signal handlers are per process: one instance


# -- running a command ------------------------------------------------------------------------------------
class OutputError(ToolkitError):
    """Writing the results failed (a full disk, a vanished folder): one line, exit 2."""


def say(message: str):
    """A line on stderr that never raises (stderr itself may be a closed pipe)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(message, file=sys.stderr, flush=True)


def _silence_stdout():
    # The interpreter flushes stdout once more at exit; with the reader gone that prints "Exception
    # ignored ... BrokenPipeError". Point fd 1 at /dev/null so that last flush has somewhere to go.
    with contextlib.suppress(OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def run(command, args) -> int:
    """Call command(args); whatever it raises becomes one stderr line and an exit code (--debug: a traceback)."""
    try:
        with signals.installed():
            return command(args) or EXIT_OK
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM through Signals
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        say(f"interrupted ({signal.Signals(signum).name})")
        return 128 + signum
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        if isinstance(e, ToolkitError):
            say(f"error: {e}")
            return EXIT_USAGE
        if isinstance(e, MemoryError):  # sizes too large for this machine (CuPy's OutOfMemoryError is one too)
            detail = f": {e}" if str(e) else ""
            say(f"error: out of memory{detail} (lower --max-context, --kv-cache-tokens or --max-num-seqs)")
            return EXIT_USAGE
        # A bug: one line, the traceback only on request.
        detail = " ".join(str(e).split())  # one line, whatever the message
        say(f"internal error: {type(e).__name__}{': ' + detail if detail else ''} "
            "(rerun with --debug for the traceback)")
        return EXIT_INTERNAL
