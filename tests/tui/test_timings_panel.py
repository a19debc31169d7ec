"""The timings panel: StepStats numbers by hand, then the widget in a headless Textual app."""
from types import MappingProxyType

import pytest

pytest.importorskip("textual")

from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets import DataTable, Digits, Sparkline, Static  # noqa: E402

from toolkit.engine.options import EngineOptions  # noqa: E402
from toolkit.engine.timings import StepTiming  # noqa: E402
from tui.step_stats import StepStats, step_ms  # noqa: E402
from tui.timings_panel import TimingsPanel, ab_row_key, marks_line, sparkline_columns  # noqa: E402

ON = EngineOptions()
NO_GRAPHS = ON.with_(cuda_graphs=False)
_index = iter(range(10**9))


def sections(**ms):
    return MappingProxyType(ms)


def decode(gpu=10.0, wall=12.0, n=1, opts=ON, secs=None, graph=False, detok=0.5, **extra):
    return StepTiming(next(_index), "decode", n, n, wall_ms=wall, gpu_ms=gpu,
                      sections_ms=secs if secs is not None else MappingProxyType({}), graph=graph,
                      options=opts, detokenize_ms=detok, **extra)


def prefill(gpu=40.0, wall=45.0, n=20, cached=0, opts=ON, secs=None):
    return StepTiming(next(_index), "prefill", n, 1, wall_ms=wall, gpu_ms=gpu,
                      sections_ms=secs if secs is not None else MappingProxyType({}),
                      options=opts, cached_tokens=cached)


# ---------------------------------------------------------------- StepStats

def test_empty():
    s = StepStats()
    assert s.current_ms is None and s.mean_decode_ms is None and s.decode_tps is None
    assert s.prefill_ms is None and s.recent == [] and s.phase_means() == {}
    assert s.weights_gbps(1e9) is None
    ab = s.ab_table()
    assert set(ab) == set(EngineOptions.names())
    assert ab["cuda_graphs"]["on"] == {"steps": 0, "step_ms": None, "sampler_ms": None, "prefill_ms": None}


def test_decode_and_prefill_numbers():
    s = StepStats()
    s.add(prefill(gpu=40.0, n=20, cached=8))
    s.add(decode(gpu=10.0))
    s.add(decode(gpu=30.0))
    s.add(decode(gpu=0.0, wall=20.0))  # no device time: falls back to wall
    assert s.prefill_ms == 40.0 and s.prefill_tps == pytest.approx(500.0)
    assert s.prefill_tokens == 20 and s.prefill_cached == 8
    assert s.current_ms == 20.0 and s.current_tps == pytest.approx(50.0)
    assert s.mean_decode_ms == pytest.approx(20.0)
    assert s.decode_tps == pytest.approx(3 / 60e-3)
    assert s.recent == [10.0, 30.0, 20.0]  # decode steps only
    assert s.steps == 4 and s.decode_steps == 3
    assert s.weights_gbps(2_000_000_000) == pytest.approx(100.0)  # 2 GB per 20 ms


def test_batch_counts_every_token():
    s = StepStats()
    s.add(decode(gpu=10.0, n=8))
    s.add(decode(gpu=10.0, n=8))
    assert s.current_tps == pytest.approx(800.0) and s.decode_tps == pytest.approx(800.0)
    assert s.current_batch == 8
    s.add(decode(gpu=5.0, n=1))  # batch size changed: the mean starts over
    assert s.mean_decode_ms == 5.0 and s.decode_tps == pytest.approx(200.0)


def test_recent_window_and_toggle_marks():
    s = StepStats()
    for _ in range(70):
        s.add(decode(gpu=1.0))
    assert len(s.recent) == 64 and s.toggle_marks == []
    s.add(decode(gpu=2.0, opts=NO_GRAPHS))  # options changed: mark at this step
    assert s.toggle_marks == [(63, "cuda_graphs off")]
    assert s.mean_decode_ms == 2.0  # the mean is over the configuration now running
    s.mark("tensor_cores off")  # a toggle the app announces marks the next decode step
    s.add(prefill(opts=NO_GRAPHS))
    s.add(decode(gpu=3.0, opts=NO_GRAPHS))
    assert s.toggle_marks == [(62, "cuda_graphs off"), (63, "tensor_cores off")]
    for _ in range(63):
        s.add(decode(gpu=3.0, opts=NO_GRAPHS))
    assert s.toggle_marks == [(0, "tensor_cores off")]
    s.add(decode(gpu=3.0, opts=NO_GRAPHS))
    assert s.toggle_marks == []


