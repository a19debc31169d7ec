"""The admission boundary (toolkit/requests.py): bad lines become error records, good ones keep their
fields, and no input at all makes the parser raise (property tests with hypothesis)."""
import io
import json

from hypothesis import HealthCheck, given, settings, strategies as st

from toolkit.cli.requests import FIELDS, Limits, Request, from_jsonl, from_object, from_prompts, parse_line, \
    RequestError

LIMITS = Limits(max_context=256)  # prompts up to 16,384 bytes, lines up to 6x that + 4,096


def _parse(*lines: str | bytes) -> list[Request]:
    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines)
    return list(from_jsonl(io.BytesIO(data), LIMITS))


def test_lines_and_errors():
    reqs = _parse(
        '{"prompt": "hi", "id": "a", "max_tokens": 3, "temperature": 0.5, "seed": 7}',
        '{"messages": [{"role": "user", "content": "hey"}]}',
        "{broken",
        '{"prompt": "x", "max_tokens": -1}',
        '{"prompt": "x", "messages": []}',
        "",
        '[1, 2]',
        '{"prompt": 5}',
    )
    assert len(reqs) == 7
    a = reqs[0]
    assert (a.id, a.prompt, a.params, a.error) == ("a", "hi", {"max_tokens": 3, "temperature": 0.5, "seed": 7}, None)
    assert reqs[1].messages[0]["content"] == "hey" and reqs[1].id == "line 2"
    assert reqs[2].error.startswith("line 3: not valid JSON")
    assert reqs[3].error == "line 4: max_tokens must be an integer >= 0, got -1"
    assert "exactly one" in reqs[4].error
    assert reqs[5].error == "line 7: expected a JSON object, got an array"
    assert '"prompt" must be a string' in reqs[6].error


def test_encoding_bom_and_line_numbers():
    reqs = _parse(b'\xef\xbb\xbf{"prompt": "bom"}', b'{"prompt": "caf\xe9"}', b"\x00\x01\x02\xff",
                  b'\xef\xbb\xbf{"prompt": "late bom"}', '{"prompt": "\\ud800"}', b'{"prompt": "ok"}\r')
    assert reqs[0].prompt == "bom" and reqs[0].error is None  # a BOM on the first line is dropped
    assert reqs[1].error == "line 2: not valid UTF-8 (byte 0xe9 at byte 16)"
    assert reqs[2].error.startswith("line 3: not valid UTF-8")
    assert reqs[3].error.startswith("line 4: not valid JSON")  # a BOM anywhere else is an error
    assert "lone surrogate U+D800" in reqs[4].error and reqs[4].id == "line 5"
    assert reqs[5].prompt == "ok"
    utf16 = next(from_jsonl(io.BytesIO('{"prompt": "x"}\n'.encode("utf-16")), LIMITS))
    assert "looks like UTF-16" in utf16.error


def test_duplicate_ids_become_error_records_named_by_their_line():
    lines = b'{"id": "a", "prompt": "x"}\n{"id": 7, "prompt": "y"}\n{"id": "a", "prompt": "z"}\n' \
            b'{"id": "0", "prompt": "w"}'
    reqs = list(from_jsonl(io.BytesIO(lines), LIMITS, taken_ids=["0"]))  # "0": a command-line prompt's
    assert [r.id for r in reqs] == ["a", "7", "line 3", "line 4"] and reqs[0].error is reqs[1].error is None
    assert reqs[2].error == 'line 3: duplicate id "a" (an earlier request has it; ids must be unique)'
    assert reqs[3].error.startswith('line 4: duplicate id "0"')



