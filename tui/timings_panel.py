"""The live timings panel: the toggles as they ran, where each step's time goes, and what each toggle buys.

`TimingsPanel` renders a `StepStats` (tui/step_stats.py). From the top:
  * the header (device, model, dtype, context used) and one line per toggle this backend can run, with its
    key and the state the last step ran with (not the state asked for); the sampler fast path's line says
    why it does not apply when it does not, so the reason is on screen even in the compact layout;
  * a one-line summary (compact layout only);
  * the details: big ms/step and tok/s, the last prefill, a sparkline of recent decode steps with toggle
    marks under it, the A/B table (like with like: tui/step_stats.py), the per-phase table, bandwidth.
`compact` hides the details (narrow terminals put the panel under the chat; ctrl+t flips it).

`record()` may be called far faster than a terminal can redraw: it only aggregates, and the widgets are
brought up to date at most ~15 times a second.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.renderables.sparkline import Sparkline as SparklineBars
from textual.widget import Widget
from textual.widgets import DataTable, Digits, Sparkline, Static

from .step_stats import StepStats

REFRESH_S = 1 / 15  # widget updates per second at most
SHORT = {"sampler_fast_path": "fast path", "sparse_prefill": "sparse", "prefix_caching": "prefix cache",
         "cuda_graphs": "graphs", "fused_kernels": "fused"}  # A/B table labels (a narrow column)


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


def label(name: str) -> str:
    return name.replace("_", " ")


def short_label(name: str) -> str:
    return SHORT.get(name, label(name))


KEY_NAMES = {"question_mark": "?", "escape": "Esc", "enter": "Enter"}


def key_label(key: str) -> str:
    """A binding's keys as the user reads them: "f2,ctrl+f" -> "F2, ctrl+f", question_mark -> ?."""
    return ", ".join(KEY_NAMES.get(k, k.upper() if k[:1] == "f" and k[1:].isdigit() else k)
                     for k in key.split(","))


def sparkline_columns(n: int, width: int) -> list:
    """For each column of a Textual Sparkline `width` wide over `n` values, the value indices it shows: its own
    buckets, picked per column as its renderer does, so marks drawn under the sparkline line up with the bars."""
    if n < 2 or width <= 0:  # the renderer fills every column with the one value, if any
        return [list(range(n)) for _ in range(max(width, 0))]
    buckets = list(SparklineBars._buckets(list(range(n)), width))
    cols, idx, step = [], 0.0, len(buckets) / width
    for _ in range(width):
        cols.append(buckets[int(idx)])
        idx += step
    return cols


def marks_line(n: int, width: int, positions) -> str:
    """A line of `width` characters with "▲" under the first column that shows each marked index."""
    cols = [[]] + sparkline_columns(n, width)  # columns show runs of indices: the first is where the last did not
    return "".join("▲" if any(p in col and p not in prev for p in positions) else " "
                   for prev, col in zip(cols, cols[1:]))


# ---------------------------------------------------------------- the widget

PHASE_COLUMNS = (("phase", "phase"), ("ms", "ms"), ("share", "share %"), ("prefill", "prefill ms"))
AB_COLUMNS = (("toggle", "toggle"), ("shape", "steps"), ("on_ms", "on ms"), ("on_n", "n"),
              ("off_ms", "off ms"), ("off_n", "n"), ("ratio", "off/on"))
AB_CAPTION = ("A/B, like with like: mean ms/step with the toggle on and off, over n steps of one shape "
              "(dec b4 c512: decode, batch 4, context bucket 512; pre b1 t64: prefill, 1 prompt, <= 64 tokens) "
              "and the other toggles alike; off/on > 1: the toggle saves time.")
AB_EMPTY = "No comparison yet: flip a toggle, then run the same kind of step again."


def put_row(table: DataTable, key: str, cells: dict) -> None:
    """Add the row (cells in column order), or update the cells that changed."""
    if key not in table.rows:
        table.add_row(*cells.values(), key=key)
        return
    for col, v in cells.items():
        if table.get_cell(key, col) != v:
            table.update_cell(key, col, v, update_width=True)


def ab_cells(row) -> dict:
    shape = row.shape.label + (f" ({', '.join(short_label(n) for n in row.others_off)} off)"
                               if row.others_off else "")
    ratio = row.ratio
    return {"toggle": short_label(row.toggle), "shape": shape, "on_ms": fmt_ms(row.on_ms), "on_n": str(row.on_n),
            "off_ms": fmt_ms(row.off_ms), "off_n": str(row.off_n),
            "ratio": "-" if ratio is None else f"{ratio:.2f}"}


