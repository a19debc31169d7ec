"""`python -m toolkit <command>`: each command is a module with a main(argv)."""
import contextlib
import importlib
import os
import sys
import threading

COMMANDS = {  # name -> (module, the one line `--help` shows)
    "generate": ("toolkit.cli.generate", "generate text for prompts or a JSONL file of requests (batched)"),
    "chat": ("toolkit.cli.chat", "chat with a model: a terminal UI with live timings (--plain, or no terminal: "
                                 "one line per turn)"),
    "bench": ("toolkit.cli.bench", "measure prefill/decode speed (bench throughput: many requests; bench suite: "
                                   "the table of several shapes)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m toolkit [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "`python -m toolkit <command> --help` lists a command's options.",
              "Exit codes: 0 ok, 1 some requests failed, 2 usage or configuration error, 3 internal error,",
              "130/143 interrupted by SIGINT/SIGTERM, 141 output pipe closed (README: Exit codes and bad input)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] in (["-V"], ["--version"]):
        from . import __version__
        print(f"toolkit {__version__}")
        return 0
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)}; "
              "python -m toolkit --help says more)", file=sys.stderr)
        return 2
    try:
        return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
    except KeyboardInterrupt:  # during the imports (NumPy, Numba, CuPy), before a handler is installed
        print("interrupted (SIGINT)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    code = main()
    # A daemon thread still blocked in stdin (generate's reader, interrupted while its producer is silent) holds
    # stdin's lock, and the interpreter's shutdown aborts on it (exit 134): then flush and leave without it.
    if any(t.daemon and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)
