"""Fuzzing the loader: damaged model files end in one `error:` line or a load, never a traceback.

Each case copies nothing: it rewrites one file of a fixture copy (a random truncation, a few random byte or bit
flips, or for config.json a field set to a random JSON value), builds the engine the way the CLI does, and puts
the file back. Allowed outcomes: a ToolkitError with a one-line message, or an engine (flipped weight bytes load;
NaN/inf ones add at most one `warning:` line on stderr). Seeded, so a failure names a case that reruns the same;
about 1,000 cases in a few seconds.
"""
import json
import random
import shutil
import struct

import pytest

from tests.conftest import FIXTURES
from toolkit.engine.build import build_engine
from toolkit.errors import ToolkitError

CASES = 120  # per (fixture, file)
ODD_VALUES = [None, -1, 0, 1, 2.5, 1e308, 10**20, float("nan"), float("-inf"), True, "", "silu", "llama", [], [2],
              {}, {"rope_type": "llama3"}, {"rope_type": "yarn", "factor": 2.0}]


def _header_end(data: bytes) -> int:
    """Where a safetensors file's JSON header ends (its first 8 bytes give the header length)."""
    return 8 + struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else len(data)


def _damage(data: bytes, rng: random.Random, header: int) -> tuple[str, bytes]:
    """A random truncation or 1-4 byte/bit flips, half of them aimed at the first `header` bytes."""
    where = lambda: rng.randrange(header) if rng.random() < 0.5 else rng.randrange(len(data))
    if rng.random() < 0.3:
        cut = where()
        return f"truncate at {cut}", data[:cut]
    out, done = bytearray(data), []
    for _ in range(rng.randint(1, 4)):
        i = where()
        out[i] = out[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        done.append(f"{i}:{data[i]:#04x}->{out[i]:#04x}")
    return "set " + " ".join(done), bytes(out)


def _odd_field(text: bytes, rng: random.Random) -> tuple[str, bytes]:
    config = json.loads(text)
    key = rng.choice(sorted(config))
    config[key] = rng.choice(ODD_VALUES)
    return f"{key} = {config[key]!r}", json.dumps(config).encode()


def _load(folder, case: str, capsys):
    try:
        build_engine(folder, device="cpu", warmup=False)
        outcome = "loaded"
    except ToolkitError as e:
        assert str(e) and "\n" not in str(e), f"{case}: error message is not one line: {e!r}"
        outcome = "refused"
    except Exception as e:
        raise AssertionError(f"{case}: {type(e).__name__} instead of a ToolkitError: {e}") from e
    err = capsys.readouterr().err.splitlines()
    assert len(err) <= 1 and all(line.startswith("warning: ") for line in err), f"{case}: stderr {err}"
    return outcome


@pytest.mark.filterwarnings("error")  # a Python warning on stderr (overflow, ...) is as unwelcome as a traceback
@pytest.mark.parametrize("fixture, name", [("llama", "model.safetensors"), ("llama", "config.json"),
                                           ("qwen2", "model.safetensors"), ("qwen2", "config.json"),
                                           ("mistral", "model-00002-of-00002.safetensors"),
                                           ("mistral", "model.safetensors.index.json")])
def test_damaged_files_never_give_a_traceback(tmp_path, capsys, fixture, name):
    folder = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, folder)
    original = (folder / name).read_bytes()
    header = _header_end(original) if name.endswith(".safetensors") else len(original)
    rng = random.Random(f"{fixture}/{name}")
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(CASES):
        if name == "config.json" and i % 3 == 0:
            what, damaged = _odd_field(original, rng)
        else:
            what, damaged = _damage(original, rng, header)
        (folder / name).write_bytes(damaged)
        outcomes[_load(folder, f"{fixture}/{name} case {i}: {what}", capsys)] += 1
    (folder / name).write_bytes(original)
    assert _load(folder, f"{fixture} undamaged", capsys) == "loaded"
    assert outcomes["refused"] > CASES // 4, outcomes  # the damage is real, not all in ignored bytes
