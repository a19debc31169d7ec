"""Backend choice: no usable GPU means the CPU with a one-line reason, never a crash."""
import sys

import pytest

from toolkit.device import probe_gpu, resolve_device
from toolkit.errors import ToolkitError


@pytest.fixture(autouse=True)
def fresh_probe():
    probe_gpu.cache_clear()
    yield
    probe_gpu.cache_clear()


def test_forced_cpu(monkeypatch):
    monkeypatch.setenv("TOOLKIT_BACKEND", "cpu")
    assert resolve_device("auto") == ("cpu", "CPU backend: forced by TOOLKIT_BACKEND=cpu")
    with pytest.raises(ToolkitError, match="--device cuda: forced by TOOLKIT_BACKEND=cpu"):
        resolve_device("cuda")


def test_without_cupy(monkeypatch):
    monkeypatch.delenv("TOOLKIT_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    name, why = resolve_device("auto")
    assert name == "cpu" and why.startswith("CPU backend: cupy unavailable") and "\n" not in why


def test_cpu_requested_never_probes(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert resolve_device("cpu") == ("cpu", "CPU backend (requested)")
    with pytest.raises(ToolkitError, match="unknown device"):
        resolve_device("tpu")
