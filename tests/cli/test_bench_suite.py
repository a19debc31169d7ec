"""`python -m toolkit bench suite`: the memory placement and the merge as functions, then the real entry point on
the CPU (its children are real `python -m toolkit bench` processes), and a fake peer through in-process children."""
import contextlib
import io
import json
import sys
from types import SimpleNamespace

import pytest

import toolkit.cli.bench as bench_cli
from toolkit.__main__ import main
from toolkit.bench import suite
from toolkit.bench.speed import plan
from toolkit.model.shapes import shape_config

H200 = 141 * 2**30  # the H200's "141 GB"
GIB = 2**30
QWEN3_KV_PER_TOKEN = 2 * 28 * 8 * 128 * 2  # K and V x layers x kv heads x head_dim x bf16 bytes


def test_a_cell_whose_two_caches_do_not_fit_together_runs_in_two_processes():
    """The old bench's qwen3-0.6b cell at batch 128 x 8,192 ran both engines in one process and the peer died of
    out-of-memory: each engine alone fits the H200, both do not."""
    cfg = shape_config("qwen3-0.6b")
    whos, note = suite.placement(cfg, 2, plan([], [128], [8192], 128), H200, peer=True)
    # Ours: 8192 + 128 steps + 548 of slack (the batch's prompts arrive 2,048 tokens a step) = 8,868 tokens a
    # sequence, in whole 16-token blocks plus one: 8,896. The peer: 128 rows of 8,868 positions.
    ours, peer = 128 * 8896 * QWEN3_KV_PER_TOKEN / GIB, 128 * 8868 * QWEN3_KV_PER_TOKEN / GIB
    assert whos == ["ours", "peer"]
    assert note == (f"ours and the peer run in separate processes: one would need 245.1 GiB ({ours:.1f} GiB + "
                    f"{peer:.1f} GiB of K/V, 2 x 1.1 GiB of weights), more than the 126.9 GiB usable (90% of "
                    "141.0 GiB free)")
    assert suite.placement(cfg, 2, plan([], [128], [8192], 128), H200, peer=False) == (["ours"], None)
    assert suite.placement(cfg, 2, plan([], [32], [8192], 128), H200, peer=True) == (["both"], None)


def test_a_cell_that_does_not_fit_even_alone_is_reported_with_its_numbers():
    whos, note = suite.placement(shape_config("qwen3-0.6b"), 2, plan([], [256], [8192], 128), H200, peer=True)
    assert whos == []
    assert note.startswith("not run: ours needs 261.4 GiB (260.3 GiB of K/V for 2,437,120 tokens + 1.1 GiB of "
                           "weights), the peer needs 260.7 GiB")
    assert note.endswith("more than the 126.9 GiB usable (90% of 141.0 GiB free)")


def test_the_issues_table_on_an_h200_is_seven_processes():
    """Cells share a process while it fits: one per shape, but qwen3-0.6b's batch 128 x 8,192 runs apart (and so
    its other 8,192 cells run in a process of their own: the peer's static cache is batch x longest context)."""
    s = dict(suite.DEFAULTS["cuda"], device="cuda", peer="torch", peak_gbps=None)
    labels = {shape: [r.label for r in suite.plan_runs(shape, shape_config(shape), 2, s, H200)[0]]
              for shape in suite.SHAPES}
    assert labels["qwen3-0.6b"] == ["qwen3-0.6b b1,32,128 d0,2048 + prefill 4096 (ours + peer)",
                                    "qwen3-0.6b b1,32 d8192 (ours + peer)", "qwen3-0.6b b128 d8192 (ours)",
                                    "qwen3-0.6b b128 d8192 (peer alone)"]
    for shape in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b"):
        assert labels[shape] == [f"{shape} b1,32,128 d0,2048,8192 + prefill 4096 (ours + peer)"]
    peer_only = suite.plan_runs("qwen3-0.6b", shape_config("qwen3-0.6b"), 2, s, H200)[0][-1]
    assert suite.child_argv(peer_only, s) == [
        "--shape", "qwen3-0.6b", "--device", "cuda", "--prefill", "0", "-r", "5", "--format", "json",
        "--batch", "128", "--depth", "8192", "--decode", "128", "--peer", "torch", "--peer-only"]


