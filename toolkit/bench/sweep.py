"""Comma-separated sweeps and their statistics: the vocabulary every bench table shares.

Every list flag (`--batch 1,8,32`, `--cuda-graphs on,off`) is parsed by an
argparse type, so a bad value is a usage error, never a traceback. The engine
switches are read from `EngineOptions` itself: a switch added there (the sampler
fast path, sparse prefill) becomes a sweepable `--flag` here with no edit.
Repeats are summarised as mean ± sample stddev, as llama-bench does.
"""
import argparse
import itertools
import statistics

import numpy as np

from toolkit.engine.options import EngineOptions

_ON, _OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")


def int_list(minimum: int):
    """An argparse type: `"1,8,32"` -> [1, 8, 32], every value >= minimum, duplicates dropped."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        if min(values) < minimum:
            raise argparse.ArgumentTypeError(f"values must be >= {minimum}, got {text!r}")
        return list(dict.fromkeys(values))
    return parse


def choice_list(choices):
    """An argparse type: `"a,b"` -> ["a", "b"], each one of `choices`, duplicates dropped."""
    def parse(text: str) -> list[str]:
        words = list(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
        if not words or any(w not in choices for w in words):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list from {', '.join(choices)}, "
                                             f"got {text!r}")
        return words
    return parse


def switch_list(text: str) -> list[bool]:
    """An argparse type: `"on,off"` -> [True, False]."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    bad = [w for w in words if w not in _ON + _OFF]
    if bad:
        raise argparse.ArgumentTypeError(f"expected on/off values, got {bad[0]!r}")
    if not words:
        raise argparse.ArgumentTypeError("empty list")
    return list(dict.fromkeys(w in _ON for w in words))


def add_switch_args(parser: argparse.ArgumentParser):
    defaults = EngineOptions()
    for name in EngineOptions.names():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=switch_list, default=None,
                            metavar="on,off", help=f"sweep this toggle (default: "
                                                   f"{'on' if getattr(defaults, name) else 'off'})")
    # generate's spelling, so one command line works for both: the same as --sampler-fast-path off
    parser.add_argument("--no-fast-path", dest="sampler_fast_path", action="store_const", const=[False],
                        help="the sampler's fast path off (= --sampler-fast-path off)")


def option_grid(args, backend) -> tuple[list[EngineOptions], list[str]]:
    """Every combination of the swept toggles, less those the backend runs identically.

    A toggle the backend cannot run (graphs on the CPU) reads as off in
    `effective()`; running both settings would time the same thing twice, so
    the duplicate is dropped and a note says which toggle did not apply.
    """
    defaults = EngineOptions()
    names = EngineOptions.names()
    values = [getattr(args, n) or [getattr(defaults, n)] for n in names]
    grid, seen, notes = [], set(), []
    for combo in itertools.product(*values):
        opts = EngineOptions(**dict(zip(names, combo)))
        eff = opts.effective(backend)
        for n in names:
            note = f"{n}=on runs as off on {backend.name} {backend.dtype}"
            swept = getattr(args, n) is not None  # a default the backend ignores needs no note
            if swept and getattr(opts, n) != getattr(eff, n) and note not in notes:
                notes.append(note)
        if eff not in seen:
            seen.add(eff)
            grid.append(opts)
    return grid, notes


def switches_label(opts: EngineOptions) -> str:
    return " ".join(f"{k}={'on' if v else 'off'}" for k, v in opts.as_dict().items())


def mean_std(values) -> tuple[float, float]:
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (NumPy's default); None for no values."""
    values = list(values)
    return float(np.percentile(values, q)) if values else None


def fmt(mean: float, std: float | None = None, digits: int = 2) -> str:
    """`12.35 ± 0.10`; `-` for a missing value."""
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")
