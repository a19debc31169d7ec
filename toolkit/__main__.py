"""`python -m toolkit <command>`: each command is a module with setup_arg_parser() and main()."""
import importlib
import sys

COMMANDS = {
    "generate": "toolkit.cli.generate",  # batch generation from prompts or JSONL
    "chat": "toolkit.cli.chat",  # a plain terminal chat, one line per turn
    "bench": "toolkit.cli.bench",  # speed on random weights of a named shape
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m toolkit {{{','.join(COMMANDS)}}} [options]   (-h after a command for help)",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
