"""Both backends implement the one op interface (toolkit/backends/protocol.py), taking the Protocol's
arguments (the engine passes them by position), and nothing in it is a switch: no boolean parameter and no
`*_ok` predicate (kernel choices are the step plan's, toolkit/model/plan.py). The CUDA backend's class is
checked without a GPU: an op it forwards to a launcher is checked on the launcher's signature."""
import inspect

import pytest

from toolkit.backends import cuda
from toolkit.backends.cpu import CpuBackend
from toolkit.backends.cuda_kernels import CudaKernels
from toolkit.backends.cuda_sampler import CudaSamplerKernels
from toolkit.backends.cuda_sparse import CudaSparse
from toolkit.backends.protocol import Backend

HOLDERS = {"kernels": CudaKernels, "sampler_kernels": CudaSamplerKernels, "_sparse": CudaSparse}
MEMBERS = sorted(n for n in dir(Backend) if not n.startswith("_") and callable(getattr(Backend, n)))
FACTS = sorted(Backend.__annotations__)


def params(fn) -> list:
    sig = inspect.signature(fn)
    return [p for p in sig.parameters.values() if p.name != "self"]


def cuda_op(name):
    """The CudaBackend function behind `name`: its own method, or the launcher it forwards to."""
    for holder, ops in (cuda.KERNEL_OPS, cuda.SAMPLER_OPS, cuda.SPARSE_OPS):
        if name in ops:
            return getattr(HOLDERS[holder], ops[name])
    return getattr(cuda.CudaBackend, name)


def test_the_protocol_has_the_ops_the_engine_calls():
    for name in ("linear", "gemv", "gemm_skinny_rope", "decode_attention_tc", "prefill_attention", "capture",
                 "replay", "with_pdl", "gumbel_sample", "sparse_attention", "ids_to_host", "step_clock"):
        assert name in MEMBERS
    assert set(FACTS) >= {"name", "dtype", "num_sms", "graphs_supported", "pdl_supported"}


def takes(fn, n: int) -> bool:
    """Whether fn takes exactly n positional arguments: n parameters, any beyond them with defaults (a launcher's
    tuning knobs, which the engine never passes)."""
    ps = params(fn)
    return len(ps) >= n and all(p.default is not inspect.Parameter.empty for p in ps[n:])


@pytest.mark.parametrize("name", MEMBERS)
def test_both_backends_implement_each_op(name):
    n = len(params(getattr(Backend, name)))
    assert takes(getattr(CpuBackend, name), n), name
    assert takes(cuda_op(name), n), name


def test_no_switches_in_the_interface():
    assert not [n for n in MEMBERS if n.endswith("_ok")]
    for name in MEMBERS:
        for p in params(getattr(Backend, name)):
            assert p.annotation is not bool, (name, p.name)


def test_cpu_backend_is_a_backend():
    assert isinstance(CpuBackend(), Backend)
    assert all(hasattr(CpuBackend, f) for f in FACTS)
