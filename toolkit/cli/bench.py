"""`python -m toolkit bench`: prefill and decode speed, llama-bench style; `bench throughput`: many requests;
`bench suite`: the speed table of several shapes, from child processes of `bench` (toolkit/bench/suite.py).

Random weights of a named shape (`--shape qwen2.5-0.5b`, no checkpoint) or a
model folder (default: the embedded model). Every list flag is a sweep and
every engine switch too (`--cuda-graphs on,off`): each test runs once per
combination, switched with `engine.set_options` between tests, `--warmup`
times untimed and `-r` times timed, reported as mean ± stddev. Tokenization is
excluded: random token ids go straight in. The engine is sized for the tests
(context and KV budget) unless `--max-context` / `--kv-cache-tokens` say
otherwise; a test that still does not fit is skipped with a note. Defaults
are small on the CPU, so a bare `bench` finishes in seconds there.
"""
import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from ..bench import suite
from ..bench.env import environment, peak_gbps
from ..bench.report import as_json, markdown
from ..bench.speed import engine_sizes, failure, peer_sizes, plan, run_speed, skip_reason
from ..bench.sweep import add_switch_args, choice_list, int_list, option_grid
from ..bench.throughput import run_throughput
from toolkit.model.config import ModelConfig
from toolkit.model.hub import resolve_model
from toolkit.engine.build import default_dtype
from toolkit.engine.device import free_memory, resolve_device
from ..engine.scheduler import POLICIES
from ..errors import ToolkitError
from toolkit.engine.options import EngineOptions
from toolkit.model.shapes import NAMES, shape_config
from .common import (EXIT_SOME_FAILED, OutputError, add_model_args, add_sparse_args, kv_tokens_int,
                     non_negative_float, non_negative_int, positive_int, run, say, sparse_options)

DEFAULTS = {  # llama-bench's tests on the GPU; a set that finishes in seconds on the CPU
    "cuda": dict(batch=[1, 8, 32, 128], depth=[0, 4096], prefill=[512, 4096], decode=128, repeats=5,
                 num_requests=256, min_len=100, max_len=1024),
    "cpu": dict(batch=[1, 4], depth=[0, 128], prefill=[64, 256], decode=16, repeats=3,
                num_requests=16, min_len=16, max_len=128),
}


def _common_args(p: argparse.ArgumentParser):
    p.add_argument("--shape", choices=NAMES, help="random weights of this shape (no checkpoint needed)")
    add_model_args(p, model_required=False)
    g = p.add_argument_group("engine sizing (default: bench sizes the engine for its tests)")
    g.add_argument("--kv-cache-tokens", type=kv_tokens_int, default=None, help="KV-cache size in tokens")
    g.add_argument("--max-num-seqs", type=positive_int, default=None, help="requests running at once")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None, help="tokens fed per step")
    add_switch_args(p)
    add_sparse_args(p.add_argument_group("sparse prefill (--attention is overridden by a --sparse-prefill sweep)"))
    p.add_argument("-r", "--repeats", type=positive_int, default=None,
                   help="timed runs per test (GPU 5, CPU 3; throughput 1)")
    p.add_argument("--format", choices=("md", "json"), default="md")


def speed_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit bench",
                                description="Measure prefill and decode speed (`bench throughput -h`: many requests).")
    _common_args(p)
    p.add_argument("--prefill", type=int_list(0), help="prefill lengths at batch 1 (GPU 512,4096; CPU 64,256; "
                                                        "0: none)")
    p.add_argument("--batch", type=int_list(1), help="decode batch sizes (GPU 1,8,32,128; CPU 1,4)")
    p.add_argument("--depth", type=int_list(0), help="context before decode (GPU 0,4096; CPU 0,128)")
    p.add_argument("--decode", type=non_negative_int, help="decode steps per test (GPU 128, CPU 16; 0: no decode "
                                                            "tests)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs per test (default: 1)")
    p.add_argument("--peak-gbps", type=non_negative_float, default=None,
                   help="HBM peak for the roofline column (default: from the GPU's memory clock and bus)")
    p.add_argument("--peer", choices=("torch",),
                   help="also time the torch.compile peer (toolkit/bench/peer.py) in this process")
    p.add_argument("--peer-only", action="store_true",
                   help="time the peer alone, building no engine of ours (bench suite's process for a cell whose "
                        "two caches do not fit in one)")
    return p


