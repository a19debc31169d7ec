"""benchmarks/repetition.py: distinct-n by hand, and a small run on a fixture model."""
import pytest
from tests.conftest import FIXTURES

from benchmarks.repetition import distinct_n, main, parse_setting
from toolkit.errors import ToolkitError


def test_distinct_n_by_hand():
    assert distinct_n([1, 2, 1, 2, 1, 2], 2) == 2 / 5  # bigrams 12 21 12 21 12: two distinct of five
    assert distinct_n([1, 2, 1, 2, 1, 2], 3) == 2 / 4
    assert distinct_n([1, 2, 3, 4], 2) == 1.0 and distinct_n([5, 5, 5, 5], 3) == 1 / 2
    assert distinct_n([1], 2) == 1.0


def test_parse_setting():
    assert parse_setting("temperature=0.8, top_k=40,top_p=0.95") == {"temperature": 0.8, "top_k": 40, "top_p": 0.95}
    with pytest.raises(ToolkitError, match="top_p"):
        parse_setting("top_p=2")


def test_small_run_prints_a_table(capsys):
    assert main(["--model", str(FIXTURES / "llama3"), "--prompts", "2", "--tokens", "6",
                 "--try", "temperature=1.0,top_k=5"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| greedy", "| generation_config.json: temperature 0.6, top_p 0.9",
                                                 "| temperature 1, top_k 5"]
    for r in rows:
        d2, d3, ppl = (float(x) for x in r.split(" | ")[1:4])
        assert 0 < d2 <= 1 and 0 < d3 <= 1 and ppl >= 1