def test_under_a_budget_each_depth_is_a_child():
    """--budget plans a child a depth (a call can stop between depths of a shape); the prefill joins the first child
    that fits it, and cells that need separate processes stay apart."""
    s = dict(suite.DEFAULTS["cuda"], device="cuda", peer="torch", peak_gbps=None)

    def labels(shape):
        return [r.label for r in suite.plan_runs(shape, shape_config(shape), 2, s, H200, True)[0]]

    assert labels("llama-3.2-1b") == ["llama-3.2-1b b1,32,128 d0 + prefill 4096 (ours + peer)",
                                      "llama-3.2-1b b1,32,128 d2048 (ours + peer)",
                                      "llama-3.2-1b b1,32,128 d8192 (ours + peer)"]
    assert labels("qwen3-0.6b") == ["qwen3-0.6b b1,32,128 d0 + prefill 4096 (ours + peer)",
                                    "qwen3-0.6b b1,32,128 d2048 (ours + peer)", "qwen3-0.6b b1,32 d8192 (ours + peer)",
                                    "qwen3-0.6b b128 d8192 (ours)", "qwen3-0.6b b128 d8192 (peer alone)"]


def _row(test, impl, kind, ms, tok_per_s, batch=1, depth=0, prefill=0, hbm=None, tflops=None):
    return dict(test=test, impl=impl, kind=kind, ms=ms, tok_per_s=tok_per_s, batch=batch, depth=depth,
                prefill=prefill, gb_per_s=None, hbm_pct=hbm, tflops=tflops)


def test_cells_merge_ours_and_the_peers_rows_from_any_process():
    rows = [_row("pp4096", "toolkit", "prefill", 10.0, 409600, prefill=4096, tflops=350.0),
            _row("tg128@b32 d0", "toolkit", "decode", 0.8, 40000, batch=32, hbm=30.0),
            _row("pp4096", "torch", "prefill", 25.0, 163840, prefill=4096, tflops=140.0),
            _row("tg128@b128 d8192", "toolkit", "decode", 2.0, 64000, batch=128, depth=8192, hbm=80.0),
            _row("tg128@b32 d0", "torch", "decode", 1.0, 32000, batch=32, hbm=24.0),
            _row("tg128@b128 d8192", "torch", "decode", 4.0, 32000, batch=128, depth=8192)]  # a peer-only child's
    cells = suite.cells(rows)
    assert cells["prefill 4096"]["time_vs_peer"] == pytest.approx(0.4) and cells["prefill 4096"]["tflops"] == 350
    assert cells["b32 d0"]["speed_vs_peer"] == pytest.approx(1.25) and cells["b32 d0"]["hbm_pct"] == 30
    assert cells["b128 d8192"]["speed_vs_peer"] == pytest.approx(2.0) and cells["b128 d8192"]["peer_ms"] == 4.0
    s = dict(batch=[32, 128], depth=[0, 8192], prefill=4096, decode=128, repeats=5, peer="torch")
    md = suite.markdown({"settings": s, "environment": {"gpu": "H200"}, "shapes": {"qwen": {
        "cells": cells, "notes": ["qwen b128 d0 failed (exit 3): internal error: boom"]}}})
    assert "| shape | b32 d0 | b128 d0 | b32 d8192 | b128 d8192 | prefill 4096 |" in md
    assert "| qwen | 1.25× (30% HBM) | - | - | 2.00× (80% HBM) | 0.40× (350 TFLOPS) |" in md
    assert "note: qwen b128 d0 failed (exit 3): internal error: boom" in md and "gpu: H200" in md


# -- the real entry point on the CPU ----------------------------------------------------------------------------

def _suite(tmp_path, *flags):
    return main(["bench", "suite", "--device", "cpu", "--shapes", "tiny", "--out", str(tmp_path / "out"), *flags])


SMALL = ["--batch", "1,2", "--depth", "0,8", "--prefill", "16", "--decode", "4", "-r", "1"]