def test_phase_means_eager_only_and_missing_sections():
    s = StepStats()
    s.add(decode(gpu=10.0, wall=12.0, detok=0.5, secs=sections(embedding=1.0, attention=4.0, sample=2.0)))
    s.add(decode(gpu=8.0, wall=10.0, detok=0.5, secs=sections(embedding=3.0, attention=2.0)))  # no sampling
    s.add(decode(gpu=1.0, wall=2.0, graph=True))  # graph replay: no sections, left out
    s.add(prefill(gpu=40.0, wall=45.0, secs=sections(attention=30.0, indexer=5.0)))
    m = s.phase_means()
    assert m == pytest.approx({"embedding": 2.0, "attention": 3.0, "sample": 2.0,
                               "host": 1.5, "detokenize": 0.5})
    assert list(m) == ["embedding", "attention", "sample", "host", "detokenize"]
    p = s.phase_means("prefill")
    assert p == pytest.approx({"attention": 30.0, "indexer": 5.0, "host": 5.0, "detokenize": 0.0})
    # every phase name seen, sections first, generic (a later issue's "indexer" included)
    assert s.phases() == ["embedding", "attention", "sample", "indexer", "host", "detokenize"]


def test_ab_table_both_states():
    s = StepStats()
    s.add(prefill(gpu=40.0, opts=ON))
    s.add(decode(gpu=10.0, opts=ON, secs=sections(sample=1.0)))
    s.add(decode(gpu=12.0, opts=ON, secs=sections(sample=3.0)))
    s.add(prefill(gpu=50.0, opts=NO_GRAPHS))
    s.add(decode(gpu=20.0, opts=NO_GRAPHS))  # no sampling section: sampler mean stays unset
    s.add(StepTiming(next(_index), "decode", 1, 1, gpu_ms=99.0))  # no options: not in the A/B table
    ab = s.ab_table()
    g = ab["cuda_graphs"]
    assert g["on"] == {"steps": 3, "step_ms": 11.0, "sampler_ms": 2.0, "prefill_ms": 40.0}
    assert g["off"] == {"steps": 2, "step_ms": 20.0, "sampler_ms": None, "prefill_ms": 50.0}
    t = ab["tensor_cores"]  # never toggled: everything on one side
    assert t["on"]["steps"] == 5 and t["off"]["steps"] == 0
    assert t["on"]["step_ms"] == pytest.approx(14.0)


def test_ab_table_generic_names():
    class Opts:  # a switch added by a later issue appears with no change
        def __init__(self, fast):
            self.sampler_fast_path = fast
    s = StepStats(option_names=("sampler_fast_path",))
    s.add(decode(gpu=4.0, opts=Opts(True)))
    s.add(decode(gpu=6.0, opts=Opts(False)))
    ab = s.ab_table()
    assert ab["sampler_fast_path"]["on"]["step_ms"] == 4.0
    assert ab["sampler_fast_path"]["off"]["step_ms"] == 6.0
    assert s.toggle_marks == [(1, "sampler_fast_path off")]


def test_sampler_bytes_when_reported():
    s = StepStats()
    s.add(decode())
    assert s.sampler_bytes is None  # a step that records no sampler path says nothing about bytes
    s.add(decode(sampler_path="slow", sampler_bytes=4096))
    assert s.sampler_bytes == 4096
    s.add(decode(sampler_path="fast", sampler_bytes=0))
    assert s.sampler_bytes == 0


def test_step_ms_and_sparkline_columns():
    assert step_ms(decode(gpu=3.0, wall=9.0)) == 3.0
    assert step_ms(decode(gpu=0.0, wall=9.0)) == 9.0
    assert sparkline_columns(4, 2) == [[0, 1], [2, 3]]
    assert sparkline_columns(2, 4) == [[0], [0], [1], [1]]
    assert marks_line(2, 4, [1]) == "  ▲ "
    assert marks_line(64, 32, [63]) == " " * 31 + "▲"


