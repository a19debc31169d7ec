"""Programmatic dependent launch (PDL): start a kernel while the previous one on the stream still drains.

A batch-1 decode step is ~200 dependent kernels of a few microseconds each. Launched normally, each one starts
only after the previous one has completed, and its blocks then wait a DRAM round trip for their first bytes.
With the PROGRAMMATIC_STREAM_SERIALIZATION launch attribute (Hopper+), the next kernel's blocks may start as soon
as every block of the running kernel has called `griddepcontrol.launch_dependents`; they prefetch their weights,
then `griddepcontrol.wait` for the running kernel's results (kernels/pdl.cuh says which kernels do what).

CuPy's kernel call has no launch attributes, so these launches go through the driver's cuLaunchKernelEx, via
NVIDIA's maintained binding (cuda-bindings, which nvmath-python also needs). A CUDA graph captures the attribute
as a programmatic edge, so the graph replays the overlap too. The engine uses PDL only in captured steps (runner.py):
eagerly, this launcher (a new config and argument tuple per call) measured slower than CuPy's plain launch.
"""
import ctypes

import numpy as np

_ARG_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
              np.dtype(np.float32): ctypes.c_float}


class PdlLauncher:
    """launch(f, grid, block, args, smem, stream_ptr): a CuPy kernel Function, with the PDL attribute set."""

    def __init__(self, driver=None):
        if driver is None:  # (a test passes a stand-in that records the launch)
            from cuda.bindings import driver

        self._d = driver
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        self._attrs = [attr]
        self._functions = {}  # CuPy RawKernel -> CUfunction

    def __call__(self, f, grid, block, args, smem: int, stream_ptr: int):
        d = self._d
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (tuple(grid) + (1, 1))[:3]
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (tuple(block) + (1, 1))[:3]
        cfg.sharedMemBytes = smem
        cfg.hStream = d.CUstream(stream_ptr)
        cfg.attrs = self._attrs
        cfg.numAttrs = 1
        values, types = [], []
        for a in args:  # device arrays -> pointers, NumPy scalars -> their C type (what CuPy's call does)
            if a is None:
                values.append(0)
                types.append(ctypes.c_void_p)
            elif isinstance(a, np.generic):
                values.append(a.item())
                types.append(_ARG_TYPES[a.dtype])
            else:
                values.append(a.data.ptr)
                types.append(ctypes.c_void_p)
        fn = self._functions.get(f)
        if fn is None:  # a RawModule's RawKernel wraps the loaded Function (.kernel) and its CUfunction (.ptr)
            fn = self._functions[f] = d.CUfunction(f.kernel.ptr)
        err, = d.cuLaunchKernelEx(cfg, fn, (tuple(values), tuple(types)), 0)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx (PDL) failed: {err.name}")
