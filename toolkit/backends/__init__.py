"""Backends: one interface (protocol.py), two implementations.

`model.py`, the runner and the sampler call only the methods of `protocol.Backend`:

    cpu.py    NumPy BLAS for GEMMs, our NumPy/Numba twins (kernels/<op>.py) for the rest
    cuda.py   cuBLAS for GEMMs, our CUDA C kernels (kernels/<op>.cu) for the rest

Backends hold no per-step state: every op takes the step's inputs (positions, KV slots, block
tables, the sampler's staged parameters) as arguments, so a step can be captured as a CUDA graph.
"""


def make_backend(name: str, dtype: str | None = None):
    if name == "cpu":
        from .cpu import CpuBackend
        return CpuBackend()
    from .cuda import CudaBackend
    return CudaBackend(dtype or "bfloat16")
