"""Backends: one interface, two implementations.

`model.py` only calls the methods below, so the same decoder runs on either:

    from_host(a) / to_host(a) / empty(shape, dtype)   memory
    begin_step(start_pos, ids) -> ids on device        per-step state (start_pos)
    linear(x, w, out)                                  out = x @ w.T (BLAS / cuBLAS)
    embedding, add_rmsnorm, rope_qkv, silu_mul,
    attention, argmax                                  our kernels (kernels/<op>.py|.cu)
    timer() / synchronize()                            timing

`start_pos` (tokens already in the KV cache) is backend state, set once per
step: on the GPU it lives in device memory so a decode step has no host
values baked into its launches and can later be replayed as a CUDA graph.
"""


def make_backend(name: str, dtype: str | None = None):
    if name == "cpu":
        from .cpu import CpuBackend
        return CpuBackend()
    from .cuda import CudaBackend
    return CudaBackend(dtype or "bfloat16")
