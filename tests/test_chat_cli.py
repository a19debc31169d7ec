"""`python -m toolkit chat`, driven through stdin on the CPU with fixture models."""
import io

from conftest import FIXTURES

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
