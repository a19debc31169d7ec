"""`bench suite`: one table of the speed cells of several shapes, each measured by `bench` in child processes.

A cell is a decode test (batch x depth) or the prefill. Every cell is first placed by memory, with the
sizes bench itself would give each engine (`engine_sizes`: our paged K/V; `peer_sizes`: the peer's static
[batch, positions] cache; each process also holds its own weights), against USABLE of the free memory:

  * "both": ours and the peer in one process, when both caches and both weights fit;
  * else each alone, in a process of its own (the peer through `bench --peer-only`), if it fits by itself;
  * else neither: a note with the arithmetic, and the cell is reported without that side.

Cells with the same placement and batch sizes then share a process, depth after depth while the process
still fits, and the prefill joins the first process that still fits with it: a shape whose cells all fit
together is one child. Under a time budget (`one_depth`) each depth is a child of its own instead, so a call
can stop between depths: a whole larger shape is longer than one 10-minute device call (Llama-3.2-1B's nine
cells and the prefill took 427 s in one child on the H200), at the cost of an engine build and a peer compile
for each extra child. The children's JSON is merged into one row per shape.
"""
import math
from dataclasses import dataclass

from toolkit.model.decoder import KVCache
from toolkit.model.weights import expected_tensors
from .speed import Test, engine_sizes, peer_sizes, plan

SHAPES = ("qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b")
DEFAULTS = {  # the table on the GPU; a CPU run of seconds
    "cuda": dict(shapes=list(SHAPES), batch=[1, 32, 128], depth=[0, 2048, 8192], prefill=4096, decode=128,
                 repeats=5),
    "cpu": dict(shapes=["tiny"], batch=[1, 4], depth=[0, 128], prefill=256, decode=16, repeats=3),
}
USABLE = 0.9  # of the free memory; the rest is for CUDA contexts, scratch buffers and activations
_WHO = {"both": "ours + peer", "ours": "ours", "peer": "peer alone"}


@dataclass(frozen=True)
class Run:
    """One child process: the cells batches x depths (and the prefill, if any) for ours, the peer, or both."""
    shape: str
    who: str  # "both", "ours" or "peer"
    batches: tuple = ()
    depths: tuple = ()
    prefill: int = 0

    def tests(self, decode: int) -> list[Test]:
        return plan([self.prefill], self.batches, self.depths, decode)

    @property
    def label(self) -> str:
        cells = [f"b{','.join(map(str, self.batches))} d{','.join(map(str, self.depths))}"] if self.batches else []
        return f"{self.shape} {' + '.join(cells + ([f'prefill {self.prefill}'] if self.prefill else []))} " \
               f"({_WHO[self.who]})"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def placement(cfg, itemsize: int, tests, free: int, peer: bool) -> tuple[list[str], str | None]:
    """Where `tests` can run: ["both"]; ["ours", "peer"] (apart); the one of them that fits alone, or [] (none
    does); without a peer ["ours"] or []. The note gives the arithmetic whenever it is not all in one process."""
    usable, weights = USABLE * free, itemsize * sum(math.prod(s) for s in expected_tensors(cfg).values())
    _, step_tokens, _, ours = engine_sizes(tests, cfg.context_limit)
    batch, positions = peer_sizes(tests, step_tokens)
    tokens = {"ours": ours, "peer": batch * positions} if peer else {"ours": ours}  # of K/V
    kv = {w: n * KVCache.bytes_per_token(cfg, itemsize) for w, n in tokens.items()}
    room = f"{_gib(usable)} usable ({USABLE:.0%} of {_gib(free)} free)"
    if sum(kv.values()) + len(kv) * weights <= usable:
        return ["both" if peer else "ours"], None
    alone = [w for w in kv if kv[w] + weights <= usable]
    over = [f"{'ours' if w == 'ours' else 'the peer'} needs {_gib(kv[w] + weights)} ({_gib(kv[w])} of K/V for "
            f"{tokens[w]:,} tokens + {_gib(weights)} of weights)" for w in kv if w not in alone]
    if over:
        return alone, f"not run: {', '.join(over)}, more than the {room}"
    return alone, (f"ours and the peer run in separate processes: one would need "
                   f"{_gib(sum(kv.values()) + 2 * weights)} ({_gib(kv['ours'])} + {_gib(kv['peer'])} of K/V, "
                   f"2 x {_gib(weights)} of weights), more than the {room}")