def suite_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit bench suite", description=_SUITE_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=choice_list(NAMES), help=f"shapes, one row each (GPU {','.join(suite.SHAPES)}; "
                                                            "CPU tiny)")
    p.add_argument("--batch", type=int_list(1), help="decode batch sizes (GPU 1,32,128; CPU 1,4)")
    p.add_argument("--depth", type=int_list(0), help="context before decode (GPU 0,2048,8192; CPU 0,128)")
    p.add_argument("--prefill", type=positive_int, help="prefill length (GPU 4096, CPU 256)")
    p.add_argument("--decode", type=positive_int, help="decode steps per cell (GPU 128, CPU 16)")
    p.add_argument("-r", "--repeats", type=positive_int, help="timed runs per cell (GPU 5, CPU 3)")
    p.add_argument("--peer", choices=("torch",), help="also time the torch.compile peer: cells become ratios")
    p.add_argument("--peak-gbps", type=non_negative_float, default=None,
                   help="HBM peak for the %% HBM figures (default: from the GPU's memory clock and bus)")
    p.add_argument("--out", type=Path, default=Path("bench-suite"),
                   help="folder for suite.md and suite.json (default: bench-suite)")
    p.add_argument("--budget", type=non_negative_float, default=None,
                   help="seconds for this call: start no child that would end past it were it as long as the "
                        "longest so far, and print the commands that run the rest (e.g. 540 for a 10-minute "
                        "device call)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return p


def throughput_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit bench throughput",
                                description="nano-vllm's workload: many random requests served at once.")
    _common_args(p)
    p.add_argument("--num-requests", type=positive_int, help="requests (GPU 256, CPU 16)")
    p.add_argument("--min-len", type=positive_int, help="shortest prompt/output (GPU 100, CPU 16)")
    p.add_argument("--max-len", type=positive_int, help="longest prompt/output (GPU 1024, CPU 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheduler", type=choice_list(POLICIES),
                   help=f"sweep the scheduler policy ({','.join(POLICIES)}; default: the engine's, alternate)")
    return p


def sampler_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit bench sampler",
                                description="Time the sampler step alone: fast path against slow path, "
                                            "random bf16 logits [B, V].")
    add_model_args(p, model_required=False)
    p.add_argument("--batch", type=int_list(1), default=[1, 32, 128], help="batch sizes (default: 1,32,128)")
    p.add_argument("--vocab", type=positive_int, default=151936, help="vocabulary size (default: Qwen's 151,936)")
    p.add_argument("--steps", type=positive_int, default=100, help="sampler steps per timed graph or loop")
    p.add_argument("-r", "--repeats", type=positive_int, default=5, help="timed runs; the median is reported")
    return p


def _fill_defaults(args, defaults: dict):
    for k, v in defaults.items():
        if getattr(args, k, v) is None:
            setattr(args, k, v)


def _config(args) -> ModelConfig:
    """The config of --shape or --model; a Hub id is fetched here, once (args.model_dir: its local folder)."""
    if args.shape:
        return shape_config(args.shape)
    if args.model:
        args.model_dir = resolve_model(args.model)
        return ModelConfig.from_dir(args.model_dir)
    raise ToolkitError("bench: give --shape NAME or --model DIR")


def _build(args, backend_name, max_context, kv_tokens, max_seqs, step_tokens, options, **extra):
    from toolkit.engine.build import build_engine

    return build_engine(model=None if args.shape else args.model_dir, shape=args.shape, device=backend_name,
                        dtype=args.dtype, max_context=max_context, kv_cache_tokens=kv_tokens,
                        max_num_seqs=max_seqs, max_num_batched_tokens=step_tokens,
                        options=options, warmup=True, **extra)


def _free_device_memory(backend_name: str):
    """After the last reference to an engine is dropped: return its memory, so a free-memory-sized KV
    cache of the next engine sees it again."""
    gc.collect()
    if backend_name == "cuda":
        import cupy as cp

        cp.get_default_memory_pool().free_all_blocks()


def _environment(engine, args, backend_name) -> dict:
    env = environment(backend_name)
    env["model"] = f"{args.shape} (random weights)" if args.shape else args.model
    if engine is not None:
        env.update(dtype=engine.backend.dtype, weights_gb=round(engine.weight_bytes / 1e9, 3),
                   max_context=engine.max_context, kv_cache_tokens=engine.kv_cache_tokens)
    return env


def _peer_class(device: str):
    """The torch.compile peer (toolkit/bench/peer.py; PyTorch is the optional `torch` extra)."""
    from toolkit.bench.peer import TorchPeer, torch_available

    if not torch_available(device):
        raise ToolkitError(f"--peer torch: PyTorch is not installed{' or sees no GPU' if device == 'cuda' else ''}")
    return TorchPeer