def test_numbers_are_checked_for_type_range_and_finiteness():
    cases = {
        '"max_tokens": 1e400': "max_tokens must be an integer >= 0, got inf",
        '"max_tokens": 2.5': "must be an integer",
        '"max_tokens": 257': "in [0, 256] (at most the context)",
        '"max_tokens": true': "max_tokens must be an integer >= 0, got True",
        '"max_tokens": "5"': "max_tokens must be an integer >= 0, got '5'",
        '"seed": 18446744073709551616': "in [0, 2^64)",
        '"seed": -1': "in [0, 2^64)",
        '"temperature": NaN': "finite number >= 0, got nan",
        '"temperature": -Infinity': "finite number >= 0",
        '"temperature": 1e400': "finite number >= 0, got inf",
        '"temperature": ' + "9" * 400: "finite number >= 0",  # an int beyond the float range
        '"temperature": false': "temperature must be a finite number >= 0, got False",
        '"id": [1]': '"id" must be a string or an integer',
        '"id": "\\udfff"': "lone surrogate U+DFFF",
        '"extra": 1': 'unknown field "extra"',
    }
    for field, message in cases.items():
        req = _parse('{"prompt": "x", ' + field + "}")[0]
        assert req.error and message in req.error, (field, req.error)
    ok = _parse('{"prompt": "x", "max_tokens": 5.0, "seed": 18446744073709551615, "temperature": 0, "id": 7}')[0]
    assert (ok.error, ok.params, ok.id) == (None, {"max_tokens": 5, "seed": 2 ** 64 - 1, "temperature": 0.0}, "7")
    assert "not valid JSON" in _parse('{"prompt": "x", "seed": ' + "1" * 5000 + "}")[0].error  # Python's limit
    assert "nested too deeply" in _parse("[" * 100_000)[0].error


def test_sampling_fields():
    line = ('{"prompt": "x", "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1, '
            '"frequency_penalty": -0.5, "presence_penalty": 2, "logit_bias": {"123": -5.0, "7": 1}, '
            '"bad_words": ["dog", [5, 6]], "stop": "###", "stop_token_ids": [2], "ignore_eos": true, '
            '"min_tokens": 3, "logprobs": 5, "temperature": 0.8}')
    req = _parse(line)[0]
    assert req.error is None
    assert req.params == {"top_k": 40, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1,
                          "frequency_penalty": -0.5, "presence_penalty": 2.0, "logit_bias": {123: -5.0, 7: 1},
                          "bad_words": ["dog", [5, 6]], "stop": "###", "stop_token_ids": [2], "ignore_eos": True,
                          "min_tokens": 3, "logprobs": 5, "temperature": 0.8}
    assert _parse('{"prompt": "x", "min_tokens": 200}')[0].error is None  # max_tokens may come from the flags


def test_bad_sampling_fields_name_line_and_field():
    cases = {
        '"top_p": 0': "top_p must be in (0, 1], got 0",
        '"top_p": 1.5': "top_p must be in (0, 1]",
        '"top_k": -2': "top_k must be an integer in [-1",
        '"top_k": 2.5': "top_k must be an integer in [-1, 2147483647] (0 or -1 = off), got 2.5",
        '"min_p": 1.01': "min_p must be in [0, 1]",
        '"repetition_penalty": 0': "repetition_penalty must be a finite number > 0",
        '"repetition_penalty": NaN': "repetition_penalty must be a finite number > 0, got nan",
        '"frequency_penalty": 3': "frequency_penalty must be a finite number in [-2, 2]",
        '"presence_penalty": Infinity': "presence_penalty must be a finite number in [-2, 2], got inf",
        '"temperature": 1e-45': "temperature 1e-45 is too small",
        '"logit_bias": [[1, 2]]': '"logit_bias" must be an object',
        '"logit_bias": {"abc": 1}': '"logit_bias": key "abc" is not a token id',
        '"logit_bias": {"-1": 1}': '"logit_bias": key "-1" is not a token id',
        '"logit_bias": {"5": "x"}': "logit_bias[5] must be a finite number in [-100, 100], got 'x'",
        '"logit_bias": {"5": 101}': "logit_bias[5] must be a finite number in [-100, 100]",
        '"bad_words": "dog"': '"bad_words" must be an array',
        '"bad_words": [[1, "a"]]': "bad_words[0] token id must be an integer >= 0, got 'a'",
        '"bad_words": [""]': "bad_words[0] must be a non-empty string",
        '"bad_words": [{}]': "bad_words[0] must be a non-empty string",
        '"stop": 5': "stop must be a list or one string, got 5",
        '"stop": ["ok", ""]': "stop[1] must be a non-empty string",
        '"stop": ["\\ud800"]': '"stop"[0] is not valid Unicode text',
        '"stop_token_ids": [1.5]': "stop_token_ids entry must be an integer >= 0, got 1.5",
        '"stop_token_ids": ' + json.dumps(list(range(129))): "stop_token_ids has 129 entries; at most 128",
        '"ignore_eos": 1': "ignore_eos must be true or false, got 1",
        '"min_tokens": 5, "max_tokens": 3': "min_tokens (5) must be at most max_tokens (3)",
        '"min_tokens": 300': "min_tokens (300) must be at most max_tokens (256)",  # the context
        '"logprobs": 21': "logprobs must be an integer in [0, 20]",
        '"logprobs": true': "logprobs must be an integer in [0, 20], got True",
    }
    for field, message in cases.items():
        req = _parse('{"id": "r", "prompt": "x", ' + field + "}")[0]
        assert req.error and req.error.startswith("line 1 (id r): ") and message in req.error, (field, req.error)


