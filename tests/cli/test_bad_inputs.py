"""Bad input through the real CLI (`toolkit.__main__.main`, in-process, CPU, the llama fixture).

Each table row is one bad thing a user can do. It asserts the exit code, that the message is one
line with no traceback, and, for bad requests, that the good requests of the same batch still
completed. Below the table: what needs a subprocess (signals, a closed or broken stdout) or a
monkeypatch (an internal error). README, "Exit codes and bad input", is the contract tested here.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from tests.conftest import FIXTURES, ROOT

from toolkit.__main__ import main

LLAMA = str(FIXTURES / "llama")  # context 256: prompts up to 16,384 bytes, lines up to 102,400
BASE = ["generate", "--model", LLAMA, "--device", "cpu", "--format", "jsonl"]
GOOD_A = b'{"id": "good-a", "prompt": "Hello there", "max_tokens": 2}'
GOOD_B = b'{"id": "good-b", "prompt": "The cat", "max_tokens": 2, "temperature": 0.7, "seed": 1}'


def _cli(capsys, args) -> tuple[int, str, str]:
    try:
        rc = main(args)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def _records(out: str) -> dict:
    return {r["id"]: r for r in map(json.loads, out.splitlines())}


def _assert_one_line(err: str, message: str):
    assert "Traceback" not in err, err
    hits = [line for line in err.splitlines() if message in line]
    assert hits, f"{message!r} not in stderr:\n{err}"
    assert hits[0].startswith(("error:", "python -m toolkit generate: error:")), hits[0]


# -- requests: one bad line between two good ones; exit 1, both good ones complete ---------------------------
def _surrounded(bad: bytes) -> bytes:
    return b"\n".join([GOOD_A, bad, GOOD_B]) + b"\n"


REQUEST_CASES = [
    ("non-utf8 byte", b'{"prompt": "caf\xe9"}', "line 2: not valid UTF-8 (byte 0xe9 at byte 16)"),
    ("binary line", b"\x00\xff\xfe\x80\x01", "line 2: not valid UTF-8"),
    ("nul in json", b'{"prompt": "a"}\x00', "line 2: not valid JSON"),
    ("lone surrogate prompt", b'{"prompt": "x\\ud800"}', "lone surrogate U+D800 at character 2"),
    ("lone surrogate id", b'{"id": "\\udc80", "prompt": "x"}', '"id" is not valid Unicode text'),
    ("lone surrogate message", b'{"messages": [{"role": "user", "content": "\\udbff"}]}', "lone surrogate U+DBFF"),
    ("max_tokens 1e400", b'{"id": "m", "prompt": "x", "max_tokens": 1e400}',
     'line 2 (id m): max_tokens must be an integer >= 0, got inf'),
    ("max_tokens 2**80", b'{"prompt": "x", "max_tokens": 1208925819614629174706176}',
     "in [0, 256] (at most the context)"),
    ("max_tokens bool", b'{"prompt": "x", "max_tokens": true}', "max_tokens must be an integer >= 0, got True"),
    ("max_tokens string", b'{"prompt": "x", "max_tokens": "4"}', "max_tokens must be an integer >= 0, got '4'"),
    ("max_tokens fraction", b'{"prompt": "x", "max_tokens": 2.5}', "max_tokens must be an integer >= 0, got 2.5"),
    ("temperature NaN", b'{"prompt": "x", "temperature": NaN}',
     "line 2: temperature must be a finite number >= 0, got nan"),
    ("temperature subnormal", b'{"prompt": "x", "temperature": 1e-320}', "temperature 1e-320 is too small"),
    ("top_p zero", b'{"id": "p", "prompt": "x", "top_p": 0}', "line 2 (id p): top_p must be in (0, 1], got 0"),
    ("top_k -2", b'{"prompt": "x", "top_k": -2}', "top_k must be an integer in [-1, 2147483647]"),
    ("min_p NaN", b'{"prompt": "x", "min_p": NaN}', "min_p must be in [0, 1], got nan"),
    ("repetition_penalty 0", b'{"prompt": "x", "repetition_penalty": 0}',
     "repetition_penalty must be a finite number > 0"),
    ("logit_bias unknown token", b'{"id": "b", "prompt": "x", "logit_bias": {"100000": 1}}',
     "request b: logit_bias: token 100000 is outside the vocabulary"),
    ("temperature inf", b'{"prompt": "x", "temperature": Infinity}', "finite number >= 0, got inf"),
    ("temperature 1e400", b'{"prompt": "x", "temperature": 1e400}', "finite number >= 0, got inf"),
    ("temperature negative", b'{"prompt": "x", "temperature": -0.5}', "finite number >= 0, got -0.5"),
    ("temperature bool", b'{"prompt": "x", "temperature": true}', "temperature must be a finite number >= 0, got True"),
    ("seed negative", b'{"prompt": "x", "seed": -1}', "seed must be an integer in [0, 2^64), got -1"),
    ("seed 2**64", b'{"prompt": "x", "seed": 18446744073709551616}', "seed must be an integer in [0, 2^64)"),
    ("seed float", b'{"prompt": "x", "seed": 1.5}', "seed must be an integer in [0, 2^64), got 1.5"),
    ("huge integer", b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}", "line 2: not valid JSON"),
    ("unknown field", b'{"prompt": "x", "max_token": 3}', 'unknown field "max_token"'),
    ("not json", b"{not json", "line 2: not valid JSON"),
    ("json array", b"[1, 2]", "line 2: expected a JSON object, got an array"),
    ("json string", b'"just a prompt"', "expected a JSON object"),
    ("deep nesting", b"[" * 100_000, "line 2: not valid JSON (nested too deeply)"),
    ("no prompt", b"{}", 'give exactly one of "prompt" or "messages"'),
    ("both prompt and messages", b'{"prompt": "x", "messages": []}', "exactly one of"),
    ("prompt not a string", b'{"prompt": ["x"]}', '"prompt" must be a string, got an array'),
    ("bad message", b'{"messages": [{"role": 1, "content": "x"}]}', 'message 1: "role" must be a string, got 1'),
    ("messages without template", b'{"messages": [{"role": "user", "content": "x"}]}',
     "this model has no chat template"),
    ("prompt over the byte bound", json.dumps({"prompt": "x" * 16385}).encode(), '"prompt" is 16,385 bytes'),
    ("prompt over the context", json.dumps({"id": "long", "prompt": "word " * 300}).encode(),
     "request long: the prompt has"),
    ("line over the cap", b'{"prompt": "' + b"y" * 200_000 + b'"}', "line 2: longer than 102,400 bytes"),
    ("bom not on line 1", b'\xef\xbb\xbf{"prompt": "x"}', "line 2: not valid JSON"),
    ("duplicate id", b'{"id": "good-a", "prompt": "x"}',
     'line 2: duplicate id "good-a" (an earlier request has it; ids must be unique)'),
]


@pytest.mark.parametrize("bad,message", [pytest.param(b, m, id=n) for n, b, m in REQUEST_CASES])
def test_bad_request_line(bad, message, tmp_path, capsys):
    f = tmp_path / "req.jsonl"
    f.write_bytes(_surrounded(bad))
    rc, out, err = _cli(capsys, BASE + ["--prompts-file", str(f)])
    recs = _records(out)
    assert rc == 1
    _assert_one_line(err, message)
    assert len(recs) == 3 and sum("error" in r for r in recs.values()) == 1
    assert all(recs[i]["finish_reason"] in ("stop", "length") for i in ("good-a", "good-b"))


@pytest.mark.parametrize("data", [
    pytest.param(b"\xef\xbb\xbf" + GOOD_A + b"\n" + GOOD_B, id="utf8 bom on line 1"),
    pytest.param(GOOD_A + b"\r\n" + GOOD_B + b"\r\n", id="crlf"),
    pytest.param(b"\n  \n" + GOOD_A + b"\n\n\t\n" + GOOD_B, id="blank lines"),
    pytest.param(GOOD_A + b"\n" + GOOD_B.replace(b"0.7", b"1e-30"), id="tiny temperature is greedy"),
])
def test_acceptable_oddities(data, tmp_path, capsys):
    f = tmp_path / "req.jsonl"
    f.write_bytes(data)
    rc, out, err = _cli(capsys, BASE + ["--prompts-file", str(f)])
    assert rc == 0 and set(_records(out)) == {"good-a", "good-b"} and "error" not in err


def test_binary_file_gives_error_records_and_the_text_lines_still_run(tmp_path, capsys):
    junk = bytes(random.Random(0).randrange(256) for _ in range(3000))
    f = tmp_path / "req.jsonl"
    f.write_bytes(GOOD_A + b"\n" + junk + b"\n" + GOOD_B + b"\n")
    rc, out, err = _cli(capsys, BASE + ["--prompts-file", str(f)])
    recs = _records(out)
    errors = [r["error"] for r in recs.values() if "error" in r]
    assert rc == 1 and "Traceback" not in err and errors and all(e.startswith("line ") for e in errors)
    assert recs["good-a"]["finish_reason"] in ("stop", "length") and "text" in recs["good-b"]


def test_huge_prompt_is_refused_without_tokenizing(tmp_path, capsys, monkeypatch):
    from toolkit.text.tokenizer import Tokenizer
    longest = []
    encode = Tokenizer.encode
    monkeypatch.setattr(Tokenizer, "encode",
                        lambda self, text, **kw: longest.append(len(text)) or encode(self, text, **kw))
    f = tmp_path / "req.jsonl"
    f.write_bytes(_surrounded(json.dumps({"id": "huge", "prompt": "word " * 2_000_000}).encode()))  # 10 MB
    t0 = time.perf_counter()
    rc, out, err = _cli(capsys, BASE + ["--prompts-file", str(f)])
    assert rc == 1 and "longer than 102,400 bytes" in _records(out)["line 2"]["error"]
    assert time.perf_counter() - t0 < 5 and max(longest) < 100  # the 10 MB never reached the tokenizer
    rc, out, err = _cli(capsys, BASE + ["x" * 20_000, "ok"])  # a command-line prompt over the bound, likewise
    recs = _records(out)
    assert rc == 1 and "the prompt is 20,000 bytes" in recs["0"]["error"] and "text" in recs["1"]
    assert max(longest) < 100


def test_command_line_prompt_with_undecodable_byte(capsys):
    rc, out, err = _cli(capsys, BASE + ["--max-tokens", "2", "bad \udcff", "fine"])
    recs = _records(out)
    assert rc == 1 and "not valid Unicode" in recs["0"]["error"] and recs["1"]["finish_reason"] in ("stop", "length")


# -- flags and configuration: exit 2 before anything runs -----------------------------------------------------
FLAG_CASES = [
    (["--seed", "-1"], "argument --seed: seed must be an integer in [0, 2^64), got -1"),
    (["--seed", str(2 ** 64)], "argument --seed: seed must be an integer in [0, 2^64), got 18446744073709551616"),
    (["--seed", "1.5"], "argument --seed: expected an integer, got '1.5'"),
    (["--max-tokens", "-1"], "argument --max-tokens: must be >= 0"),
    (["--max-tokens", "lots"], "argument --max-tokens: expected an integer"),
    (["--max-tokens", "1e3"], "argument --max-tokens: expected an integer"),
    (["--temperature", "nan"], "argument --temperature: temperature must be a finite number >= 0, got nan"),
    (["--temperature", "inf"], "must be a finite number >= 0, got inf"),
    (["--temperature", "1e400"], "must be a finite number >= 0, got inf"),
    (["--temperature", "1e-40"], "argument --temperature: temperature 1e-40 is too small"),
    (["--top-p", "0"], "argument --top-p: top_p must be in (0, 1], got 0.0"),
    (["--top-k", "-2"], "argument --top-k: top_k must be an integer in [-1"),
    (["--min-p", "nan"], "argument --min-p: min_p must be in [0, 1], got nan"),
    (["--repetition-penalty", "-1"], "argument --repetition-penalty: repetition_penalty must be a finite number > 0"),
    (["--temperature", "-0.1"], "must be a finite number >= 0"),
    (["--temperature", "warm"], "argument --temperature: expected a number"),
    (["--max-context", "0"], "argument --max-context: must be >= 2, got 0"),
    (["--max-context", "1"], "argument --max-context: must be >= 2, got 1"),  # the engine's minimum, stated once
    (["--max-context", "x"], "argument --max-context: expected an integer"),
    (["--max-num-seqs", "-3"], "argument --max-num-seqs: must be >= 1"),
    (["--kv-cache-tokens", "9" * 30], "argument --kv-cache-tokens: must be at most 2147483647"),
    (["--max-num-batched-tokens", "9" * 5000], "argument --max-num-batched-tokens: expected an integer"),
    (["--format", "xml"], "argument --format: invalid choice"),
    (["--device", "tpu"], "argument --device: invalid choice"),
    (["--max-context", "100000"], "error: --max-context must be between 2 and 256 for this model, got 100000"),
    (["--max-tokens", "1000"], "error: --max-tokens 1000 exceeds the context of 256 tokens (the model's maximum "
                               "is 256: lower --max-tokens)"),
    (["--max-context", "100", "--max-tokens", "200"], "error: --max-tokens 200 exceeds the context of 100 tokens "
                                                      "(raise --max-context up to 256 or lower --max-tokens)"),
    (["--kv-cache-tokens", "8"], "argument --kv-cache-tokens: must be >= 16, got 8"),
    (["--logit-bias", "99999=1"], "error: --logit-bias 99999=1: token 99999 is outside the vocabulary [0, "),
    (["--max-num-seqs", "64", "--max-num-batched-tokens", "8"], "must be at least --max-num-seqs"),
    (["--prompts-file", "/no/such/file.jsonl"], "error: --prompts-file /no/such/file.jsonl: No such file or directory"),
    (["--prompts-file", "/"], "error: --prompts-file /: Is a directory"),
    (["--logprobs", "2", "--format", "text"], "error: --logprobs needs --format jsonl"),
]


@pytest.mark.parametrize("flags,message", [pytest.param(f, m, id=" ".join(f)[:40]) for f, m in FLAG_CASES])
def test_bad_flag(flags, message, capsys):
    rc, out, err = _cli(capsys, BASE + flags + ["hello"])
    assert rc == 2 and out == ""
    _assert_one_line(err, message)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "2.5"])
def test_bad_blas_threads_names_the_variable(value, monkeypatch, capsys):
    monkeypatch.setenv("TOOLKIT_BLAS_THREADS", value)
    rc, out, err = _cli(capsys, BASE + ["hello"])
    assert rc == 2 and out == ""
    _assert_one_line(err, f"error: TOOLKIT_BLAS_THREADS must be an integer >= 1 (BLAS threads), got {value!r}")


@pytest.mark.parametrize("flags,hint", [
    ([], "(the model's maximum is 256: shorten the prompt)"),  # the context is already the model's whole
    (["--max-context", "64"], "(raise --max-context up to 256 or shorten the prompt)"),
])
def test_prompt_over_the_context_says_whether_the_context_can_grow(flags, hint, capsys):
    rc, out, err = _cli(capsys, BASE + flags + ["--max-tokens", "2", "word " * 300, "fine"])
    recs = _records(out)
    assert rc == 1 and recs["0"]["error"].endswith(hint) and recs["1"]["finish_reason"] in ("stop", "length")


def _unprivileged() -> list:
    """A command prefix under which chmod 000 denies: none for a user; as root, setpriv drops the capabilities
    that let root read anything (the test is skipped where it cannot)."""
    if os.geteuid() != 0:
        return []
    drop = "-dac_override,-dac_read_search"
    prefix = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}"]
    if shutil.which("setpriv") is None or subprocess.run(prefix + ["true"]).returncode != 0:
        pytest.skip("root reads anything, and setpriv cannot drop that here")
    return prefix


@pytest.mark.parametrize("locked,message", [
    ("model.safetensors", "{model}/model.safetensors: cannot be read (Permission denied)"),
    ("tokenizer.json", "cannot load {model}/tokenizer.json: Permission denied"),
    (".", "{model}: permission denied (the model folder cannot be read)"),
])
def test_unreadable_model_names_the_file(locked, message, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURES / "llama", model)
    (model / locked).chmod(0)
    cmd = [*_unprivileged(), sys.executable, "-m", "toolkit", *BASE[:2], str(model), *BASE[3:], "hello"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           timeout=120)
    finally:
        (model / locked).chmod(0o755)
    assert r.returncode == 2 and r.stdout == ""
    _assert_one_line(r.stderr, "error: " + message.format(model=model))


def test_no_prompts_is_a_usage_error(capsys):
    rc, out, err = _cli(capsys, BASE)
    assert rc == 2 and "give at least one prompt or --prompts-file" in err


def test_smallest_context_runs_end_to_end(capsys):
    """--max-context 2 holds one prompt token (BOS, for an empty prompt) and one generated token."""
    rc, out, err = _cli(capsys, BASE + ["--max-context", "2", "", "longer prompt"])
    recs = _records(out)
    assert rc == 1 and recs["0"]["token_ids"] and recs["0"]["finish_reason"] == "length"
    assert "context holds 2" in recs["1"]["error"] and "Traceback" not in err


# -- output: checked before the model loads (a missing model would otherwise be the error) ----------------------
def _output_cases(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "req.jsonl").write_bytes(GOOD_A)
    return [
        (str(tmp_path / "missing" / "out.jsonl"), "No such file or directory"),
        (str(tmp_path), "Is a directory"),
        (str(tmp_path / "a-file" / "out.jsonl"), "Not a directory"),
        (str(tmp_path / "req.jsonl"), "is the --prompts-file"),
    ]


def test_bad_output_paths_fail_before_the_model_loads(tmp_path, capsys):
    for path, message in _output_cases(tmp_path):
        args = ["generate", "--model", str(tmp_path / "no-model"), "--device", "cpu", "--output", path,
                "--prompts-file", str(tmp_path / "req.jsonl")]
        rc, out, err = _cli(capsys, args)
        assert rc == 2 and err.count("\n") == 1 and message in err and "no-model" not in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_output_without_permission(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    rc, out, err = _cli(capsys, BASE + ["--output", str(locked / "out.jsonl"), "hi"])
    assert rc == 2 and "Permission denied" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_is_one_line(capsys):
    rc, out, err = _cli(capsys, BASE + ["--output", "/dev/full", "--max-tokens", "2", "hi", "there"])
    assert rc == 2 and "Traceback" not in err
    _assert_one_line(err, "error: --output /dev/full: No space left on device")


# -- an internal error: one line, finished records kept, the rest aborted, exit 3 -----------------------------
@pytest.mark.parametrize("debug", [False, True])
def test_internal_error(debug, monkeypatch, capsys):
    """A bug after the first record: that record stays, every other request gets an aborted one."""
    from toolkit.cli import records

    def fail(*args):  # the timing summary, written just after the first record
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(records, "summary", fail)
    rc, out, err = _cli(capsys, BASE + ["--max-tokens", "3", "a", "short", "x y z"] + (["--debug"] if debug else []))
    reasons = sorted(r["finish_reason"] for r in _records(out).values())
    assert rc == 3 and reasons[:2] == ["aborted", "aborted"] and reasons[2] in ("stop", "length")
    lines = [line for line in err.splitlines() if line.startswith("internal error:")]
    assert lines == ["internal error: RuntimeError: boom second line (rerun with --debug for the traceback)"]
    assert ("Traceback" in err) == debug


# -- signals and pipes: a real process ------------------------------------------------------------------------
def _spawn(tmp_path):
    lines = [json.dumps({"id": "first", "prompt": "a", "max_tokens": 1})]
    # ignore_eos: each request runs its 250 tokens (the fixture stops "The cat sat" after ~150, in ~40 ms on a fast
    # CPU, and a signal that fell between two requests found none to abort)
    lines += [json.dumps({"id": f"r{i}", "prompt": "The cat sat", "max_tokens": 250, "ignore_eos": True})
              for i in range(30)]
    (tmp_path / "req.jsonl").write_text("\n".join(lines))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "toolkit", "generate", "--model", LLAMA, "--device", "cpu", "--format", "jsonl",
           "--prompts-file", str(tmp_path / "req.jsonl"), "--max-num-seqs", "2"]  # 2: one is always mid-request
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_batch_leaves_valid_jsonl_and_aborted_records(sig, code, tmp_path):
    p = _spawn(tmp_path)
    first = p.stdout.readline()  # one request done; 30 x 250 tokens two at a time are far from done
    time.sleep(0.1)  # into the long requests
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    recs = [json.loads(line) for line in [first, *out.splitlines()]]  # every line is valid JSON
    assert p.returncode == code and b"Traceback" not in err
    # Each request read gets exactly one record; the input is read only a few requests ahead of the engine
    ids = [r["id"] for r in recs]
    assert sorted(ids) == sorted(["first"] + [f"r{i}" for i in range(len(ids) - 1)]) and len(ids) < 10
    aborted = [r for r in recs if r["finish_reason"] == "aborted"]
    assert aborted and recs[0]["finish_reason"] == "length"
    assert all(r["finish_reason"] in ("stop", "length") for r in recs if r not in aborted)
    assert f"interrupted ({signal.Signals(sig).name})".encode() in err
    assert f"the input after request r{len(ids) - 2} was not run".encode() in err


def test_reader_that_leaves_ends_the_run_quietly(tmp_path):
    p = _spawn(tmp_path)  # like `generate ... | head -1`
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=30) == 141 and b"Traceback" not in err and b"Exception ignored" not in err


def test_closed_stdout_is_one_line():
    start_with_fd1_closed = 'exec "$0" "$@" >&-'
    r = subprocess.run(["sh", "-c", start_with_fd1_closed, sys.executable, "-m", "toolkit", *BASE, "hi"],
                       stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert r.returncode == 2 and r.stderr.decode().strip() == "error: stdout is closed (give --output FILE)"
