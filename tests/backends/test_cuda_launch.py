"""The PDL launcher's host side (toolkit/backends/cuda_launch.py) without a GPU: what it hands cuLaunchKernelEx.

A stand-in for cuda.bindings.driver records the call; the GPU tests (test_gpu_pdl.py) run the real thing."""
import ctypes
import types

import numpy as np
import pytest

from toolkit.backends.cuda_launch import PdlLauncher
from toolkit.engine.options import EngineOptions


class _Struct:
    def __init__(self, *args):
        self.args = args
        self.value = types.SimpleNamespace()


def fake_driver(result="CUDA_SUCCESS"):
    calls = []

    def launch(cfg, fn, params, extra):
        calls.append((cfg, fn, params, extra))
        return (getattr(d.CUresult, result),)

    d = types.SimpleNamespace(
        CUlaunchAttribute=_Struct, CUlaunchConfig=_Struct, CUstream=lambda p: ("stream", p),
        CUfunction=lambda p: ("function", p), cuLaunchKernelEx=launch,
        CUlaunchAttributeID=types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION="PSS"),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=types.SimpleNamespace(name="CUDA_SUCCESS"),
                                       CUDA_ERROR_INVALID_VALUE=types.SimpleNamespace(name="CUDA_ERROR_INVALID_VALUE")))
    return d, calls


class FakeKernel:  # a RawKernel: the loaded Function's CUfunction pointer
    def __init__(self, ptr):
        self.kernel = types.SimpleNamespace(ptr=ptr)


class FakeArray:  # what the launcher needs of a CuPy array: its device pointer
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


def test_arguments_config_and_attribute():
    d, calls = fake_driver()
    launch = PdlLauncher(d)
    kernel = FakeKernel(0xF00)
    launch(kernel, (7,), (256,), (FakeArray(0x1000), None, np.int32(-3), np.float32(0.5), np.uint32(9)), 96, 0x5)
    cfg, fn, (values, types_), extra = calls[0]
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (7, 1, 1)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (256, 1, 1)
    assert cfg.sharedMemBytes == 96 and cfg.hStream == ("stream", 0x5) and cfg.numAttrs == 1
    attr = cfg.attrs[0]
    assert attr.id == "PSS" and attr.value.programmaticStreamSerializationAllowed == 1
    assert fn == ("function", 0xF00) and extra == 0
    assert values == (0x1000, 0, -3, 0.5, 9)
    assert types_ == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_uint32)
    launch(kernel, (2, 3, 4), (32, 2), (), 0, 0)  # 3-D grid, 2-D block; the CUfunction is looked up once
    cfg = calls[1][0]
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY) == (2, 3, 4, 32, 2)
    assert calls[1][1] is fn


def test_a_failed_launch_raises_naming_the_error():
    d, _ = fake_driver("CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE"):
        PdlLauncher(d)(FakeKernel(1), (1,), (32,), (), 0, 0)


def test_pdl_is_on_by_default_and_reads_as_off_on_the_cpu():
    from toolkit.backends.cpu import CpuBackend

    gpu = types.SimpleNamespace(name="cuda", dtype="bfloat16", graphs_supported=True, pdl_supported=True)
    be = CpuBackend()
    assert EngineOptions().pdl is True
    assert EngineOptions().effective(be).pdl is False
    assert EngineOptions().effective(gpu).pdl is True
    assert EngineOptions(cuda_graphs=False).effective(gpu).pdl is False  # eager: plain launches
    assert be.with_pdl() is be


def test_pdl_reads_as_off_where_the_backend_cannot_replay_graphs(monkeypatch):
    """The engine's effective options derive pdl from the graphs the backend can actually run."""
    from toolkit.engine.build import build_engine

    eng = build_engine(shape="tiny", device="cpu", max_context=64)
    monkeypatch.setattr(eng.backend, "name", "cuda", raising=False)
    monkeypatch.setattr(eng.backend, "pdl_supported", True, raising=False)
    monkeypatch.setattr(eng.backend, "graphs_supported", False, raising=False)
    assert eng.effective_options().pdl is False and eng.effective_options().cuda_graphs is False
    monkeypatch.setattr(eng.backend, "graphs_supported", True)
    assert eng.effective_options().pdl is True
    monkeypatch.setattr(eng.backend, "pdl_supported", False)
    assert eng.effective_options().pdl is False


def test_launch_by_value_passes_each_argument_by_address():
    """gemm_wg's launch (cuda_wg.py): kernelParams is a void* array of each argument's address, so a struct (a
    tensor map's 128 bytes) goes by value; the config is PdlLauncher's, the PDL attribute only with pdl."""
    from toolkit.backends.cuda_launch import StructParam, launch_by_value

    d, calls = fake_driver()
    record = d.cuLaunchKernelEx
    seen = []

    def launch(cfg, fn, params, extra):  # read the arguments while the launcher still holds them
        if not seen:  # the first launch's four arguments
            ptrs = (ctypes.c_void_p * 4).from_address(params)
            seen.append((list((ctypes.c_uint64 * 16).from_address(ptrs[0])),
                         ctypes.c_void_p.from_address(ptrs[1]).value, ctypes.c_void_p.from_address(ptrs[2]).value,
                         ctypes.c_int32.from_address(ptrs[3]).value))
        return record(cfg, fn, params, extra)

    d.cuLaunchKernelEx = launch
    words = list(range(1, 17))
    launch_by_value(FakeKernel(0xB0), (5,), (160,), (StructParam(words), FakeArray(0x2000), None, np.int32(-7)),
                    4096, 0x9, pdl=True, driver=d)
    cfg, fn, params, extra = calls[0]
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX) == (5, 1, 1, 160)
    assert cfg.sharedMemBytes == 4096 and cfg.hStream == ("stream", 0x9) and cfg.numAttrs == 1
    assert cfg.attrs[0].id == "PSS" and fn == ("function", 0xB0) and extra == 0
    assert seen[0] == (words, 0x2000, None, -7)
    launch_by_value(FakeKernel(0xB0), (1,), (32,), (np.int32(1),), 0, 0, pdl=False, driver=d)
    assert not hasattr(calls[1][0], "numAttrs")  # a plain launch: no attributes
