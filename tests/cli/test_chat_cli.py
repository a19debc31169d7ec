"""`python -m toolkit chat`, driven through stdin on the CPU with fixture models."""
import io

import pytest
from tests.conftest import FIXTURES

from toolkit.__main__ import main

QWEN2 = str(FIXTURES / "qwen2")


def _run(monkeypatch, capsys, lines, *extra):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
    rc = main(["chat", "--model", QWEN2, "--device", "cpu", "--temperature", "0", *extra])
    return rc, *capsys.readouterr()


def test_turns_reset_and_quit(monkeypatch, capsys):
    rc, out, err = _run(monkeypatch, capsys, ["Hello there", "And again", "/reset", "Third", "/quit", "never"],
                        "--max-tokens", "3")
    assert rc == 0
    assert out.count("\n") == 3  # one line per reply; nothing after /quit
    assert err.count("prompt tok") == 3 and "(new conversation)" in err


def test_long_history_drops_old_turns(monkeypatch, capsys):
    """With a 128-token context the history soon overflows: old turns go, the chat goes on."""
    turns = [f"turn number {i} with some words" for i in range(6)]
    rc, out, err = _run(monkeypatch, capsys, turns, "--max-tokens", "4", "--max-context", "128")
    assert rc == 0 and err.count("prompt tok") == 6
    prompts = [int(line.split("[")[1].split()[0]) for line in err.splitlines() if "prompt tok" in line]
    assert max(prompts) + 4 < 128 and prompts[-1] < sum(prompts[:3])  # old turns really went


def test_oversized_message_is_an_error_line_not_a_crash(monkeypatch, capsys):
    rc, out, err = _run(monkeypatch, capsys, ["word " * 200, "short"], "--max-tokens", "2", "--max-context", "64")
    assert rc == 0 and "error: the prompt has" in err and err.count("prompt tok") == 1


def test_model_without_template(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", "--model", str(FIXTURES / "llama"), "--device", "cpu"]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_bad_lines_are_one_error_each_and_the_chat_goes_on(monkeypatch, capsys):
    data = b"caf\xe9 au lait\n" + "x\ud800".encode("utf-8", "surrogatepass") + b"\n" + b"y" * 9000 + b"\nHello\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))  # read through .buffer, as a real stdin
    rc = main(["chat", "--model", QWEN2, "--device", "cpu", "--max-context", "128", "--max-tokens", "2",
               "--seed", str(2 ** 64 - 1)])  # the per-turn seed wraps instead of overflowing
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err and err.count("prompt tok") == 1
    assert "error: line 1: not valid UTF-8 (byte 0xe9 at byte 4)" in err
    assert "error: line 2: not valid UTF-8 (byte 0xed at byte 2)" in err  # an encoded surrogate
    assert "error: line 3: the message is longer than 8,192 bytes" in err


@pytest.mark.parametrize("args,message", [
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number"),
    (["--max-tokens", "500", "--max-context", "128"], "error: --max-tokens 500 exceeds the context of 128 tokens"),
    (["--system", "bad \udcff"], "error: --system is not valid Unicode text"),
])
def test_bad_flags(args, message, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    try:
        rc = main(["chat", "--model", QWEN2, "--device", "cpu", *args])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_later_turns_reuse_the_cached_conversation(monkeypatch, capsys):
    """Each turn re-renders the whole conversation; the prefix cache prefills only what is new."""
    words = " ".join(f"w{i}" for i in range(40))  # a first turn long enough to fill whole KV blocks
    rc, out, err = _run(monkeypatch, capsys, [words, "and then?", "more"], "--max-tokens", "3")
    reused = [int(line.split("(")[1].split()[0]) for line in err.splitlines() if "prompt tok" in line]
    assert rc == 0 and reused[0] == 0 and reused[1] >= 16 and reused[2] > reused[1]