def test_suite_writes_one_table_and_keeps_other_shapes_of_the_same_settings(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "suite.json").write_text("not a table")  # replaced by a new one
    assert _suite(tmp_path, *SMALL, "--peak-gbps", "100") == 0
    out, err = capsys.readouterr()
    md, data = (tmp_path / "out" / "suite.md").read_text(), json.loads((tmp_path / "out" / "suite.json").read_text())
    assert out == md  # the table printed is the table written
    assert "suite: tiny b1,2 d0,8 + prefill 16 (ours) ..." in err  # every cell fits one process
    cells = data["shapes"]["tiny"]["cells"]
    assert list(cells) == ["prefill 16", "b1 d0", "b2 d0", "b1 d8", "b2 d8"]
    assert all(c["tok_per_s"] > 0 and c["speed_vs_peer"] is None for c in cells.values())
    assert cells["b2 d8"]["hbm_pct"] > 0 and cells["prefill 16"]["tflops"] > 0
    assert "| shape | b1 d0 | b2 d0 | b1 d8 | b2 d8 | prefill 16 |" in md
    assert f"| tiny | {cells['b1 d0']['tok_per_s']:,.0f} tok/s ({cells['b1 d0']['hbm_pct']:.0f}% HBM) |" in md
    # A suite run in parts: a later call keeps the rows of shapes it does not run, made with the same settings.
    data["shapes"] = {"qwen2.5-0.5b": data["shapes"]["tiny"]}
    (tmp_path / "out" / "suite.json").write_text(json.dumps(data))
    assert _suite(tmp_path, *SMALL, "--peak-gbps", "100") == 0
    out, err = capsys.readouterr()
    assert "suite: keeping the cells of qwen2.5-0.5b from" in err and "| qwen2.5-0.5b |" in out and "| tiny |" in out
    assert _suite(tmp_path, *SMALL) == 0  # other settings (no --peak-gbps): a new table
    assert "qwen2.5-0.5b" not in capsys.readouterr().out


def test_a_shape_in_parts_by_cells(tmp_path, capsys):
    """A shape too slow for one device call runs in parts by --batch / --depth with one --out: each call keeps the
    cells it does not run, the columns become the union, and a re-run cell replaces the old one."""
    common = ["--prefill", "16", "--decode", "4", "-r", "1"]
    assert _suite(tmp_path, "--batch", "1", "--depth", "0", *common) == 0
    first = json.loads((tmp_path / "out" / "suite.json").read_text())["shapes"]["tiny"]["cells"]
    capsys.readouterr()
    assert _suite(tmp_path, "--batch", "2", "--depth", "8", *common) == 0
    out, err = capsys.readouterr()
    data = json.loads((tmp_path / "out" / "suite.json").read_text())
    cells = data["shapes"]["tiny"]["cells"]
    assert "suite: keeping the cells of tiny from" in err
    assert (data["settings"]["batch"], data["settings"]["depth"]) == ([1, 2], [0, 8])
    assert cells["b1 d0"] == first["b1 d0"] and cells["b2 d8"]["tok_per_s"] > 0
    assert cells["prefill 16"] != first["prefill 16"]  # run again by the second call: its numbers replace the first's
    assert "| shape | b1 d0 | b2 d0 | b1 d8 | b2 d8 | prefill 16 |" in out
    assert out.count(" - |") == 2  # b2 d0 and b1 d8: never run
    assert _suite(tmp_path, "--batch", "2", "--depth", "8", "--prefill", "16", "--decode", "3", "-r", "1") == 0
    assert "| shape | b2 d8 | prefill 16 |" in capsys.readouterr().out  # other settings (--decode): a new table


