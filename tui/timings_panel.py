"""The live timings panel: where each step's time goes, and what each switch buys.

`TimingsPanel` renders a `StepStats` (tui/step_stats.py): a header, big ms/step and tok/s, the last prefill,
a sparkline of recent decode steps with toggle marks under it, a per-phase table and the A/B table of every
`EngineOptions` switch. `record()` may be called far faster than a terminal can redraw: it only aggregates,
and the widgets are brought up to date at most ~15 times a second, by `update_cell` and value assignment,
never by rebuilding.
"""
from __future__ import annotations

import time
from fractions import Fraction

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Digits, Sparkline, Static

from toolkit.engine.options import EngineOptions

from .step_stats import StepStats

REFRESH_S = 1 / 15  # widget updates per second at most
# ---------------------------------------------------------------- formatting (pure)

def fmt_ms(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def fmt_rate(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_bytes(v) -> str:
    if v is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{int(v)} B"


def sparkline_columns(n: int, width: int) -> list:
    """For each column of a Textual Sparkline `width` wide over `n` values, the value indices it shows.

    Mirrors textual.renderables.sparkline.Sparkline's bucketing, so marks drawn
    under the sparkline line up with the bars.
    """
    if n == 0 or width <= 0:
        return [[] for _ in range(max(width, 0))]
    if n == 1:
        return [[0] for _ in range(width)]
    f = Fraction(n, width)
    buckets = [range(int(f * b), int(f * (b + 1))) for b in range(width)]
    buckets = [b for b in buckets if len(b)]
    cols, idx, step = [], 0.0, len(buckets) / width
    for _ in range(width):
        cols.append(list(buckets[int(idx)]))
        idx += step
    return cols


def marks_line(n: int, width: int, positions) -> str:
    """A line of `width` characters with "▲" under the first column that shows each marked index."""
    cols = sparkline_columns(n, width)
    out = [" "] * width
    for p in positions:
        for c, idx in enumerate(cols):
            if p in idx:
                out[c] = "▲"
                break
    return "".join(out)


# ---------------------------------------------------------------- the widget

PHASE_COLUMNS = (("phase", "phase"), ("ms", "ms"), ("share", "share %"), ("prefill", "prefill ms"))
# The A/B table has two rows per switch (keys "<name>:on", "<name>:off"), so it fits a narrow column.
AB_COLUMNS = (("switch", "switch"), ("state", ""), ("steps", "n"), ("step_ms", "step"),
              ("sampler_ms", "smp"), ("prefill_ms", "pre"))


def ab_row_key(name: str, state: str) -> str:
    """Row key of one switch's "on" or "off" row in the A/B table."""
    return f"{name}:{state}"


class TimingsPanel(Widget):
    """Live per-step timings. Call `record()` on the UI thread for each new StepTiming."""

    DEFAULT_CSS = """
    TimingsPanel {
        layout: vertical;
        height: 1fr;
        overflow-y: auto;
        padding: 0 1;
    }
    TimingsPanel #tp-header { color: $text-muted; }
    TimingsPanel #tp-big { height: auto; }
    TimingsPanel #tp-big > Vertical { width: 1fr; height: auto; }
    TimingsPanel Digits { width: auto; }
    TimingsPanel #tp-spark { height: 2; margin-top: 1; }
    TimingsPanel #tp-marks { height: 1; color: $warning; }
    TimingsPanel DataTable { height: auto; margin-top: 1; }
    TimingsPanel #tp-note { color: $warning; }
    TimingsPanel #tp-ab-caption { color: $text-muted; margin-top: 1; }
    TimingsPanel #tp-ab { margin-top: 0; }
    """

    def __init__(self, header: dict, option_names: tuple = None, peak_gbps: float | None = None,
                 weight_bytes: int = 0, **kw):
        super().__init__(**kw)
        self.header = dict(header)
        self.option_names = tuple(EngineOptions.names() if option_names is None else option_names)
        self.peak_gbps = peak_gbps
        self.weight_bytes = weight_bytes
        self.stats = StepStats(self.option_names)
        self.batch_tps = None
        self.context_use = (0, self.header.get("context") or 0)
        self.switches = {}  # name -> requested state (mark_toggle), else as last run
        self.last_toggle = None
        self.fast_path_note = None
        self._dirty = True
        self._last_flush = 0.0
        self._phase_rows = set()

    # ---- composition
    def compose(self) -> ComposeResult:
        yield Static(id="tp-header")
        with Horizontal(id="tp-big"):
            with Vertical():
                yield Digits("-", id="tp-ms")
                yield Static("ms/step", id="tp-ms-label")
            with Vertical():
                yield Digits("-", id="tp-tps")
                yield Static("tok/s", id="tp-tps-label")
        yield Static(id="tp-prefill")
        yield Sparkline([], id="tp-spark")
        yield Static(id="tp-marks")
        phases = DataTable(id="tp-phases", show_cursor=False, zebra_stripes=True)
        for key, label in PHASE_COLUMNS:
            phases.add_column(label, key=key)
        yield phases
        yield Static("A/B: mean ms of decode step (step), sampler (smp) and prefill (pre) "
                     "over the n steps run with each switch on and off", id="tp-ab-caption")
        ab = DataTable(id="tp-ab", show_cursor=False, zebra_stripes=True)
        for key, label in AB_COLUMNS:
            ab.add_column(label, key=key)
        for name in self.option_names:
            ab.add_row(name, "on", "0", "-", "-", "-", key=ab_row_key(name, "on"))
            ab.add_row("", "off", "0", "-", "-", "-", key=ab_row_key(name, "off"))
        yield ab
        yield Static(id="tp-note")
        yield Static(id="tp-bw")

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self._tick)
        self.flush()

    def on_resize(self) -> None:
        self._dirty = True

    # ---- the contract
    def record(self, step, batch_tokens_per_s: float | None = None) -> None:
        self.stats.add(step)
        if batch_tokens_per_s is not None:
            self.batch_tps = batch_tokens_per_s
        if step.options is not None:
            for name in self.option_names:
                v = getattr(step.options, name, None)
                if v is not None and name not in self.switches:
                    self.switches[name] = bool(v)
        self._changed()

    def set_context_use(self, used: int, total: int) -> None:
        self.context_use = (used, total)
        self._changed()

    def mark_toggle(self, name: str, value: bool) -> None:
        self.switches[name] = bool(value)
        self.last_toggle = f"{name} {'on' if value else 'off'}"
        self.stats.mark(self.last_toggle)
        self._changed()

    def set_fast_path_note(self, text: str | None) -> None:
        self.fast_path_note = text
        self._changed()

    # ---- refresh at most ~15 Hz
    def _changed(self) -> None:
        self._dirty = True
        if time.monotonic() - self._last_flush >= REFRESH_S:
            self.flush()

    def _tick(self) -> None:
        if self._dirty:
            self.flush()

    def flush(self) -> None:
        """Bring every widget up to date with the aggregates now (normally done by the 15 Hz timer)."""
        if not self.is_mounted:
            return
        self._dirty = False
        self._last_flush = time.monotonic()
        s = self.stats
        self._update_header()
        self.query_one("#tp-ms", Digits).update(fmt_ms(s.mean_decode_ms))
        self.query_one("#tp-ms-label", Static).update(
            f"ms/step\nnow {fmt_ms(s.current_ms)}" + (f" · batch {s.current_batch}" if s.current_batch > 1 else ""))
        self.query_one("#tp-tps", Digits).update(fmt_rate(s.decode_tps))
        label = f"tok/s\nnow {fmt_rate(s.current_tps)}"
        if self.batch_tps is not None:
            label += f" · batch {fmt_rate(self.batch_tps)}"
        self.query_one("#tp-tps-label", Static).update(label)
        if s.prefill_ms is None:
            self.query_one("#tp-prefill", Static).update("prefill -")
        else:
            cached = f" · {s.prefill_cached} reused" if s.prefill_cached else ""
            self.query_one("#tp-prefill", Static).update(
                f"prefill {fmt_ms(s.prefill_ms)} ms · {s.prefill_tokens} tok · {fmt_rate(s.prefill_tps)} tok/s{cached}")
        recent = s.recent
        spark = self.query_one("#tp-spark", Sparkline)
        spark.data = recent
        width = spark.size.width or 0
        marks = s.toggle_marks
        line = marks_line(len(recent), width, [p for p, _ in marks]) if width else ""
        self.query_one("#tp-marks", Static).update(Text(line.rstrip() or " "))
        self._update_phases()
        self._update_ab()
        self.query_one("#tp-note", Static).update(self.fast_path_note or "")
        gbps = s.weights_gbps(self.weight_bytes)
        bw = f"weights {fmt_rate(gbps)} GB/s"
        if gbps is not None and self.peak_gbps:
            bw += f" ({100 * gbps / self.peak_gbps:.0f}% of {self.peak_gbps:.0f} peak)"
        bw += f"\nsampler materialised {fmt_bytes(s.sampler_bytes)}/step"
        self.query_one("#tp-bw", Static).update(bw)

    def _update_header(self) -> None:
        h = self.header
        used, total = self.context_use
        parts = [str(h[k]) for k in ("device", "model", "dtype") if h.get(k)]
        line1 = " · ".join(parts)
        line2 = f"context {used} / {total}"
        if self.switches:
            line2 += " · " + " ".join(f"{n}:{'on' if v else 'off'}" for n, v in self.switches.items())
        if self.last_toggle:
            line2 += f" · toggled {self.last_toggle}"
        self.query_one("#tp-header", Static).update(Text(f"{line1}\n{line2}"))

    def _update_phases(self) -> None:
        s = self.stats
        table = self.query_one("#tp-phases", DataTable)
        dec, pre = s.phase_means("decode"), s.phase_means("prefill")
        total = sum(v for v in dec.values() if v is not None)
        for name in s.phases():
            ms = dec.get(name)
            cells = {"ms": fmt_ms(ms),
                     "share": f"{100 * ms / total:.0f}" if ms is not None and total > 0 else "-",
                     "prefill": fmt_ms(pre.get(name))}
            if name not in self._phase_rows:
                table.add_row(name, cells["ms"], cells["share"], cells["prefill"], key=name)
                self._phase_rows.add(name)
            else:
                for col, v in cells.items():
                    if table.get_cell(name, col) != v:
                        table.update_cell(name, col, v, update_width=True)

    def _update_ab(self) -> None:
        table = self.query_one("#tp-ab", DataTable)
        for name, sides in self.stats.ab_table().items():
            for side in ("on", "off"):
                row = ab_row_key(name, side)
                for key, v in sides[side].items():
                    text = str(v) if key == "steps" else fmt_ms(v)
                    if table.get_cell(row, key) != text:
                        table.update_cell(row, key, text, update_width=True)
