"""Shared pytest setup: the `gpu` marker skips cleanly where no CUDA GPU is usable."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# Real trained tiny model beside the project (not part of it): tests skip where absent.
STORIES = ROOT.parent / "shared" / "models" / "stories260K"

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# The terminal UI's tests need Textual (a core dependency, so CI has it). A machine without it (the GPU image, which
# runs `pytest -m gpu tests/`) skips that folder instead of failing to import it.
try:
    import textual  # noqa: F401
except ImportError:
    collect_ignore_glob = ["tui/test_*.py"]


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from toolkit.engine.device import probe_gpu

    ok, why = probe_gpu()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"no usable CUDA GPU: {why}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stories_dir():
    if not (STORIES / "config.json").exists():
        pytest.skip("../shared/models/stories260K is absent")
    return STORIES
