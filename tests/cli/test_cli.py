"""`python -m toolkit generate`, run in-process on the CPU with fixture models (bench: test_bench_cli.py)."""
import json
import shutil

import pytest
from tests.conftest import FIXTURES

from toolkit.__main__ import main

LLAMA = str(FIXTURES / "llama")
QWEN2 = str(FIXTURES / "qwen2")


def _jsonl(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_jsonl_record_fields(capsys):
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "5", "--format", "jsonl",
               "The cat sat", "on the mat"])
    out, err = capsys.readouterr()
    assert rc == 0
    recs = _jsonl(out)
    assert [r["id"] for r in recs] == ["0", "1"]
    r = recs[0]
    assert r["prompt"] == "The cat sat" and r["prompt_token_ids"][0] == 1  # BOS
    assert r["finish_reason"] in ("length", "stop") and len(r["token_ids"]) <= 5
    assert {"prefill_ms", "prefill_tok_per_s", "decode_ms_per_step", "decode_tok_per_s", "ttft_ms",
            "cached_tokens"} <= set(r["timings"])
    assert "CPU backend (requested)" in err and "tok/s" in err


def test_text_mode_streams_and_summarises(capsys):
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "4", "Hello"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.endswith("\n")
    assert "decode" in err and "ms/step" in err and "GB/s" in err


def test_bad_requests_become_error_records(tmp_path, capsys):
    lines = ['{"id": "ok1", "prompt": "A short one", "max_tokens": 2}',
             "{not json",
             '{"id": "long", "prompt": "' + "word " * 200 + '"}',
             '{"id": "ok2", "prompt": "Another", "max_tokens": 2, "temperature": 0.8, "seed": 3}']
    f = tmp_path / "req.jsonl"
    f.write_text("\n".join(lines))
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--max-context", "64",
               "--prompts-file", str(f), "--format", "jsonl"])
    out, err = capsys.readouterr()
    recs = {r["id"]: r for r in _jsonl(out)}
    assert rc == 1
    assert len(recs["ok1"]["token_ids"]) <= 2 and "text" in recs["ok2"]
    assert recs["line 2"]["error"].startswith("line 2: not valid JSON")
    assert "request long" in recs["long"]["error"] and "context holds 64" in recs["long"]["error"]
    assert err.count("error:") == 2


def test_seeded_sampling_is_reproducible(capsys):
    args = ["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "8", "--temperature", "1.0",
            "--seed", "11", "--format", "jsonl", "Hello"]
    main(args)
    a = _jsonl(capsys.readouterr().out)[0]["token_ids"]
    main(args)
    assert _jsonl(capsys.readouterr().out)[0]["token_ids"] == a


def test_chat_template_applied(capsys):
    rc = main(["generate", "--model", QWEN2, "--device", "cpu", "--max-tokens", "2", "--chat",
               "--format", "jsonl", "Hi there"])
    rec = _jsonl(capsys.readouterr().out)[0]
    assert rc == 0
    from toolkit.text.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(QWEN2)
    assert tok.decode(rec["prompt_token_ids"], skip_special_tokens=False).startswith("<|im_start|>")


