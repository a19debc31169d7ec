"""toolkit: a small LLM inference engine written to be read (README.md).

    from toolkit import LLM, SamplingParams      # the Python API (toolkit/engine/llm.py), vLLM's shape
"""

__all__ = ["LLM", "SamplingParams"]


def _version() -> str:
    # The installed distribution's metadata is the one source (pyproject.toml's version); a plain
    # checkout that was never installed reads pyproject.toml itself.
    import contextlib
    from importlib import metadata
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version("toolkit")
    import re
    from pathlib import Path
    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
        m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def __getattr__(name: str):
    # Computed on first use: reading package metadata scans sys.path, and the API imports NumPy and the engine,
    # which every `import toolkit` (the CLI, the tests) would otherwise pay for.
    if name == "__version__":
        return _version()
    if name == "LLM":
        from toolkit.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from toolkit.sampler.params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__ + ["__version__"])