def plan_runs(shape, cfg, itemsize, s: dict, free: int, one_depth: bool = False) -> tuple[list[Run], list[str]]:
    """The child processes of one shape (settings `s`: batch, depth, prefill, decode, peer) and the placement notes;
    with one_depth, a process runs one depth's cells (the prefill still joins the first that fits it)."""
    peer, decode = bool(s["peer"]), s["decode"]
    notes, depths_of = [], {}  # (who, batches) -> depths
    for d in s["depth"]:
        at = {}
        for b in s["batch"]:
            whos, note = placement(cfg, itemsize, plan([], [b], [d], decode), free, peer)
            notes += [f"{shape} b{b} d{d}: {note}"] if note else []
            for who in whos:
                at.setdefault(who, []).append(b)
        for who, batches in at.items():
            depths_of.setdefault((who, tuple(batches)), []).append(d)

    def fits(run):
        whos = placement(cfg, itemsize, run.tests(decode), free, peer)[0]
        return run.who in whos or whos == ["both"]

    runs = []
    for (who, batches), depths in depths_of.items():
        run = Run(shape, who, batches, (depths[0],))
        for d in depths[1:]:  # one process for as many depths as fit together
            more = Run(shape, who, batches, run.depths + (d,))
            if one_depth or not fits(more):
                runs.append(run)
                more = Run(shape, who, batches, (d,))
            run = more
        runs.append(run)
    for i, run in enumerate(runs):
        with_prefill = Run(shape, run.who, run.batches, run.depths, s["prefill"])
        if run.who == ("both" if peer else "ours") and fits(with_prefill):
            runs[i] = with_prefill
            return runs, notes
    whos, note = placement(cfg, itemsize, plan([s["prefill"]], [], [], 0), free, peer)
    notes += [f"{shape} prefill {s['prefill']}: {note}"] if note else []
    return [Run(shape, who, prefill=s["prefill"]) for who in whos] + runs, notes


def child_argv(run: Run, s: dict) -> list[str]:
    """`bench`'s arguments for a run (after `python -m toolkit bench`)."""
    argv = ["--shape", run.shape, "--device", s["device"], "--prefill", str(run.prefill), "-r", str(s["repeats"]),
            "--format", "json"]
    argv += ["--batch", ",".join(map(str, run.batches)), "--depth", ",".join(map(str, run.depths)),
             "--decode", str(s["decode"])] if run.batches else ["--decode", "0"]
    argv += ["--peer", s["peer"]] if run.who != "ours" else []
    argv += ["--peer-only"] if run.who == "peer" else []
    return argv + (["--peak-gbps", str(s["peak_gbps"])] if s["peak_gbps"] else [])


def cells(rows: list[dict]) -> dict[str, dict]:
    """The rows of one shape's children as cells: ours and the peer's side by side, with the ratio (decode: our
    tok/s over the peer's; prefill: our time over the peer's)."""
    ours = {r["test"]: r for r in rows if r["impl"] == "toolkit"}
    peers = {r["test"]: r for r in rows if r["impl"] != "toolkit"}
    out = {}
    for test in dict.fromkeys([*ours, *peers]):
        o, p = ours.get(test), peers.get(test)
        r = o or p
        decode = r["kind"] == "decode"
        mine = {k: o and o[k] for k in ("ms", "tok_per_s", "gb_per_s", "hbm_pct", "tflops")}
        out[f"b{r['batch']} d{r['depth']}" if decode else f"prefill {r['prefill']}"] = {
            "kind": r["kind"], "batch": r["batch"], "depth": r["depth"], "prefill": r["prefill"], **mine,
            "peer_ms": p and p["ms"], "peer_tok_per_s": p and p["tok_per_s"],
            "speed_vs_peer": o["tok_per_s"] / p["tok_per_s"] if o and p and decode else None,
            "time_vs_peer": o["ms"] / p["ms"] if o and p and not decode else None}
    return out


