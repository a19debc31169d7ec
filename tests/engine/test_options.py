"""EngineOptions: at most six toggles, each a behaviour; a toggle the backend cannot run is not offered there and
reads as off, so each step's record says what ran."""
from types import SimpleNamespace

import pytest

from toolkit.engine.options import EngineOptions

GPU = SimpleNamespace(name="cuda", dtype="bfloat16", num_sms=132, sm90=True, graphs_supported=True, pdl_supported=True)
CPU = SimpleNamespace(name="cpu", dtype="float32", num_sms=0, sm90=False, graphs_supported=False, pdl_supported=False)


def test_six_toggles_all_on_by_default():
    names = EngineOptions.names()
    assert set(names) == {"sampler_fast_path", "sparse_prefill", "prefix_caching", "cuda_graphs", "fused_kernels",
                          "pdl"}
    assert all(getattr(EngineOptions(), n) is True for n in names)
    assert not set(names) & set(EngineOptions.param_names())


def test_cpu_offers_only_what_it_runs():
    assert EngineOptions.available(CPU) == ("sampler_fast_path", "sparse_prefill", "prefix_caching")
    eff = EngineOptions().effective(CPU)
    assert (eff.cuda_graphs, eff.fused_kernels, eff.pdl) == (False, False, False)
    assert eff.sampler_fast_path and eff.sparse_prefill and eff.prefix_caching


def test_gpu_offers_every_toggle_and_pdl_needs_graphs():
    assert EngineOptions.available(GPU) == EngineOptions.names()
    assert EngineOptions().effective(GPU) == EngineOptions()
    assert EngineOptions(cuda_graphs=False).effective(GPU).pdl is False  # PDL runs in graph-replayed steps only


@pytest.mark.parametrize("backend,gone", [
    (SimpleNamespace(**{**vars(GPU), "graphs_supported": False}), {"cuda_graphs", "pdl"}),  # no nvmath-python
    (SimpleNamespace(**{**vars(GPU), "pdl_supported": False}), {"pdl"}),  # before Hopper, or no cuda-bindings
    (SimpleNamespace(**{**vars(GPU), "dtype": "float32"}), {"fused_kernels"}),  # our GEMMs take 16-bit inputs
])
def test_what_a_gpu_cannot_run_is_not_offered(backend, gone):
    assert set(EngineOptions.names()) - set(EngineOptions.available(backend)) == gone
    eff = EngineOptions().effective(backend)
    assert all(getattr(eff, n) is False for n in gone)