@pytest.mark.parametrize("flag,value", [("--max-tokens", "-1"), ("--temperature", "-0.5")])
def test_invalid_values_are_argparse_errors(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", LLAMA, flag, value, "hi"])
    assert e.value.code == 2 and ">= 0" in capsys.readouterr().err


def test_missing_model_is_one_line_exit_2(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--device", "cpu", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and err.startswith("error:") and "Traceback" not in err


def test_missing_tensor_names_file_and_tensor(tmp_path, capsys):
    """A checkpoint without one tensor: the error names the file and the tensor."""
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "m"
    shutil.copytree(LLAMA, model)
    tensors = load_file(str(model / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    assert main(["generate", "--model", str(model), "--device", "cpu", "hi"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: missing tensor 'model.layers.1.mlp.down_proj.weight'" in err


def test_unsupported_model_type(tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(LLAMA, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (model / "config.json").write_text(json.dumps(cfg))
    assert main(["generate", "--model", str(model), "--device", "cpu", "hi"]) == 2
    assert "unsupported model_type 'gpt_neox'" in capsys.readouterr().err


def test_batch_records_follow_finish_order_and_text_keeps_input_order(tmp_path, capsys):
    lines = ['{"id": "long", "prompt": "The cat sat on the mat", "max_tokens": 12}',
             '{"id": "short", "prompt": "Hello", "max_tokens": 1}']
    f = tmp_path / "req.jsonl"
    f.write_text("\n".join(lines))
    assert main(["generate", "--model", LLAMA, "--device", "cpu", "--prompts-file", str(f), "--format", "jsonl"]) == 0
    assert [r["id"] for r in _jsonl(capsys.readouterr().out)] == ["short", "long"]  # as each finishes
    assert main(["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "3", "a b c d e f", "x"]) == 0
    err = capsys.readouterr().err
    assert err.index("[0]") < err.index("[1]")  # text mode: input order


def test_engine_flags(capsys):
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "3", "--max-num-seqs", "2",
               "--max-num-batched-tokens", "4", "--kv-cache-tokens", "64", "--no-prefix-caching",
               "--format", "jsonl", "one two three four five six", "seven", "eight nine"])
    recs = _jsonl(capsys.readouterr().out)
    assert rc == 0 and len(recs) == 3 and all(len(r["token_ids"]) == 3 for r in recs)


def test_top_level_help_version_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("generate", "chat", "bench"):
        assert any(line.split()[:1] == [name] and len(line.split()) > 2 for line in out.splitlines())
    assert "chat      chat with a model: a terminal UI with live timings (--plain, or no terminal: one line per turn)" \
        in out  # what `chat` starts: the UI, with the line-based chat as its fallback
    import toolkit
    assert main(["--version"]) == 0 and capsys.readouterr().out == f"toolkit {toolkit.__version__}\n"
    assert toolkit.__version__ == "0.1.0"  # pyproject.toml's
    assert main(["frobnicate"]) == 2 and capsys.readouterr().err.startswith("error: unknown command 'frobnicate'")
    assert main([]) == 2 and "commands:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["generate"], ["chat"], ["bench"], ["bench", "throughput"], ["bench", "sampler"],
                                  ["bench", "sparse"], ["bench", "suite"]])
def test_every_subcommand_help(argv, capsys):
    """--help prints and exits 0 (argparse %-formats help strings: an option's help saying "%" once crashed it)."""
    with pytest.raises(SystemExit) as e:
        main(argv + ["--help"])
    assert e.value.code == 0 and "--help" in capsys.readouterr().out


def test_version_without_installed_metadata(monkeypatch):
    """A checkout that was never pip-installed reads the version from pyproject.toml."""
    from importlib import metadata

    import toolkit

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert toolkit.__version__ == "0.1.0"


def test_bad_sampling_params_in_jsonl_cost_only_their_request(tmp_path, capsys):
    lines = ['{"id": "ok1", "prompt": "A short one", "max_tokens": 3, "temperature": 0.9, "top_k": 5, "seed": 1}',
             '{"id": "badp", "prompt": "x", "top_p": 1.5}',
             '{"prompt": "y", "logit_bias": {"5": "much"}}',
             '{"id": "vocab", "prompt": "z", "logit_bias": {"99999": -5}}',
             '{"id": "ok2", "prompt": "Another", "max_tokens": 2, "repetition_penalty": 1.3, '
             '"logit_bias": {"7": 2.5}, "stop_token_ids": [3], "logprobs": 2}']
    f = tmp_path / "req.jsonl"
    f.write_text("\n".join(lines))
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--prompts-file", str(f), "--format", "jsonl"])
    out, err = capsys.readouterr()
    recs = {r["id"]: r for r in _jsonl(out)}
    assert rc == 1 and len(recs) == 5 and err.count("error:") == 3
    assert recs["badp"]["error"] == "line 2 (id badp): top_p must be in (0, 1], got 1.5"
    assert recs["line 3"]["error"] == "line 3: logit_bias[5] must be a finite number in [-100, 100], got 'much'"
    vocab = json.loads((FIXTURES / "llama" / "config.json").read_text())["vocab_size"]
    assert recs["vocab"]["error"] == f"request vocab: logit_bias: token 99999 is outside the vocabulary [0, {vocab})"
    ok1, ok2 = recs["ok1"]["params"], recs["ok2"]["params"]
    assert (ok1["temperature"], ok1["top_k"], ok1["seed"], ok1["max_tokens"]) == (0.9, 5, 1, 3)
    assert (ok2["repetition_penalty"], ok2["logit_bias"], ok2["stop_token_ids"]) == (1.3, {"7": 2.5}, [3])
    assert isinstance(ok2["seed"], int) and 0 <= ok2["seed"] < 2 ** 64  # drawn, and recorded
    assert len(recs["ok2"]["token_ids"]) <= 2 and "logprobs" not in recs["ok1"]


def test_records_replay_with_their_params(tmp_path, capsys):
    """A record's params are valid JSONL fields: replaying them gives the same tokens (seed included)."""
    args = ["generate", "--model", LLAMA, "--device", "cpu", "--format", "jsonl"]
    assert main(args + ["--max-tokens", "6", "--temperature", "0.9", "--top-p", "0.8", "--presence-penalty", "0.5",
                        "Hello there"]) == 0
    rec = _jsonl(capsys.readouterr().out)[0]
    f = tmp_path / "replay.jsonl"
    f.write_text(json.dumps({"prompt": "Hello there", **rec["params"]}))
    assert main(args + ["--prompts-file", str(f)]) == 0
    again = _jsonl(capsys.readouterr().out)[0]
    assert again["token_ids"] == rec["token_ids"] and again["params"] == rec["params"]


def test_generation_config_defaults_under_flags_and_jsonl(tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(LLAMA, model)
    (model / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False, "temperature": 0.7, "top_k": 20, "top_p": 0.8}))
    f = tmp_path / "req.jsonl"
    f.write_text('{"id": "j", "prompt": "hi", "top_k": 3}\n{"id": "k", "prompt": "hi"}')
    args = ["generate", "--model", str(model), "--device", "cpu", "--max-tokens", "2", "--format", "jsonl"]
    assert main(args + ["--top-p", "0.5", "--prompts-file", str(f)]) == 0
    recs = {r["id"]: r["params"] for r in _jsonl(capsys.readouterr().out)}
    # do_sample is ignored (vLLM's rule): temperature 0.7 from the file; --top-p over the file; JSONL over both
    assert [recs["j"][k] for k in ("temperature", "top_k", "top_p")] == [0.7, 3, 0.5]
    assert [recs["k"][k] for k in ("temperature", "top_k", "top_p")] == [0.7, 20, 0.5]
    (model / "generation_config.json").write_text('{"top_p": 0}')
    assert main(args + ["hi"]) == 2
    err = capsys.readouterr().err
    assert "generation_config.json: top_p" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv,words", [(["--top-p", "1.5"], "argument --top-p: top_p must be in (0, 1]"),
                                        (["--temperature", "1e-300"], "too small"),
                                        (["--logit-bias", "x=1"], "TOKEN=BIAS"),
                                        (["--min-tokens", "9", "--max-tokens", "4"], "min_tokens (9)")])
def test_bad_sampling_flags_exit_2_before_the_model_loads(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "/nonexistent"] + argv + ["hi"])  # the model is never looked at
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_sampling_flags_and_logprobs_reach_the_record(capsys):
    rc = main(["generate", "--model", LLAMA, "--device", "cpu", "--max-tokens", "4", "--ignore-eos", "--seed", "5",
               "--temperature", "1", "--logprobs", "3", "--bad-words", "the", "--stop", "zzzz", "--no-fast-path",
               "--format", "jsonl", "The cat sat"])
    rec = _jsonl(capsys.readouterr().out)[0]
    p = rec["params"]
    assert rc == 0 and (p["seed"], p["logprobs"], p["ignore_eos"], p["bad_words"], p["stop"]) == \
        (5, 3, True, ["the"], ["zzzz"])
    assert len(rec["logprobs"]) == len(rec["token_ids"]) == 4
    for tok, lp in zip(rec["token_ids"], rec["logprobs"]):
        assert lp["token"] == tok and lp["logprob"] <= 0 and len(lp["top"]) == 3 and lp["rank"] >= 1
