"""JSONL request parsing: bad lines become error records, good ones keep their fields."""
import io

from toolkit.requests import from_jsonl, from_prompts


def test_lines_and_errors():
    text = "\n".join([
        '{"prompt": "hi", "id": "a", "max_tokens": 3, "temperature": 0.5, "seed": 7}',
        '{"messages": [{"role": "user", "content": "hey"}]}',
        "{broken",
        '{"prompt": "x", "max_tokens": -1}',
        '{"prompt": "x", "messages": []}',
        "",
        '[1, 2]',
        '{"prompt": 5}',
    ])
    reqs = from_jsonl(io.StringIO(text))
    assert len(reqs) == 7
    a = reqs[0]
    assert (a.id, a.prompt, a.max_tokens, a.temperature, a.seed, a.error) == ("a", "hi", 3, 0.5, 7, None)
    assert reqs[1].messages[0]["content"] == "hey" and reqs[1].id == "line 2"
    assert reqs[2].error.startswith("line 3: not valid JSON")
    assert "max_tokens" in reqs[3].error and ">= 0" in reqs[3].error
    assert "exactly one" in reqs[4].error
    assert reqs[5].error == "line 7: expected a JSON object"
    assert '"prompt" must be a string' in reqs[6].error


def test_prompts_get_ids():
    assert [r.id for r in from_prompts(["a", "b"])] == ["0", "1"]
