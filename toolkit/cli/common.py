"""What every subcommand shares: model/device flags and one-line error handling."""
import argparse
import sys
import traceback
from pathlib import Path

from ..errors import ToolkitError

# The embedded default model (weights/README.md says how it was made).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "weights" / "tiny-pd"


def default_model() -> str | None:
    return str(DEFAULT_MODEL_DIR) if (DEFAULT_MODEL_DIR / "config.json").is_file() else None


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def non_negative_float(text: str) -> float:
    v = float(text)
    if not v >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def add_model_args(parser: argparse.ArgumentParser, model_required: bool = True):
    default = default_model()
    parser.add_argument("--model", default=default, required=model_required and default is None,
                        help="Hugging Face model folder" + (f" (default: {default})" if default else ""))
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="backend; auto picks CUDA when a GPU is usable (default: auto)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="CUDA compute dtype (default: the checkpoint's; the CPU always uses float32)")
    parser.add_argument("--max-context", type=positive_int, default=None,
                        help="KV-cache size in tokens (default: min(model maximum, 4096))")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def run(main, argv, debug: bool) -> int:
    """Call main(); a ToolkitError becomes `error: ...` on stderr and exit code 2."""
    try:
        return main(argv) or 0
    except ToolkitError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
