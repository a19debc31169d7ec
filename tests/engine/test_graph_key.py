"""A captured decode graph bakes in the kernels its options chose, so the key it is stored under must hold every
switch that changes them: otherwise a toggled switch keeps replaying the old kernels (a sweep of norm_in_gemm on
and off once measured one set of graphs twice; benchmarks/results/bench_norm_sweep_stale_graphs.log)."""
from toolkit.engine.runner import GRAPH_NEUTRAL, ModelRunner
from toolkit.engine.options import EngineOptions


def test_every_kernel_switch_is_in_the_graph_key():
    base = EngineOptions()
    key = ModelRunner._graph_key(32, 256, base, True)
    for name in EngineOptions.names():
        flipped = base.with_(**{name: not getattr(base, name)})
        changed = ModelRunner._graph_key(32, 256, flipped, True) != key
        assert changed == (name not in GRAPH_NEUTRAL), name
    assert set(GRAPH_NEUTRAL) <= set(EngineOptions.names())