class TimingsPanel(Widget):
    """Live per-step timings. Call `record()` on the UI thread for each new StepTiming."""

    DEFAULT_CSS = """
    TimingsPanel {
        layout: vertical;
        height: 1fr;
        overflow-y: auto;
        padding: 0 1;
    }
    TimingsPanel.-compact { height: auto; overflow-y: hidden; }
    TimingsPanel.-compact #tp-details { display: none; }
    TimingsPanel #tp-summary { display: none; }
    TimingsPanel.-compact #tp-summary { display: block; color: $text-muted; }
    TimingsPanel #tp-header { color: $text-muted; }
    TimingsPanel #tp-details { height: auto; }
    TimingsPanel #tp-big { height: auto; margin-top: 1; }
    TimingsPanel #tp-big > Vertical { width: 1fr; height: auto; }
    TimingsPanel Digits { width: auto; }
    TimingsPanel #tp-spark { height: 2; margin-top: 1; }
    TimingsPanel #tp-marks { height: 1; color: $warning; }
    TimingsPanel DataTable { height: auto; margin-top: 1; }
    TimingsPanel #tp-ab-caption { color: $text-muted; margin-top: 1; }
    TimingsPanel #tp-ab { margin-top: 0; }
    """

    def __init__(self, header: dict, option_names: tuple, peak_gbps: float | None, weight_bytes: int, keys: dict,
                 implied: dict, requested, expected, **kw):
        """`option_names`: the toggles this backend can run (the others are never shown); `keys`: name -> the
        key that flips it; `requested`/`expected`: the options asked for and as this backend runs them (what
        the header shows until the first step says what ran)."""
        super().__init__(**kw)
        self.header = header
        self.option_names = tuple(option_names)
        self.keys = keys
        self.peak_gbps = peak_gbps
        self.weight_bytes = weight_bytes
        self.stats = StepStats(self.option_names, implied=implied)
        self.batch_tps = None
        self.context_use = (0, header.get("context") or 0)
        self.requested, self.expected = requested, expected
        self._start = self.expected  # what the engine was set to run when the panel began (before any step)
        self.fast_path_why = None  # why the sampler fast path does not apply (None: it does, or unknown)
        self._pending = {}  # toggle -> steps recorded when it was asked for (it takes effect at the next step)
        self._dirty = True
        self._ab_keys = ()

    # ---- composition
    def compose(self) -> ComposeResult:
        yield Static(id="tp-header")
        yield Static(id="tp-toggles")
        yield Static(id="tp-summary")
        with Vertical(id="tp-details"):
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
            yield Static(AB_CAPTION, id="tp-ab-caption")
            for table_id, columns in (("tp-ab", AB_COLUMNS), ("tp-phases", PHASE_COLUMNS)):
                table = DataTable(id=table_id, show_cursor=False, zebra_stripes=True)
                for key, text in columns:
                    table.add_column(text, key=key)
                yield table
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
        if step.sampler_path == "fast":
            self.fast_path_why = None
        elif step.sampler_path == "slow" and step.sampler_why and step.sampler_why != "switched off":
            if not (self.fast_path_why and step.sampler_why in self.fast_path_why):
                self.fast_path_why = step.sampler_why  # keep the fuller list the settings gave, if it says so
        self._dirty = True

    def set_context_use(self, used: int, total: int) -> None:
        self.context_use = (used, total)
        self._dirty = True

    def set_requested(self, requested, expected) -> None:
        """The user asked for `requested`, which this backend runs as `expected`, from the next step on."""
        for name in self.option_names:
            if getattr(requested, name) != getattr(self.requested, name):
                self.stats.mark(f"{name} {'on' if getattr(requested, name) else 'off'}")
            if getattr(requested, name) != getattr(self.requested, name) or \
                    getattr(expected, name) != getattr(self.expected, name):
                self._pending[name] = self.stats.steps
        self.requested, self.expected = requested, expected
        self._dirty = True

    def set_fast_path_note(self, why: str | None) -> None:
        """Why the sampler fast path will not apply under the sampling parameters now set (None: it will)."""
        self.fast_path_why = why
        self._dirty = True

    def set_compact(self, compact: bool) -> None:
        self.set_class(compact, "-compact")
        self._dirty = True

    @property
    def compact(self) -> bool:
        return self.has_class("-compact")

    def state(self, name: str) -> bool:
        """The state `name` ran with at the last step (before any step: as the engine was set up to run it)."""
        ran = self.stats.last_options
        return bool(getattr(ran if ran is not None else self._start, name))

    def toggle_line(self, name: str, width: int = 0) -> Text:
        """`F2 sampler fast path  on  not applicable: ...`: key, name, the state that ran, and what else is
        true of it (a change asked for that the next step makes; a request this setup runs otherwise; why the
        fast path does not apply: on the same line where `width` holds it, else right under the name)."""
        name_w = max(len(label(n)) for n in self.option_names)
        key_w = max(len(key_label(self.keys[n])) for n in self.option_names)
        ran, wanted, next_ = self.state(name), getattr(self.requested, name), getattr(self.expected, name)
        line = Text.assemble((f"{key_label(self.keys[name]):<{key_w}} ", "bold"), f"{label(name):<{name_w}} ")
        line.append("on " if ran else "off", "bold green" if ran else "bold red")
        # A step already running when the toggle was asked for still ran the old state: one step of grace.
        pending = name in self._pending and self.stats.steps <= self._pending[name] + 1
        if pending and next_ != ran:
            line.append(f" -> {'on' if next_ else 'off'} at the next step", "italic")
        elif wanted != ran:
            line.append(f" (asked {'on' if wanted else 'off'})", "dim")
        if name == "sampler_fast_path" and self.fast_path_why:
            reason = f"not applicable: {self.fast_path_why}"
            wrap = width and line.cell_len + 1 + len(reason) > width
            line.append("\n" + " " * (key_w + 1) if wrap else " ")
            line.append(reason, "yellow")
        return line

    # ---- refresh at most ~15 Hz
    def _tick(self) -> None:
        if self._dirty:
            self.flush()

    def flush(self) -> None:
        """Bring every widget up to date with the aggregates now (normally done by the 15 Hz timer)."""
        if not self.is_mounted:
            return
        self._dirty = False
        s = self.stats
        self._update_header()
        self.query_one("#tp-summary", Static).update(
            f"{fmt_ms(s.mean_decode_ms)} ms/step · {fmt_rate(s.decode_tps)} tok/s · prefill "
            f"{fmt_ms(s.prefill_ms)} ms · ctrl+t: details")
        if self.compact:
            return  # the details are hidden: brought up to date when they show
        self.query_one("#tp-ms", Digits).update(fmt_ms(s.mean_decode_ms))
        self.query_one("#tp-ms-label", Static).update(
            f"ms/step\nnow {fmt_ms(s.current_ms)}" + (f" · batch {s.current_batch}" if s.current_batch > 1 else ""))
        self.query_one("#tp-tps", Digits).update(fmt_rate(s.decode_tps))
        batch = "" if self.batch_tps is None else f" · batch {fmt_rate(self.batch_tps)}"
        self.query_one("#tp-tps-label", Static).update(f"tok/s\nnow {fmt_rate(s.current_tps)}{batch}")
        cached = f" · {s.prefill_cached} reused" if s.prefill_cached else ""
        self.query_one("#tp-prefill", Static).update("prefill -" if s.prefill_ms is None else (
            f"prefill {fmt_ms(s.prefill_ms)} ms · {s.prefill_tokens} tok · {fmt_rate(s.prefill_tps)} tok/s{cached}"))
        recent = s.recent
        spark = self.query_one("#tp-spark", Sparkline)
        spark.data = recent
        line = marks_line(len(recent), spark.size.width, [p for p, _ in s.toggle_marks])
        self.query_one("#tp-marks", Static).update(Text(line.rstrip() or " "))
        self._update_ab()
        self._update_phases()
        gbps = s.weights_gbps(self.weight_bytes)
        bw = f"weights {fmt_rate(gbps)} GB/s"
        if gbps is not None and self.peak_gbps:
            bw += f" ({100 * gbps / self.peak_gbps:.0f}% of {self.peak_gbps:.0f} peak)"
        bw += f"\nsampler materialised {fmt_bytes(s.sampler_bytes)}/step"
        self.query_one("#tp-bw", Static).update(bw)

    def _update_header(self) -> None:
        h = self.header
        used, total = self.context_use
        parts = [str(h[k]) for k in ("device", "model", "dtype") if h.get(k)] + [f"context {used} / {total}"]
        self.query_one("#tp-header", Static).update(Text(" · ".join(parts)))
        width = self.content_region.width or 0
        toggles = Text("\n").join(self.toggle_line(n, width) for n in self.option_names)
        self.query_one("#tp-toggles", Static).update(toggles)

    def _update_phases(self) -> None:
        s = self.stats
        table = self.query_one("#tp-phases", DataTable)
        dec, pre = s.phase_means("decode"), s.phase_means("prefill")
        total = sum(v for v in dec.values() if v is not None)
        for name in s.phases():
            ms = dec.get(name)
            put_row(table, name, {"phase": name, "ms": fmt_ms(ms),
                                  "share": f"{100 * ms / total:.0f}" if ms is not None and total > 0 else "-",
                                  "prefill": fmt_ms(pre.get(name))})

    def _update_ab(self) -> None:
        table = self.query_one("#tp-ab", DataTable)
        rows = self.stats.ab_rows()
        keys = tuple(r.key for r in rows)
        if keys != self._ab_keys:  # a new comparison: rebuilt, so rows stay in toggle and shape order (rare)
            table.clear()
            self._ab_keys = keys
        for r in rows:
            put_row(table, r.key, ab_cells(r))
        table.display = bool(rows)
        self.query_one("#tp-ab-caption", Static).update(AB_CAPTION if rows else AB_EMPTY)
