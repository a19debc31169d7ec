"""`python -m toolkit generate` as a stream: text mode's headers and its partial text on a signal, input
admitted as its lines arrive (a slow producer, an endless one), an input with no requests. The real entry
point on the CPU with the stories260K model: in-process where that is enough, a subprocess for pipes and
signals (every wait has a timeout, so a regression fails instead of hanging)."""
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from tests.conftest import ROOT

from toolkit.__main__ import main

WAIT_S = 120  # a first result: the model loads (and Numba may compile) first


def _cli(capsys, stories, *args) -> tuple[int, str, str]:
    rc = main(["generate", "--model", str(stories), "--device", "cpu", *args])
    return rc, *capsys.readouterr()


def _spawn(stories, *args, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "toolkit", "generate", "--model", str(stories), "--device", "cpu", *args]
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _lines(stream) -> queue.Queue:
    """A process's output lines as they come (None at its end), for get(timeout=...)."""
    q = queue.Queue()

    def read():
        for line in stream:
            q.put(line.decode())
        q.put(None)
    threading.Thread(target=read, daemon=True).start()
    return q


def _block(lines: queue.Queue) -> list[str]:
    """One text-mode completion: its header line up to the blank line after it."""
    block = [lines.get(timeout=WAIT_S)]
    while block[-1] not in ("\n", None):
        block.append(lines.get(timeout=WAIT_S))
    return block


# -- text mode -------------------------------------------------------------------------------------------------
def test_text_mode_heads_each_completion_and_one_prompt_stays_bare(stories_dir, capsys):
    long = "Once upon a time, in a land far away, there lived a little dragon who loved soup"
    prompts = ["Once upon a time", "The cat\nsat", long]
    rc, out, _ = _cli(capsys, stories_dir, "--max-tokens", "8", "--format", "jsonl", *prompts)
    texts = [r["text"] for r in sorted(map(json.loads, out.splitlines()), key=lambda r: r["id"])]
    assert rc == 0 and all(texts)
    rc, out, _ = _cli(capsys, stories_dir, "--max-tokens", "8", *prompts)
    heads = ["Once upon a time", "The cat sat", long[:60] + "..."]  # one line each, at most 60 characters
    assert rc == 0 and out == "".join(f"[{i}] {h}\n{t}\n\n" for i, (h, t) in enumerate(zip(heads, texts)))
    rc, out, _ = _cli(capsys, stories_dir, "--max-tokens", "8", prompts[0])
    assert rc == 0 and out == texts[0] + "\n"