def test_a_budget_starts_no_child_past_it_and_prints_the_rest(tmp_path, capsys, monkeypatch):
    """--budget: the first child always runs; a child that would end past the budget, were it as long as the longest
    so far, is not started, and the suite prints the command that runs the rest into the same --out. Running that
    command completes the table."""
    runs = [suite.Run("tiny", "ours", (1, 2), (0,), 16), suite.Run("tiny", "ours", (1, 2), (8,))]
    monkeypatch.setattr(suite, "plan_runs", lambda *a: (list(runs), []))
    assert _suite(tmp_path, "--batch", "1,2", "--depth", "0,8", "--prefill", "16", "--decode", "4", "-r", "1",
                  "--budget", "0.001") == 0
    out, err = capsys.readouterr()
    assert "suite: tiny b1,2 d0 + prefill 16 (ours) ..." in err and "d8 (ours) ..." not in err
    assert "| tiny | " in out and out.count(" - |") == 2  # b1 d8 and b2 d8: left for the next call
    rest = f"--shapes tiny --batch 1,2 --depth 8 --device cpu --prefill 16 --decode 4 -r 1 --out {tmp_path / 'out'} " \
           "--budget 0.001"
    assert f"  python -m toolkit bench suite {rest}\n" in err
    monkeypatch.undo()
    assert main(["bench", "suite", *rest.split()]) == 0
    cells = json.loads((tmp_path / "out" / "suite.json").read_text())["shapes"]["tiny"]["cells"]
    assert all(cells[c]["tok_per_s"] > 0 for c in ("b1 d0", "b2 d0", "b1 d8", "b2 d8"))
    assert "python -m toolkit bench suite" not in capsys.readouterr().err  # one child: nothing left


def test_a_call_cut_short_keeps_the_children_that_finished(tmp_path, capsys, monkeypatch):
    """The table is written after every child, so a call killed in its second child (a device call's time limit)
    leaves the first child's cells in OUT/suite.json. With --budget each depth is its own child."""
    real_run, seen = bench_cli.subprocess.run, []

    def child(argv, **kw):
        if seen:  # the second child: the call is killed here
            raise KeyboardInterrupt
        seen.append(argv)
        return real_run(argv, **kw)

    monkeypatch.setattr(bench_cli, "subprocess", SimpleNamespace(run=child))
    assert _suite(tmp_path, *SMALL, "--budget", "1000") == 130
    assert "interrupted (SIGINT)" in capsys.readouterr().err
    assert seen[0][seen[0].index("--depth") + 1] == "0"
    cells = json.loads((tmp_path / "out" / "suite.json").read_text())["shapes"]["tiny"]["cells"]
    assert list(cells) == ["prefill 16", "b1 d0", "b2 d0"] and all(c["tok_per_s"] > 0 for c in cells.values())
    assert "| tiny | " in (tmp_path / "out" / "suite.md").read_text()


def test_the_rest_of_a_budgeted_call_as_commands():
    """continuation: a shape cut short gets its runs' batches and depths; the shapes never started one command with
    the call's own."""
    s = {"device": "cuda", "batch": [1, 32, 128], "depth": [0, 2048], "prefill": 4096, "decode": 128, "repeats": 3,
         "peer": "torch", "peak_gbps": None}
    rest = [suite.Run("qwen3-0.6b", "both", (128,), (0, 2048)), suite.Run("llama-3.2-1b", "both", (1, 32, 128),
                                                                         (0, 2048), 4096)]
    flags = ["--device", "cuda", "--prefill", "4096", "--decode", "128", "-r", "3", "--peer", "torch"]
    assert suite.continuation(rest, s) == [
        ["--shapes", "qwen3-0.6b", "--batch", "128", "--depth", "0,2048"] + flags,
        ["--shapes", "llama-3.2-1b", "--batch", "1,32,128", "--depth", "0,2048"] + flags]
    # A shape none of whose cells ran joins the shapes never started.
    whole = [suite.Run("qwen3-0.6b", "both", (1, 32, 128), (0, 2048), 4096), rest[1]]
    assert suite.continuation(whole, s) == [["--shapes", "qwen3-0.6b,llama-3.2-1b", "--batch", "1,32,128",
                                             "--depth", "0,2048"] + flags]


def test_a_failed_child_is_a_note_and_exit_1(tmp_path, capsys):
    """Every test of the only child past tiny's 2,048-token context: the child exits 2, the suite notes why."""
    assert _suite(tmp_path, "--batch", "1", "--depth", "4000", "--prefill", "4000", "--decode", "2", "-r", "1") == 1
    out = capsys.readouterr().out
    assert "| tiny | - | - |" in out
    assert "note: tiny b1 d4000 + prefill 4000 (ours) failed (exit 2): error: every requested test would be skipped: " \
           "pp4000 needs 4001 tokens of context" in out
    assert out == (tmp_path / "out" / "suite.md").read_text()


