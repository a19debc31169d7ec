"""`generate` with the default model's own sampling settings (generation_config.json: T 0.8, top-k 40, top-p 0.95,
repetition penalty 1.1) on the CPU: the same seed gives the same tokens with --no-fast-path and without, and each
JSONL record's timings say which sampler path ran and the FP32 bytes it materialised."""
import json

import pytest

from toolkit.__main__ import main
from toolkit.engine.build import default_model

MODEL = default_model()


@pytest.mark.skipif(MODEL is None, reason="no default model in weights/")
def test_default_settings_same_tokens_fast_and_slow_and_records_say_which(capsys):
    runs = {}
    for flags in ([], ["--no-fast-path"]):
        rc = main(["generate", "--device", "cpu", "--format", "jsonl", "--seed", "7", "--max-tokens", "12", *flags,
                   "Once upon a time", "The dog"])
        assert rc == 0
        runs[bool(flags)] = sorted((json.loads(line) for line in capsys.readouterr().out.splitlines() if line),
                                   key=lambda r: r["id"])
    fast, slow = runs[False], runs[True]
    assert [r["params"]["top_k"] for r in fast] == [40, 40]  # the model's settings, which need processing
    assert [r["token_ids"] for r in fast] == [r["token_ids"] for r in slow]
    vocab = json.load(open(f"{MODEL}/config.json"))["vocab_size"]
    for f, s in zip(fast, slow):
        assert (f["timings"]["sampler_path"], f["timings"]["sampler_fp32_bytes"]) == ("fast", 0)
        assert (s["timings"]["sampler_path"], s["timings"]["sampler_fp32_bytes"]) == \
            ("slow", 4 * vocab * len(s["token_ids"]))