def test_interrupted_single_prompt_keeps_its_streamed_text(stories_dir, capsys, monkeypatch):
    """SIGINT after a few steps, as the handler takes it: the streamed text stays, marked [aborted]; exit 130."""
    from toolkit.cli.common import signals
    from toolkit.engine.llm_engine import LLMEngine
    rc, full, _ = _cli(capsys, stories_dir, "--max-tokens", "40", "Once upon a time")
    step, steps = LLMEngine.step, []

    def step_then_signal(self):
        steps.append(1)
        if len(steps) == 6:
            signals._handler(signal.SIGINT, None)
        return step(self)
    monkeypatch.setattr(LLMEngine, "step", step_then_signal)
    rc, out, err = _cli(capsys, stories_dir, "--max-tokens", "40", "Once upon a time")
    partial = out.removesuffix("\n[aborted]\n")
    assert rc == 130 and partial != out and partial and full.startswith(partial) and len(partial) < len(full) - 1
    assert "aborted: 1 unfinished request(s), each with its partial text marked [aborted]" in err


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_text_mode_prints_partial_text_marked_aborted(sig, code, stories_dir, tmp_path):
    # "first" finishes at once; the others run two at a time, staggered by it, so that whenever the
    # signal comes some running request has text
    lines = [{"id": "first", "prompt": "Once upon a time", "max_tokens": 1}]
    lines += [{"id": f"r{i}", "prompt": "The little dog", "max_tokens": 500} for i in range(20)]
    (tmp_path / "req.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    p = _spawn(stories_dir, "--prompts-file", str(tmp_path / "req.jsonl"), "--max-num-seqs", "2", "--ignore-eos")
    try:
        out = _lines(p.stdout)
        assert out.get(timeout=WAIT_S) == "[first] Once upon a time\n"
        time.sleep(0.05)
        p.send_signal(sig)
        assert p.wait(timeout=WAIT_S) == code
        err = p.stderr.read().decode()
        rest = "".join(iter(lambda: out.get(timeout=WAIT_S), None))
    finally:
        p.kill()
    parts = re.split(r"^\[(r\d+)\] The little dog\n", rest, flags=re.M)  # [first's text, id, text, id, ...]
    ids, bodies = parts[1::2], parts[2::2]
    assert ids == [f"r{i}" for i in range(len(ids))] and all(b.endswith("\n\n") for b in bodies)  # input order
    aborted = [b for b in bodies if b.endswith("[aborted]\n\n")]
    assert any(b != "[aborted]\n\n" for b in aborted), aborted  # some partial text above its mark
    assert all(len(b) > 500 for b in bodies if b not in aborted)  # the others ran to the end
    assert f"aborted: {len(aborted)} unfinished request(s), each with its partial text marked [aborted]" in err
    assert "Traceback" not in err


# -- streamed input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_slow_producer_gets_each_result_before_writing_the_next_line(fmt, stories_dir):
    p = _spawn(stories_dir, "--prompts-file", "-", "--format", fmt, "--max-tokens", "4", stdin=subprocess.PIPE)
    try:
        out = _lines(p.stdout)
        for rid in ("a", "b"):
            p.stdin.write(json.dumps({"id": rid, "prompt": "Once upon a time"}).encode() + b"\n")
            p.stdin.flush()  # and stdin stays open: the result must come before the input ends
            if fmt == "jsonl":
                rec = json.loads(out.get(timeout=WAIT_S))
                assert rec["id"] == rid and rec["finish_reason"] == "length"
            else:
                assert _block(out)[0] == f"[{rid}] Once upon a time\n"
        p.stdin.close()
        assert out.get(timeout=WAIT_S) is None and p.wait(timeout=WAIT_S) == 0
    finally:
        p.kill()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_while_the_producer_is_silent_exits_with_the_signals_code(sig, code, stories_dir):
    """The input reader is blocked in stdin (open, silent) when the signal comes: the run still ends with the
    documented code, not the interpreter's abort on stdin's lock at shutdown (exit 134, "Fatal Python error")."""
    p = _spawn(stories_dir, "--prompts-file", "-", "--format", "jsonl", "--max-tokens", "2", stdin=subprocess.PIPE)
    try:
        out = _lines(p.stdout)
        p.stdin.write(json.dumps({"id": "a", "prompt": "Once upon a time"}).encode() + b"\n")
        p.stdin.flush()  # and stdin stays open, silent
        assert json.loads(out.get(timeout=WAIT_S))["id"] == "a"
        p.send_signal(sig)
        assert p.wait(timeout=WAIT_S) == code
        err = p.stderr.read().decode()
    finally:
        p.kill()
    assert f"interrupted ({signal.Signals(sig).name})" in err and "Fatal Python error" not in err


def test_endless_input_is_read_no_faster_than_it_is_served(stories_dir):
    """A producer that never stops: the reader stays --max-num-seqs requests ahead of the engine, and the rest
    of the input waits in the pipe (before, the whole input was read first: 731 MB in 15 s)."""
    p = _spawn(stories_dir, "--prompts-file", "-", "--format", "jsonl", "--max-num-seqs", "2", stdin=subprocess.PIPE)
    line = json.dumps({"prompt": "Once upon a time " * 40, "max_tokens": 20, "ignore_eos": True}).encode() + b"\n"
    chunk, taken, done = line * 64, 0, None
    try:
        out = _lines(p.stdout)
        os.set_blocking(p.stdin.fileno(), False)
        t_end = time.monotonic() + WAIT_S
        while time.monotonic() < t_end:
            try:
                taken += os.write(p.stdin.fileno(), chunk)
            except BlockingIOError:
                time.sleep(0.01)
            if done is None and not out.empty():  # results are coming: keep writing for 3 s more
                done = out.get()
                t_end = time.monotonic() + 3
        results = out.qsize() + 1
    finally:
        p.kill()
    assert done is not None and json.loads(done)["finish_reason"] == "length" and results >= 2
    assert taken < 2 ** 20, f"{taken:,} bytes taken in: the input is read ahead of the engine"


@pytest.mark.parametrize("data", [b"", b"\n \n\r\n"])
@pytest.mark.parametrize("from_stdin", [False, True])
def test_input_without_requests_is_a_notice(data, from_stdin, stories_dir, tmp_path, capsys, monkeypatch):
    f = tmp_path / "empty.jsonl"
    f.write_bytes(data)
    if from_stdin:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    name = "-" if from_stdin else str(f)
    rc, out, err = _cli(capsys, stories_dir, "--prompts-file", name)
    assert rc == 0 and out == ""
    assert err.splitlines()[1:] == [f"--prompts-file {name} holds no requests: nothing to do"]  # after the device