def _text(c: dict | None, peer: bool) -> str:
    if c is None:
        return "-"
    decode = c["kind"] == "decode"
    main = c["speed_vs_peer" if decode else "time_vs_peer"] if peer else c["tok_per_s" if decode else "ms"]
    first = "-" if main is None else f"{main:.2f}×" if peer else f"{main:,.0f} tok/s" if decode else f"{main:.2f} ms"
    second = c["hbm_pct" if decode else "tflops"]
    if second is None:
        return first
    return f"{first} ({second:.0f}% HBM)" if decode else f"{first} ({second:.3g} TFLOPS)"


def markdown(table: dict) -> str:
    s, peer = table["settings"], bool(table["settings"]["peer"])
    legend = ("decode: our tok/s ÷ the peer's" if peer else "decode: our tok/s") + \
             " (% of peak HBM bandwidth: the weight and K/V bytes a step reads); " + \
             ("prefill: our time ÷ the peer's" if peer else "prefill: our time") + " (dense-equivalent TFLOPS)"
    env = {**table["environment"], "decode": f"{s['decode']} steps per cell, {s['repeats']} repeats (mean)"}
    head = [f"b{b} d{d}" for d in s["depth"] for b in s["batch"]] + [f"prefill {s['prefill']}"]
    lines = ["| shape | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    lines += [f"| {shape} | " + " | ".join(_text(row["cells"].get(h), peer) for h in head) + " |"
              for shape, row in table["shapes"].items()]
    notes = [n for row in table["shapes"].values() for n in row["notes"]]
    return "\n\n".join(["\n".join(f"{k}: {v}" for k, v in env.items()), legend, "\n".join(lines)]
                       + (["\n".join(f"note: {n}" for n in notes)] if notes else []))


def continuation(rest: list[Run], s: dict) -> list[list[str]]:
    """`bench suite` arguments that run the cells of `rest` (runs a budgeted call left) under settings `s`: one
    command for the shapes none of whose runs ran, with s's batches and depths, and one a shape that ran in part,
    with the batches and depths of its runs left (a cell that ran may run again; its new numbers replace the old)."""
    flags = ["--device", s["device"], "--prefill", str(s["prefill"]), "--decode", str(s["decode"]),
             "-r", str(s["repeats"])] + (["--peer", s["peer"]] if s["peer"] else []) + \
        (["--peak-gbps", f"{s['peak_gbps']:g}"] if s["peak_gbps"] else [])

    def cells(batches, depths):
        return ["--batch", ",".join(map(str, batches)), "--depth", ",".join(map(str, depths))]

    left = {}  # shape -> its runs left, in order
    for r in rest:
        left.setdefault(r.shape, []).append(r)
    whole, parts = [], []
    for i, (shape, runs) in enumerate(left.items()):
        # Only the first shape can have run in part: the rest of the call's shapes were never started.
        if i > 0 or not any(r.batches for r in runs) or _all_cells(runs, s):
            whole.append(shape)
        else:
            batches = sorted({b for r in runs for b in r.batches})
            depths = sorted({d for r in runs for d in r.depths})
            parts.append(["--shapes", shape] + cells(batches, depths) + flags)
    return parts + ([["--shapes", ",".join(whole)] + cells(s["batch"], s["depth"]) + flags] if whole else [])


def _all_cells(runs: list[Run], s: dict) -> bool:
    """Whether these runs hold every batch x depth cell of settings s."""
    have = {(b, d) for r in runs for b in r.batches for d in r.depths}
    return have >= {(b, d) for b in s["batch"] for d in s["depth"]}
