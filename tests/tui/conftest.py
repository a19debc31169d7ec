"""The terminal UI's tests need Textual (a core dependency, so CI has it). A machine without it (the GPU image,
which runs `pytest -m gpu tests/`) skips this folder instead of failing to import it."""
import importlib.util

if importlib.util.find_spec("textual") is None:
    collect_ignore_glob = ["test_*.py"]