def _requested(tests, asked: set) -> list:
    """The tests the flags asked for: --prefill's, and the decode tests of --batch, --depth or --decode (the
    defaults fill in the rest); every test when none of them was given."""
    kinds = ({"prefill"} & asked) | ({"decode"} if asked & {"batch", "depth", "decode"} else set())
    return [t for t in tests if not kinds or t.kind in kinds] or tests  # --decode 0 alone: the prefills run


def _speed(args) -> int:
    backend_name, device_note = resolve_device(args.device)
    asked = {k for k in ("prefill", "batch", "depth", "decode") if getattr(args, k) is not None}
    _fill_defaults(args, DEFAULTS[backend_name])
    if args.peer_only and not args.peer:
        raise ToolkitError("--peer-only needs --peer torch")
    peer_cls = _peer_class(backend_name) if args.peer else None
    cfg = _config(args)
    tests = plan(args.prefill, args.batch, args.depth, args.decode)
    if not tests:
        raise ToolkitError("--prefill 0 with --decode 0 leaves no test to run")
    max_seqs, step_tokens, max_context, kv_tokens = engine_sizes(
        tests, cfg.context_limit, args.max_num_seqs, args.max_num_batched_tokens, args.max_context,
        args.kv_cache_tokens)
    engine, grid, notes, runnable = None, [], [], tests  # --peer-only: no engine of ours; the peer runs every test
    if not args.peer_only:
        engine = _build(args, backend_name, max_context, kv_tokens, max_seqs, step_tokens, EngineOptions())
        device_note = engine.device_note
        requested = _requested(tests, asked)
        skipped = [f"{t.name} {why}" for t in requested if (why := skip_reason(engine, t))]
        if len(skipped) == len(requested):  # nothing asked for can run: a usage error, not a table of nothing
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            raise ToolkitError(f"every requested test would be skipped: {skipped[0]}{more}")
        grid, notes = _grid(args, engine)
        runnable = [t for t in tests if skip_reason(engine, t) is None]
    peak, peak_src = peak_gbps(backend_name, args.peak_gbps)
    env = _environment(engine, args, backend_name)
    env["peak_hbm_gbps"] = f"{peak:.0f} ({peak_src})" if peak else peak_src
    peer = None
    if peer_cls is not None:
        dtype = engine.backend.dtype if engine else "float32"  # build_engine's pick: the CPU backend is fp32
        if engine is None and backend_name == "cuda":
            dtype = args.dtype or default_dtype(cfg)
        max_batch, max_seq_len = peer_sizes(runnable, step_tokens)
        try:
            peer = peer_cls(cfg, dtype, device=backend_name, max_batch=max_batch, max_seq_len=max_seq_len,
                            compile=True)
        except Exception as e:  # e.g. torch.OutOfMemoryError for its static cache: our rows still stand
            if engine is None:
                raise ToolkitError(f"--peer-only: the peer could not be built: {failure(e)}") from None
            notes.append(f"peer skipped: {failure(e)}")
        else:
            env.update(dtype=dtype, peer=peer.label)
    rows, run_notes = run_speed(engine, tests, grid, args.repeats, args.warmup, peak, peer)
    return _print(args, device_note, env, rows, notes + run_notes, throughput=False)


def _throughput(args) -> int:
    backend_name, _ = resolve_device(args.device)
    args.repeats = args.repeats or 1  # one pass over 256 requests is already a long average
    _fill_defaults(args, DEFAULTS[backend_name])
    if args.min_len > args.max_len:
        raise ToolkitError(f"--min-len {args.min_len} > --max-len {args.max_len}")
    cfg = _config(args)
    max_context = args.max_context or min(cfg.context_limit, 2 * args.max_len)
    rows, notes, env, note = [], [], None, None
    for policy in args.scheduler or [None]:
        extra = {} if policy is None else {"scheduler_policy": policy}
        engine = _build(args, backend_name, max_context, args.kv_cache_tokens, args.max_num_seqs,
                        args.max_num_batched_tokens, EngineOptions(), **extra)
        if env is None:
            env, note = _environment(engine, args, backend_name), engine.device_note
            env["workload"] = (f"{args.num_requests} requests, prompt and output lengths uniform in "
                               f"[{args.min_len}, {args.max_len}], seed {args.seed}, ignore_eos")
        grid, grid_notes = _grid(args, engine)
        notes += [n for n in grid_notes if n not in notes]
        for opts in grid:
            engine.set_options(opts)
            row, run_notes = run_throughput(engine, args.num_requests, args.min_len, args.max_len, args.seed,
                                            args.repeats, engine.scheduler.policy)
            rows.append(row)
            notes += [n for n in run_notes if n not in notes]
            if row["first_error"]:
                notes.append(f"{row['errors']} request(s) failed, e.g.: {row['first_error']}")
        del engine
        _free_device_memory(backend_name)
    return _print(args, note, env, rows, notes, throughput=True)


