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
launch_by_value is the same launch for a kernel that takes a struct by value (gemm_wg's TMA descriptors), which
CuPy's call and PdlLauncher's argument tuple cannot pass.
"""
import ctypes

import numpy as np

_ARG_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
              np.dtype(np.float32): ctypes.c_float}


def pdl_attrs(d) -> list:
    """The launch attributes of a PDL launch: programmatic stream serialization allowed."""
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    return [attr]


def launch_config(d, grid, block, smem: int, stream_ptr: int, attrs=None):
    """cuLaunchKernelEx's config: grid and block padded to 3-D, dynamic shared memory, the stream, and `attrs` if
    any (None: a plain launch)."""
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (tuple(grid) + (1, 1))[:3]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (tuple(block) + (1, 1))[:3]
    cfg.sharedMemBytes = smem
    cfg.hStream = d.CUstream(stream_ptr)
    if attrs:
        cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    return cfg


class StructParam:
    """A kernel parameter passed by value as raw bytes, given as 64-bit words (a CUtensorMap's 128 bytes: a
    __grid_constant__ parameter)."""

    def __init__(self, words):
        self.c = (ctypes.c_uint64 * len(words))(*[int(v) for v in words])


def _arg(a):
    """A kernel argument as (value, C type), what CuPy's call passes: a device array's pointer, None's null, a NumPy
    scalar in its own C type."""
    if a is None:
        return 0, ctypes.c_void_p
    if isinstance(a, np.generic):
        return a.item(), _ARG_TYPES[a.dtype]
    return a.data.ptr, ctypes.c_void_p


_PDL_ATTRS = {}  # id(driver) -> (driver, launch_by_value's PDL attributes)


def launch_by_value(f, grid, block, args, smem: int, stream_ptr: int, pdl: bool, driver=None):
    """f(args) through cuLaunchKernelEx with kernelParams as a void* array of the arguments' addresses (what the C
    API takes: the driver copies each parameter's bytes at the launch, a stream capture into its node), so an
    argument may be a struct (StructParam), which PdlLauncher's (values, types) form cannot pass; with pdl, the
    programmatic-serialization attribute. `driver`: a stand-in in tests."""
    if driver is None:
        from cuda.bindings import driver
    d = driver
    objs = []
    for a in args:  # each argument as a ctypes object, whose address goes in the array
        if isinstance(a, StructParam):
            objs.append(a.c)
        else:
            value, ctype = _arg(a)
            objs.append(ctype(value))
    params = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    if pdl and id(d) not in _PDL_ATTRS:  # made once, kept alive like PdlLauncher's
        _PDL_ATTRS[id(d)] = (d, pdl_attrs(d))  # (the driver too, so its id is never reused while cached)
    cfg = launch_config(d, grid, block, smem, stream_ptr, _PDL_ATTRS[id(d)][1] if pdl else None)
    err, = d.cuLaunchKernelEx(cfg, d.CUfunction(f.kernel.ptr), ctypes.addressof(params), 0)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx (by value) failed: {err.name}")


class PdlLauncher:
    """launch(f, grid, block, args, smem, stream_ptr): a CuPy kernel Function, with the PDL attribute set."""

    def __init__(self, driver=None):
        if driver is None:  # (a test passes a stand-in that records the launch)
            from cuda.bindings import driver

        self._d = driver
        self._attrs = pdl_attrs(driver)
        self._functions = {}  # CuPy RawKernel -> CUfunction

    def __call__(self, f, grid, block, args, smem: int, stream_ptr: int):
        d = self._d
        cfg = launch_config(d, grid, block, smem, stream_ptr, self._attrs)
        pairs = [_arg(a) for a in args]
        values, types = tuple(v for v, _ in pairs), tuple(t for _, t in pairs)
        fn = self._functions.get(f)
        if fn is None:  # a RawModule's RawKernel wraps the loaded Function (.kernel) and its CUfunction (.ptr)
            fn = self._functions[f] = d.CUfunction(f.kernel.ptr)
        err, = d.cuLaunchKernelEx(cfg, fn, (values, types), 0)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernelEx (PDL) failed: {err.name}")
