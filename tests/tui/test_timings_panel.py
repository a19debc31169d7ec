"""The timings panel: StepStats numbers by hand, then the widget in a headless Textual app."""
from types import MappingProxyType, SimpleNamespace

import pytest

pytest.importorskip("textual")

from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets import DataTable, Digits, Sparkline, Static  # noqa: E402

from tests.tui.tui_fakes import Step  # noqa: E402 (StepTiming, with the context bucket)
from toolkit.engine.options import EngineOptions  # noqa: E402
from tui.step_stats import Shape, StepStats, implied_off, step_ms, step_shape  # noqa: E402
from tui.timings_panel import TimingsPanel, marks_line, sparkline_columns  # noqa: E402

ON = EngineOptions()
NO_GRAPHS = ON.with_(cuda_graphs=False)
SLOW = ON.with_(sampler_fast_path=False)
GPU = SimpleNamespace(name="cuda", dtype="bfloat16", num_sms=132, sm90=True, graphs_supported=True, pdl_supported=True)
_index = iter(range(10**9))


def sections(**ms):
    return MappingProxyType(ms)


def decode(gpu=10.0, wall=12.0, n=1, opts=ON, secs=None, graph=False, detok=0.5, ctx=256, **extra):
    return Step(next(_index), "decode", n, n, wall_ms=wall, gpu_ms=gpu,
                sections_ms=secs if secs is not None else MappingProxyType({}), graph=graph,
                options=opts, detokenize_ms=detok, context_bucket=ctx, **extra)


def prefill(gpu=40.0, wall=45.0, n=20, cached=0, opts=ON, secs=None, seqs=1):
    return Step(next(_index), "prefill", n, seqs, wall_ms=wall, gpu_ms=gpu,
                sections_ms=secs if secs is not None else MappingProxyType({}),
                options=opts, cached_tokens=cached)


def rows(stats, toggle=None):
    return [r for r in stats.ab_rows() if toggle is None or r.toggle == toggle]


# ---------------------------------------------------------------- StepStats

def test_empty():
    s = StepStats()
    assert s.current_ms is None and s.mean_decode_ms is None and s.decode_tps is None
    assert s.prefill_ms is None and s.recent == [] and s.phase_means() == {}
    assert s.weights_gbps(1e9) is None
    assert s.ab_rows() == [] and s.last_options is None


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
    s.mark("pdl off")  # a toggle the app announces marks the next decode step
    s.add(prefill(opts=NO_GRAPHS))
    s.add(decode(gpu=3.0, opts=NO_GRAPHS))
    assert s.toggle_marks == [(62, "cuda_graphs off"), (63, "pdl off")]
    for _ in range(63):
        s.add(decode(gpu=3.0, opts=NO_GRAPHS))
    assert s.toggle_marks == [(0, "pdl off")]
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


def test_ab_means_come_from_one_batch_size():
    """The issue's case: the fast path ran at batch 4, the slow path at batches 1 and 4. Mixing batch sizes gave
    the slow path the lower mean (9.75 against 10.0 ms); like with like, it is slower at batch 4 (10.5)."""
    s = StepStats()
    for _ in range(3):
        s.add(decode(gpu=10.0, n=4, opts=ON, secs=sections(sample=1.0)))
    for _ in range(3):
        s.add(decode(gpu=9.0, n=1, opts=SLOW, secs=sections(sample=2.0)))
        s.add(decode(gpu=10.5, n=4, opts=SLOW, secs=sections(sample=2.5)))
    (r,) = rows(s, "sampler_fast_path")
    assert r.shape == Shape(0, 4, 256, "decode") and r.shape.label == "dec b4 c256"
    assert (r.on_n, r.on_ms, r.off_n, r.off_ms) == (3, 10.0, 3, 10.5)
    assert r.ratio == pytest.approx(1.05)


def test_ab_means_come_from_one_context_bucket():
    s = StepStats()
    s.add(decode(gpu=5.0, ctx=256, opts=ON))
    s.add(decode(gpu=9.0, ctx=4096, opts=ON))
    s.add(decode(gpu=6.0, ctx=256, opts=SLOW))
    (r,) = rows(s, "sampler_fast_path")
    assert (r.shape.size, r.on_ms, r.off_ms) == (256, 5.0, 6.0)  # the 4,096-token step has no "off" to meet


def test_ab_holds_the_other_toggles_alike():
    s = StepStats()
    s.add(decode(gpu=10.0, opts=ON))
    s.add(decode(gpu=20.0, opts=ON.with_(cuda_graphs=False, sampler_fast_path=False)))  # two at once
    assert rows(s) == []  # neither toggle alone explains the difference
    s.add(decode(gpu=12.0, opts=NO_GRAPHS))  # now graphs off, fast path on: both compare
    fast, graphs = rows(s, "sampler_fast_path"), rows(s, "cuda_graphs")
    assert [(r.on_ms, r.off_ms, r.others_off) for r in fast] == [(12.0, 20.0, ("cuda_graphs",))]
    assert [(r.on_ms, r.off_ms, r.others_off) for r in graphs] == [(10.0, 12.0, ())]