def test_an_unwritable_out_is_one_line_before_any_child(tmp_path, capsys):
    (tmp_path / "out").write_text("a file")
    assert _suite(tmp_path) == 2
    assert capsys.readouterr().err == f"error: --out {tmp_path / 'out'}: File exists\n"


def test_peer_without_torch_is_one_line_before_any_child(tmp_path, capsys, monkeypatch):
    # A stand-in for toolkit/bench/peer.py on a machine without torch (importing the real one costs seconds).
    fake_peer = SimpleNamespace(TorchPeer=None, torch_available=lambda device=None: False)
    monkeypatch.setitem(sys.modules, "toolkit.bench.peer", fake_peer)
    assert _suite(tmp_path, "--peer", "torch") == 2
    assert capsys.readouterr().err == "error: --peer torch: PyTorch is not installed\n"
    assert not (tmp_path / "out").exists()


# -- a fake peer, the children in this process -----------------------------------------------------------------

class FakePeer:
    label = "torch-fake"
    model = SimpleNamespace(cfg=shape_config("tiny"))

    def __init__(self, cfg, dtype, device, max_batch, max_seq_len, compile):
        pass

    def decode_ms_per_step(self, batch, depth, steps, repeats):
        return [2.0] * repeats

    def prefill_ms(self, length, repeats):
        return [50.0] * repeats


@pytest.mark.parametrize("crash", [False, True])
def test_separate_processes_and_a_crashed_peer_child(crash, tmp_path, capsys, monkeypatch):
    """With little memory, tiny's batch 2 x depth 64 cannot hold both engines in one process: ours and the peer
    (--peer-only) run apart and the parent merges the ratio; the other cells share one process. A peer child that
    crashes costs its cell the ratio, with a note, and the suite exits 1."""
    children = []

    def child(argv, **kw):  # `python -m toolkit bench ...`, run here so that the fake peer is seen
        children.append(argv[4:])
        if crash and "--peer-only" in argv:
            return SimpleNamespace(returncode=3, stdout="", stderr="CPU backend\ninternal error: OutOfMemoryError: "
                                                                   "boom\n")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv[3:])
        return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())

    monkeypatch.setattr(bench_cli, "subprocess", SimpleNamespace(run=child))
    monkeypatch.setattr(bench_cli, "_peer_class", lambda device: FakePeer)
    # Tiny's weights are 15.8 MB: ours or the peer alone at batch 2 x depth 64 need about 16.6 MB, both 33.0 MB;
    # 32.5 MB usable holds every other cell in one process.
    monkeypatch.setattr(bench_cli, "free_memory", lambda backend: 32.5e6 / suite.USABLE)
    rc = _suite(tmp_path, "--batch", "1,2", "--depth", "0,64", "--prefill", "16", "--decode", "4", "-r", "1",
                "--peer", "torch")
    out = capsys.readouterr().out
    runs = [(a[a.index("--batch") + 1], a[a.index("--depth") + 1], a[a.index("--prefill") + 1], "--peer" in a,
             "--peer-only" in a) for a in children]
    assert runs == [("1,2", "0", "16", True, False), ("1", "64", "0", True, False), ("2", "64", "0", False, False),
                    ("2", "64", "0", True, True)]
    assert "note: tiny b2 d64: ours and the peer run in separate processes: one would need" in out
    cells = json.loads((tmp_path / "out" / "suite.json").read_text())["shapes"]["tiny"]["cells"]
    assert cells["prefill 16"]["time_vs_peer"] == pytest.approx(cells["prefill 16"]["ms"] / 50.0)
    assert cells["b1 d64"]["speed_vs_peer"] == pytest.approx(cells["b1 d64"]["tok_per_s"] / (1 / 2e-3))
    b2 = cells["b2 d64"]
    assert b2["tok_per_s"] > 0
    if crash:
        assert rc == 1 and b2["speed_vs_peer"] is None
        assert "note: tiny b2 d64 (peer alone) failed (exit 3): internal error: OutOfMemoryError: boom" in out
    else:  # ours from one process, the peer's from another
        assert rc == 0 and b2["speed_vs_peer"] == pytest.approx(b2["tok_per_s"] / (2 / 2e-3))
