"""Backend choice: no usable GPU means the CPU with a one-line reason, never a crash."""
import sys

import pytest

from toolkit.engine.device import probe_gpu, resolve_device
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


@pytest.mark.parametrize("status, words", [(35, "no NVIDIA driver found (or one too old for CUDA 13)"), (100, "no NVIDIA GPU found"),
                                           (999, "no usable CUDA device")])
def test_plain_words_for_cuda_errors(monkeypatch, status, words):
    """cudaErrorInsufficientDriver on a machine with no driver at all must not read like a broken driver."""
    import types

    class CudaError(RuntimeError):
        def __init__(self):
            super().__init__(f"cudaError {status}")
            self.status = status

    def count():
        raise CudaError()

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=count)))
    monkeypatch.delenv("TOOLKIT_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    name, why = resolve_device("auto")
    assert name == "cpu" and why == f"CPU backend: {words}" + ("" if status != 999 else f" (cudaError {status})")