def test_ab_leaves_free_what_a_toggle_implies():
    """PDL runs only in CUDA graphs: graphs off means PDL off too, and the graphs comparison still holds."""
    implied = implied_off(GPU, ON.names())
    assert implied["cuda_graphs"] == {"pdl"} and implied["pdl"] == frozenset()
    assert implied_off(SimpleNamespace(name="cpu", dtype="float32"), ON.names()) == {n: frozenset() for n in ON.names()}
    s = StepStats(implied=implied)
    s.add(decode(gpu=5.0, opts=ON, graph=True))
    s.add(decode(gpu=8.0, opts=ON.with_(cuda_graphs=False, pdl=False)))
    assert [(r.toggle, r.on_ms, r.off_ms) for r in rows(s)] == [("cuda_graphs", 5.0, 8.0)]


def test_ab_prefill_groups_by_prompt_tokens_with_the_cached_ones():
    """Prefix caching on prefills 10 of a 100-token prompt, off all 100: both are prefills of up to 128 tokens."""
    s = StepStats()
    s.add(prefill(gpu=2.0, n=10, cached=90, opts=ON))
    s.add(prefill(gpu=15.0, n=100, opts=ON.with_(prefix_caching=False)))
    s.add(prefill(gpu=99.0, n=1000, opts=ON.with_(prefix_caching=False)))  # another size: no partner
    (r,) = rows(s, "prefix_caching")
    assert (r.shape.label, r.on_ms, r.off_ms) == ("pre b1 t128", 2.0, 15.0)
    assert step_shape(prefill(n=3, seqs=2)).label == "pre b2 t16"


def test_ab_generic_names():
    class Opts:  # a toggle added by a later issue appears with no change
        def __init__(self, fast):
            self.sampler_fast_path = fast
    s = StepStats(option_names=("sampler_fast_path",))
    s.add(decode(gpu=4.0, opts=Opts(True)))
    s.add(decode(gpu=6.0, opts=Opts(False)))
    (r,) = s.ab_rows()
    assert (r.on_ms, r.off_ms) == (4.0, 6.0)
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

HEADER = {"device": "cuda", "model": "stories260K", "dtype": "bfloat16", "context": 512}
KEYS = {n: f"f{i + 2}" for i, n in enumerate(EngineOptions.names())}


class PanelApp(App):
    def __init__(self, names=EngineOptions.names(), requested=ON, expected=ON):
        super().__init__()
        self.names, self.requested, self.expected = names, requested, expected

    def compose(self) -> ComposeResult:
        yield TimingsPanel(HEADER, self.names, peak_gbps=100.0, weight_bytes=1_000_000_000, keys=KEYS,
                           requested=self.requested, expected=self.expected, implied=implied_off(GPU, ON.names()),
                           id="panel")


def text(widget) -> str:
    return str(widget.render())


def toggle_lines(app) -> dict:
    lines = text(app.query_one("#tp-toggles", Static)).split("\n")
    out = {}
    for line in lines:
        parts = line.split()
        if parts and parts[0].startswith("F"):
            key = parts[0]
            out[key] = line
        else:
            out[key] += "\n" + line  # a reason that did not fit stands right under its toggle
    return out