# ---------------------------------------------------------------- the widget

HEADER = {"device": "cpu", "model": "stories260K", "dtype": "float32", "context": 512}


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield TimingsPanel(HEADER, EngineOptions.names(), peak_gbps=100.0, weight_bytes=1_000_000_000,
                           id="panel")


def text(widget) -> str:
    return str(widget.render())


@pytest.mark.asyncio
async def test_panel_fills_and_shows_both_states():
    app = PanelApp()
    async with app.run_test(size=(110, 60)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.set_context_use(40, 512)
        panel.record(prefill(gpu=40.0, n=20, cached=4, secs=sections(embedding=1.0, attention=30.0)))
        for _ in range(3):
            panel.record(decode(gpu=10.0, wall=12.0, detok=1.0,
                                secs=sections(embedding=1.0, attention=5.0, mlp=3.0, lm_head=0.5, sample=0.5)),
                         batch_tokens_per_s=95.0)
        panel.mark_toggle("cuda_graphs", False)
        panel.record(decode(gpu=20.0, opts=NO_GRAPHS))
        panel.set_fast_path_note("sampler fast path off: temperature 0.7 needs logits processing")
        panel.flush()
        await pilot.pause()

        header = text(app.query_one("#tp-header", Static))
        assert "stories260K" in header and "context 40 / 512" in header and "cuda_graphs:off" in header
        assert app.query_one("#tp-ms", Digits).value == "20.00"  # the run since the toggle
        assert app.query_one("#tp-tps", Digits).value == "50.0"
        assert "batch 95.0" in text(app.query_one("#tp-tps-label", Static))
        assert "prefill 40.00 ms" in text(app.query_one("#tp-prefill", Static))
        assert "4 reused" in text(app.query_one("#tp-prefill", Static))
        assert app.query_one("#tp-spark", Sparkline).data == [10.0, 10.0, 10.0, 20.0]
        assert "▲" in text(app.query_one("#tp-marks", Static))

        phases = app.query_one("#tp-phases", DataTable)
        assert phases.get_cell("attention", "ms") == "5.00"
        assert phases.get_cell("attention", "share") == "42"  # 5 of 12 ms wall
        assert phases.get_cell("attention", "prefill") == "30.00"
        assert phases.get_cell("host", "ms") == "1.00"
        assert phases.get_cell("detokenize", "ms") == "1.00"

        ab = app.query_one("#tp-ab", DataTable)
        assert ab.row_count == 2 * len(EngineOptions.names())
        on, off = ab_row_key("cuda_graphs", "on"), ab_row_key("cuda_graphs", "off")
        assert ab.get_cell(on, "switch") == "cuda_graphs" and ab.get_cell(off, "state") == "off"
        assert ab.get_cell(on, "steps") == "4"
        assert ab.get_cell(on, "step_ms") == "10.00"
        assert ab.get_cell(on, "sampler_ms") == "0.500"
        assert ab.get_cell(on, "prefill_ms") == "40.00"
        assert ab.get_cell(off, "steps") == "1"
        assert ab.get_cell(off, "step_ms") == "20.00"
        assert ab.get_cell(off, "sampler_ms") == "-"
        assert ab.get_cell(ab_row_key("tensor_cores", "off"), "steps") == "0"

        assert "temperature 0.7" in text(app.query_one("#tp-note", Static))
        bw = text(app.query_one("#tp-bw", Static))
        assert "weights 50.0 GB/s (50% of 100 peak)" in bw and "sampler materialised -" in bw


@pytest.mark.asyncio
async def test_fast_records_are_throttled_then_flushed_by_the_timer():
    app = PanelApp()
    async with app.run_test(size=(110, 60)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.flush()
        for i in range(500):
            panel.record(decode(gpu=1.0 + i % 3))
        assert panel._dirty  # not every record redraws
        await pilot.pause(0.2)
        assert not panel._dirty
        assert app.query_one("#tp-spark", Sparkline).data == panel.stats.recent
        assert app.query_one("#tp-ab", DataTable).get_cell(ab_row_key("cuda_graphs", "on"), "steps") == "500"