def test_messages_are_checked():
    bad = {'"messages": "hi"': "non-empty array", '"messages": [1]': "message 1 must be an object",
           '"messages": [{"role": "user"}]': 'message 1: "content" must be a string',
           '"messages": [{"role": "", "content": "x"}]': '"role" is empty',
           '"messages": [{"role": "user", "content": "x", "name": "n"}]': 'unknown field "name"',
           '"messages": [{"role": "user", "content": "\\ud83d"}]': "lone surrogate"}
    for field, message in bad.items():
        req = _parse("{" + field + "}")[0]
        assert req.error and message in req.error, (field, req.error)


def test_sizes_are_bounded_before_tokenizing():
    big = _parse(json.dumps({"id": "big", "prompt": "x" * (LIMITS.prompt_bytes + 1)}))[0]
    assert big.id == "big" and "16,385 bytes" in big.error and "64 bytes per context token" in big.error
    assert _parse(json.dumps({"prompt": "é" * (LIMITS.prompt_bytes // 2)}))[0].error is None  # bytes, not chars
    long_line = b'{"prompt": "' + b"y" * (LIMITS.line_bytes + 10) + b'"}'
    reqs = _parse(long_line, '{"prompt": "after"}')
    assert reqs[0].error.startswith("line 1: longer than") and reqs[1].prompt == "after"  # skipped, not parsed
    convo = [{"role": "user", "content": "z" * 9000}, {"role": "assistant", "content": "z" * 9000}]
    assert '"messages" is 18,013 bytes' in _parse(json.dumps({"messages": convo}))[0].error


def test_prompts_get_ids():
    reqs = from_prompts(["a", "b", "bad \udcff byte", "x" * 20000], LIMITS)
    assert [r.id for r in reqs] == ["0", "1", "2", "3"]
    assert reqs[2].error.startswith("request 2: the prompt is not valid Unicode") and "bytes" in reqs[3].error


# -- properties: whatever comes in, the parser returns Requests and raises nothing ---------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
field_dicts = st.dictionaries(st.sampled_from(FIELDS + ("role", "x")), json_values, max_size=6)
messages = st.lists(st.dictionaries(st.sampled_from(("role", "content", "x")), json_values, max_size=3), max_size=3)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _well_formed(req: Request):
    assert isinstance(req, Request) and isinstance(req.id, str)
    if req.error is None:
        assert (req.prompt is None) != (req.messages is None)
    else:
        req.error.encode("utf-8")  # the message itself is always writable
        req.id.encode("utf-8")


@FAST
@given(json_values | field_dicts | st.fixed_dictionaries({"messages": messages}, optional={"id": json_values}))
def test_any_json_value_gives_a_request_or_an_error_record(value):
    try:
        text = json.dumps(value)  # ensure_ascii: lone surrogates arrive as \\udXXX escapes
    except ValueError:  # NaN etc. are fine in Python's json; a circular value cannot happen here
        return
    _well_formed(parse_line(text.encode(), 1, LIMITS))
    try:
        _well_formed(from_object(value, "line 1", LIMITS))
    except RequestError as e:
        str(e).encode("utf-8")


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_give_requests_or_error_records(data):
    for req in from_jsonl(io.BytesIO(data), Limits(max_context=2)):
        _well_formed(req)


@FAST
@given(st.lists(st.text(st.characters(codec=None), max_size=40), max_size=4))
def test_any_command_line_prompts(prompts):
    for req in from_prompts(prompts, Limits(max_context=4)):
        _well_formed(req)
