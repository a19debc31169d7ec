"""What every subcommand shares: model/device flags and one-line error handling."""
import argparse
import sys
import traceback
from pathlib import Path

from ..errors import ToolkitError
from ..options import EngineOptions

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
                        help="longest sequence (prompt + reply) in tokens (default: min(model maximum, 4096))")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def add_engine_args(parser: argparse.ArgumentParser):
    """Batching, KV-cache and fast-path switches shared by generate, chat and bench."""
    g = parser.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="requests running at once (default: 256 on the GPU, 16 on the CPU)")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="tokens fed per step; longer prompts are prefilled in chunks (default: 8192 GPU, 2048 CPU)")
    g.add_argument("--kv-cache-tokens", type=positive_int, default=None,
                   help="KV-cache size in tokens (default: half the free GPU memory; 16384 on the CPU)")
    # One --no-<switch> flag per EngineOptions field: a switch added there appears here by itself.
    for name in EngineOptions.names():
        g.add_argument(f"--no-{name.replace('_', '-')}", dest=f"no_{name}", action="store_true",
                       help=f"turn off: {EngineOptions.help(name)}")


def engine_kwargs(args) -> dict:
    """build_engine() keyword arguments from the parsed model + engine flags."""
    return dict(device=args.device, dtype=args.dtype, max_context=args.max_context,
                kv_cache_tokens=args.kv_cache_tokens, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                options=EngineOptions(**{n: not getattr(args, f"no_{n}") for n in EngineOptions.names()}))


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