def _grid(args, engine) -> tuple[list[EngineOptions], list[str]]:
    """option_grid's combinations with --attention / --sparse-* applied (a --sparse-prefill sweep keeps its own
    values), and its notes."""
    grid, notes = option_grid(args, engine.backend)
    out = []
    for opts in grid:
        o = sparse_options(args, opts)
        out.append(o.with_(sparse_prefill=opts.sparse_prefill) if args.sparse_prefill is not None else o)
    return out, notes


def _print(args, note, env, rows, notes, throughput) -> int:
    print(note, file=sys.stderr)
    print(as_json(env, rows, notes) if args.format == "json" else markdown(env, rows, notes, throughput))
    return 0


_SUITE_HELP = """\
The speed table for several shapes: decode at each batch x depth and one prefill per shape; with --peer
torch each cell is a ratio to the torch.compile peer. Decode cells add our % of peak HBM bandwidth, the
prefill our TFLOPS. Each shape runs in child processes of `bench --format json`, so its memory is freed
before the next shape and a failed child becomes a note, not the end of the suite. A cell whose two
caches do not fit in one process runs ours and the peer in separate processes; one that does not fit
even alone is reported with the arithmetic (toolkit/bench/suite.py). OUT/suite.md and OUT/suite.json
are written after each child, and the table is printed; the exit code is 1 if a child failed.

Splitting over device calls (10 minutes each): run the table in parts with one --out, by shape (`--shapes
A,B` then `--shapes C,D`) or, for a shape too slow for one call, by cells (`--batch 1,32 --depth 0,2048`
then `--batch 128 --depth 0,2048`, ...). A call keeps every cell of OUT/suite.json that it does not run
when the table was made with the same settings but --shapes, --batch and --depth (the table's columns
become the union), so the last call's table has every cell, and a call cut short keeps what its
finished children measured. stderr shows each child's time, to size the parts; -r and --decode shorten
every cell. Or let the suite split it: with --budget SECONDS each depth of a shape is a child of its
own, a call starts no child that would likely end past the budget, and it prints the commands (same
--out, same --budget) that run the rest.
"""
_ROOT = Path(__file__).resolve().parents[2]  # the children import this toolkit: `python -m toolkit` from here
_PER_ENGINE = ("model", "weights_gb", "max_context", "kv_cache_tokens")  # a child's environment, not the suite's


_CELLS = ("batch", "depth")  # which cells a call runs: a table in parts merges calls that differ only in these


def _suite_table(out: Path, s: dict, shapes: list[str]) -> dict:
    """A new table, or OUT/suite.json's when it was made with the same settings but the cells (a suite run in
    parts); its batch and depth lists then become the union of both calls'."""
    try:
        out.mkdir(parents=True, exist_ok=True)  # before any child runs: an unwritable --out costs no device time
        old = json.loads((out / "suite.json").read_text()) if (out / "suite.json").exists() else None
    except ValueError:  # not a table: a new one replaces it
        old = None
    except OSError as e:
        raise OutputError(f"--out {out}: {e.strerror or e}") from None

    def fixed(settings):
        return {k: v for k, v in settings.items() if k not in _CELLS}

    if not isinstance(old, dict) or not isinstance(old.get("settings"), dict) or fixed(old["settings"]) != fixed(s):
        return {"settings": s, "environment": {}, "shapes": {}}
    for k in _CELLS:
        old["settings"][k] = sorted(set(old["settings"].get(k, [])) | set(s[k]))
    if old["shapes"]:
        say(f"suite: keeping the cells of {', '.join(old['shapes'])} from {out / 'suite.json'} that this call does "
            f"not run (same settings)")
    return old


def _write_table(out: Path, table: dict) -> None:
    try:
        (out / "suite.json").write_text(json.dumps(table, indent=2) + "\n")
        (out / "suite.md").write_text(suite.markdown(table) + "\n")
    except OSError as e:
        raise OutputError(f"--out {out}: {e.strerror or e}") from None