@pytest.mark.asyncio
async def test_panel_fills_and_compares_like_with_like():
    app = PanelApp()
    async with app.run_test(size=(110, 60)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.set_context_use(40, 512)
        panel.record(prefill(gpu=40.0, n=20, cached=4, secs=sections(embedding=1.0, attention=30.0)))
        for _ in range(3):
            panel.record(decode(gpu=10.0, wall=12.0, detok=1.0,
                                secs=sections(embedding=1.0, attention=5.0, mlp=3.0, lm_head=0.5, sample=0.5)),
                         batch_tokens_per_s=95.0)
        panel.set_requested(NO_GRAPHS, NO_GRAPHS.with_(pdl=False))
        panel.record(decode(gpu=20.0, opts=NO_GRAPHS.with_(pdl=False)))
        panel.record(decode(gpu=30.0, n=2, opts=NO_GRAPHS.with_(pdl=False)))  # batch 2: no partner
        panel.flush()
        await pilot.pause()

        header = text(app.query_one("#tp-header", Static))
        assert "stories260K" in header and "context 40 / 512" in header
        assert app.query_one("#tp-ms", Digits).value == "30.00"  # the run since the batch size changed
        assert app.query_one("#tp-tps", Digits).value == "66.7"
        assert "batch 95.0" in text(app.query_one("#tp-tps-label", Static))
        assert "prefill 40.00 ms" in text(app.query_one("#tp-prefill", Static))
        assert "4 reused" in text(app.query_one("#tp-prefill", Static))
        assert app.query_one("#tp-spark", Sparkline).data == [10.0, 10.0, 10.0, 20.0, 30.0]
        assert "▲" in text(app.query_one("#tp-marks", Static))

        phases = app.query_one("#tp-phases", DataTable)
        assert phases.get_cell("attention", "ms") == "5.00"
        assert phases.get_cell("attention", "share") == "42"  # 5 of 12 ms wall
        assert phases.get_cell("attention", "prefill") == "30.00"
        assert phases.get_cell("host", "ms") == "1.00"

        ab = app.query_one("#tp-ab", DataTable)
        (row,) = panel.stats.ab_rows()  # PDL went off with the graphs: only the graphs compare
        cells = [ab.get_cell(row.key, c) for c in ("toggle", "shape", "on_ms", "on_n", "off_ms", "off_n", "ratio")]
        assert cells == ["graphs", "dec b1 c256", "10.00", "3", "20.00", "1", "2.00"]
        assert ab.row_count == 1

        bw = text(app.query_one("#tp-bw", Static))
        assert "weights 33.3 GB/s (33% of 100 peak)" in bw and "sampler materialised -" in bw


@pytest.mark.asyncio
async def test_toggle_lines_show_what_ran():
    app = PanelApp()
    async with app.run_test(size=(110, 40)):
        panel = app.query_one(TimingsPanel)
        panel.flush()
        lines = toggle_lines(app)
        assert list(lines) == ["F2", "F3", "F4", "F5", "F6", "F7"]
        assert all(line.split()[-1] == "on" for line in lines.values())
        # asked while idle: the header keeps what runs, and says what the next step will do
        panel.set_requested(NO_GRAPHS, NO_GRAPHS.with_(pdl=False))
        panel.flush()
        lines = toggle_lines(app)
        assert lines["F5"].endswith("cuda graphs       on  -> off at the next step")
        assert lines["F7"].endswith("pdl               on  -> off at the next step")
        panel.record(decode(opts=NO_GRAPHS.with_(pdl=False)))
        panel.record(decode(opts=NO_GRAPHS.with_(pdl=False)))
        panel.flush()
        lines = toggle_lines(app)
        assert lines["F5"].endswith("cuda graphs       off")
        assert lines["F7"].endswith("pdl               off (asked on)")  # PDL runs only in graphs
        assert panel.state("pdl") is False and panel.state("sampler_fast_path") is True


@pytest.mark.asyncio
async def test_the_fast_path_reason_stands_beside_its_toggle():
    app = PanelApp()
    async with app.run_test(size=(110, 40)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.set_fast_path_note("vocabulary of 300000 tokens")  # from the model, before any step
        panel.flush()
        assert "on  not applicable: vocabulary of 300000 tokens" in toggle_lines(app)["F2"]
        panel.record(decode(sampler_path="slow", sampler_why="vocabulary of 300000"))  # the fuller note stays
        panel.flush()
        assert "vocabulary of 300000 tokens" in toggle_lines(app)["F2"]
        panel.record(decode(sampler_path="slow", sampler_why="history of 3000 tokens"))  # what ran says otherwise
        panel.flush()
        assert "not applicable: history of 3000 tokens" in toggle_lines(app)["F2"]
        panel.record(decode(sampler_path="fast"))
        panel.flush()
        assert "not applicable" not in toggle_lines(app)["F2"]
        await pilot.resize_terminal(40, 40)  # too narrow for one line: the reason goes right under the name
        panel.set_fast_path_note("temperature 0.7")
        await pilot.pause()
        panel.flush()
        f2 = toggle_lines(app)["F2"].split("\n")
        assert len(f2) >= 2 and f2[1].startswith("   not applicable: temperature 0.7")


@pytest.mark.asyncio
async def test_compact_hides_the_details_but_not_the_toggles():
    app = PanelApp(names=("sampler_fast_path", "sparse_prefill", "prefix_caching"))
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.set_compact(True)
        panel.record(decode(gpu=4.0))
        panel.flush()
        await pilot.pause()
        assert not app.query_one("#tp-details").display or app.query_one("#tp-details").region.height == 0
        assert app.query_one("#tp-toggles").region.height == 3
        assert "4.00 ms/step" in text(app.query_one("#tp-summary", Static))


@pytest.mark.asyncio
async def test_fast_records_are_throttled_then_flushed_by_the_timer():
    app = PanelApp()
    async with app.run_test(size=(110, 60)) as pilot:
        panel = app.query_one(TimingsPanel)
        panel.flush()
        for i in range(500):
            panel.record(decode(gpu=1.0 + i % 3, opts=ON if i < 250 else SLOW))
        assert panel._dirty  # not every record redraws
        await pilot.pause(0.2)
        assert not panel._dirty
        assert app.query_one("#tp-spark", Sparkline).data == panel.stats.recent
        (row,) = panel.stats.ab_rows()
        assert app.query_one("#tp-ab", DataTable).get_cell(row.key, "on_n") == "250"
