"""Bench results as a Markdown table (for people) or JSON (for scripts).

The Markdown table keeps only the columns some row fills (no GB/s column for a
prefill-only run, no ratio column without a peer), so a small run prints a
small table. JSON carries every field of every row, rounded only by the reader.
"""
import json

from toolkit.engine.options import EngineOptions
from .sweep import fmt


_SWITCH_COLUMNS = [(n, lambda r, n=n: "-" if r["switches"] is None else ("on" if r["switches"][n] else "off"))
                   for n in EngineOptions.names()]
# (header, cell of a speed row); a column shows when some row's cell is not "-" (fmt's for a missing value).
_SPEED_COLUMNS = [
    ("test", lambda r: r["test"]),
    ("impl", lambda r: r["impl"]),
    *_SWITCH_COLUMNS,
    ("ms", lambda r: fmt(r["ms"], r["ms_std"], 3)),
    ("wall ms", lambda r: fmt(r["wall_ms"], r["wall_ms_std"], 3)),
    ("tok/s", lambda r: fmt(r["tok_per_s"], r["tok_per_s_std"], 2)),
    ("GB/s", lambda r: fmt(r["gb_per_s"], None, 1)),
    ("% HBM", lambda r: fmt(r["hbm_pct"], None, 1)),
    ("TFLOPS", lambda r: fmt(r["tflops"], None, 1)),
    ("x peer", lambda r: fmt(r["vs_peer"], None, 2)),
]

_THROUGHPUT_COLUMNS = [
    ("scheduler", lambda r: r["scheduler"] or "-"),
    *_SWITCH_COLUMNS,
    ("requests", lambda r: str(r["requests"])),
    ("prompt tok", lambda r: str(r["prompt_tokens"])),
    ("output tok", lambda r: str(r["output_tokens"])),
    ("wall s", lambda r: fmt(r["wall_s"], None, 2)),
    ("device s", lambda r: fmt(r["device_s"], None, 2)),
    ("output tok/s", lambda r: fmt(r["output_tok_per_s"], r["output_tok_per_s_std"] if r["repeats"] > 1 else None)),
    ("total tok/s", lambda r: fmt(r["total_tok_per_s"], r["total_tok_per_s_std"] if r["repeats"] > 1 else None)),
    ("TTFT p50/p99 ms", lambda r: f"{fmt(r['ttft_ms_p50'], None, 1)} / {fmt(r['ttft_ms_p99'], None, 1)}"),
    ("ITL p50/p99 ms", lambda r: f"{fmt(r['itl_ms_p50'], None, 2)} / {fmt(r['itl_ms_p99'], None, 2)}"),
    ("steps", lambda r: str(r["steps"])),
    ("preempted", lambda r: "-" if r["preemptions"] is None else str(r["preemptions"])),
    ("errors", lambda r: str(r["errors"])),
]


def _render(columns, rows) -> str:
    cells = [[cell(r) for _, cell in columns] for r in rows]
    keep = [i for i, (name, _) in enumerate(columns)
            if name in ("test", "impl", "requests") or any(line[i] != "-" for line in cells)]
    out = ["| " + " | ".join(line[i] for i in keep) + " |" for line in [[name for name, _ in columns], *cells]]
    return "\n".join([out[0], "|" + "---|" * len(keep), *out[1:]])


def markdown(env: dict, rows: list[dict], notes: list[str], throughput: bool = False) -> str:
    table = _render(_THROUGHPUT_COLUMNS if throughput else _SPEED_COLUMNS, rows) if rows else \
        "no test could run on this engine"
    parts = ["\n".join(f"{k}: {v}" for k, v in env.items()), table]
    if notes:
        parts.append("\n".join(f"note: {n}" for n in notes))
    return "\n\n".join(parts)


def as_json(env: dict, rows: list[dict], notes: list[str]) -> str:
    return json.dumps({"environment": env, "results": rows, "notes": notes}, indent=2)