def _suite(args) -> int:
    backend_name, _ = resolve_device(args.device)
    _fill_defaults(args, suite.DEFAULTS[backend_name])
    if args.peer:
        _peer_class(backend_name)  # no torch: the one-line error, before any child starts
    s = {"device": backend_name,
         **{k: getattr(args, k) for k in ("batch", "depth", "prefill", "decode", "repeats", "peer", "peak_gbps")}}
    table = _suite_table(args.out, s, args.shapes)
    free, failed = free_memory(backend_name), 0
    begin, longest, rest = time.perf_counter(), 0.0, []  # rest: the runs --budget left for another call
    for shape in args.shapes:
        cfg = shape_config(shape)
        itemsize = 2 if backend_name == "cuda" and default_dtype(cfg) != "float32" else 4
        # --budget: a child a depth, so the call can stop between depths of a shape (suite.plan_runs)
        runs, notes = suite.plan_runs(shape, cfg, itemsize, s, free, bool(args.budget))
        rows = []
        for r in runs:
            # --budget: a child is started only if it would end within the budget were it as long as the longest
            # so far (the first always starts: each call makes progress).
            if rest or (args.budget and longest and time.perf_counter() - begin + longest > args.budget):
                rest.append(r)
                continue
            say(f"suite: {r.label} ...")
            start = time.perf_counter()
            child = subprocess.run([sys.executable, "-m", "toolkit", "bench", *suite.child_argv(r, s)],
                                   capture_output=True, text=True, cwd=_ROOT)
            try:
                data = json.loads(child.stdout) if child.returncode == 0 else None
            except ValueError:
                data = None
            seconds = round(time.perf_counter() - start, 1)
            longest = max(longest, seconds)
            say(f"suite: {r.label}: {seconds:.0f} s")
            if data is None:
                failed += 1
                why = (child.stderr.strip().splitlines() or ["no output"])[-1]
                notes.append(f"{r.label} failed (exit {child.returncode}): {why}")
            else:
                rows += data["results"]
                notes += [f"{shape}: {n}" for n in data["notes"]]
                table["environment"].update((k, v) for k, v in data["environment"].items() if k not in _PER_ENGINE)
            # Written after every child: a call cut short (a device call's time limit) keeps what finished.
            row = table["shapes"].setdefault(shape, {"cells": {}, "notes": [], "seconds": {}})
            row["cells"].update(suite.cells(rows))  # this call's cells replace the same cells of an earlier part
            row["notes"] = list(dict.fromkeys(row["notes"] + notes))
            row["seconds"][r.label] = seconds
            _write_table(args.out, table)
    print(suite.markdown(table))
    if rest:
        say(f"suite: --budget {args.budget:g} s: {time.perf_counter() - begin:.0f} s run, the longest child "
            f"{longest:.0f} s; the rest of the table, into the same --out:")
        for part in suite.continuation(rest, s):
            say("  python -m toolkit bench suite " + " ".join(part + ["--out", str(args.out)] +
                                                               (["--budget", f"{args.budget:g}"])))
    return EXIT_SOME_FAILED if failed else 0


def _sampler(args) -> int:
    from ..backends import make_backend
    from ..bench.sampler import markdown as sampler_markdown, run_sampler_bench

    backend_name, _ = resolve_device(args.device)
    be = make_backend(backend_name, args.dtype)
    env = environment(backend_name)
    env.update(dtype=be.dtype, logits=f"random [B, {args.vocab}] in {be.dtype}: N(0, 2) + 40 tokens raised by 4..14 "
                                      "(a language model's shape), or N(0, 3) where the mode says so",
               timing=f"median of {args.repeats}; graph = events around one replay of {args.steps} steps")
    rows, refs = run_sampler_bench(be, args.vocab, args.batch, args.steps, args.repeats)
    print(sampler_markdown(env, rows, refs))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sampler"]:
        return run(_sampler, sampler_parser().parse_args(argv[1:]))
    if argv[:1] == ["sparse"]:  # kernel benchmarks of the sparse prefill (toolkit/bench/sparse.py)
        from ..bench.sparse import main as sparse_main

        return sparse_main(argv[1:])
    if argv[:1] == ["suite"]:
        return run(_suite, suite_parser().parse_args(argv[1:]))
    if argv[:1] == ["throughput"]:
        return run(_throughput, throughput_parser().parse_args(argv[1:]))
    return run(_speed, speed_parser().parse_args(argv))
