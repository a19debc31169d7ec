"""`python -m tui [--model DIR] [--device ...]`: the same as `python -m toolkit chat` (the terminal UI)."""
import sys

from toolkit.cli.chat import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
