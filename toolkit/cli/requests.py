"""The admission boundary of `generate`: every request is parsed and validated here, once, before
it runs; a JSONL stream is parsed line by line as it is read (feed.py runs this on its own thread).

Requests come from command-line prompts or a JSONL file, one JSON object a line:
{"prompt": "..."} or {"messages": [{"role": ..., "content": ...}]}, optionally with "id" and any
SamplingParams field (toolkit/sampler/params.py; README, "JSONL input"), and nothing else. As JSON spells
them, "logit_bias" keys are token ids in strings ({"123": -5.0}) and "stop" may be one string.
A line that cannot be used (or whose "id" an earlier request has) becomes a `Request` with `error`
set (naming its line number and the field), so the batch reports it and goes on; nothing in this
module raises for bad input. The fields a line gives are validated here, together (SamplingParams),
and kept in `Request.params`; the command-line flags and generation_config.json fill in the rest
later (cli/records.py), when the combination is checked once more.

Input is read in binary, line by line, so one line that is not UTF-8 (or a binary file) costs only
its own lines. Sizes are bounded before tokenizing, in proportion to the context:
  * a prompt (or the contents of a conversation) may have at most BYTES_PER_TOKEN UTF-8 bytes per
    context token: real tokenizers average about 4 bytes a token, so a longer prompt could never fit
    the context, and refusing it up front keeps a 10 MB prompt from being tokenized whole;
  * a line may have at most 6 times that (JSON's \\uXXXX escapes take 6 bytes a character) plus a
    little room for the other fields; a longer line is skipped without being parsed.
"""
import dataclasses
import json
from dataclasses import dataclass, field

from toolkit.errors import ToolkitError
from toolkit.sampler.params import SamplingParams

BYTES_PER_TOKEN = 64
PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
FIELDS = ("id", "prompt", "messages") + PARAM_FIELDS
_INT_FIELDS = ("max_tokens", "seed", "top_k", "min_tokens", "logprobs")
MESSAGE_FIELDS = ("role", "content")
UTF8_BOM = b"\xef\xbb\xbf"


class RequestError(ValueError):
    """One request is unusable; it becomes an error record (caught inside this module). `rid` is the
    request's own id once it is known."""

    def __init__(self, message: str, rid: str | None = None):
        super().__init__(message)
        self.rid = rid


@dataclass(frozen=True)
class Limits:
    max_context: int  # tokens

    @property
    def prompt_bytes(self) -> int:
        return BYTES_PER_TOKEN * self.max_context

    @property
    def line_bytes(self) -> int:
        return 6 * self.prompt_bytes + 4096


@dataclass
class Request:
    id: str
    prompt: str | None = None
    messages: list | None = None
    params: dict = field(default_factory=dict)  # the SamplingParams fields the request itself gives
    error: str | None = None  # set when the request is unusable; it is reported, not run


# -- values -------------------------------------------------------------------------------------------
def show(v) -> str:
    """A short, ASCII-only rendering of a user's value for an error message (never the whole value,
    never a lone surrogate that would make the message itself unwritable)."""
    if isinstance(v, str):
        return json.dumps(v[:40]) + ("..." if len(v) > 40 else "")
    if isinstance(v, (list, dict)):
        return "an array" if isinstance(v, list) else "an object"
    text = json.dumps(v) if v is None or isinstance(v, bool) else repr(v)
    return text if len(text) <= 40 else text[:20] + f"... ({len(text)} digits)"


def check_text(s: str, what: str) -> int:
    """The UTF-8 length of `s`; a lone surrogate (JSON's "\\ud800", or an undecodable command-line
    byte) is not text the tokenizer can take."""
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise RequestError(f"{what} is not valid Unicode text (lone surrogate U+{ord(s[e.start]):04X} "
                           f"at character {e.start + 1})") from None


def check_size(nbytes: int, limits: Limits, what: str):
    if nbytes > limits.prompt_bytes:
        raise RequestError(f"{what} is {nbytes:,} bytes; at most {BYTES_PER_TOKEN} bytes per context token are "
                           f"accepted ({limits.prompt_bytes:,} for a context of {limits.max_context} tokens)")


def _sampling(d: dict, limits: Limits) -> dict:
    """The sampling fields a request gives, in SamplingParams' spellings and validated together by it."""
    out = {k: d[k] for k in PARAM_FIELDS if d.get(k) is not None}
    for key in _INT_FIELDS:  # 5.0 is a fine integer in JSON (a fraction, inf or a bool stays, to be refused)
        if isinstance(out.get(key), float) and out[key].is_integer():
            out[key] = int(out[key])
    if "logit_bias" in out:
        v = out["logit_bias"]
        if not isinstance(v, dict):
            raise RequestError(f'"logit_bias" must be an object of token id -> bias, like {{"123": -5.0}}, '
                               f'got {show(v)}')
        for k in v:
            if not (k.isascii() and k.isdigit() and len(k) <= 12):
                raise RequestError(f'"logit_bias": key {show(k)} is not a token id')
        out["logit_bias"] = {int(k): b for k, b in v.items()}
    if not isinstance(out.get("bad_words", []), list):
        raise RequestError(f'"bad_words" must be an array of strings or token-id arrays, got {show(out["bad_words"])}')
    # Validated together (min_tokens <= max_tokens, ...), with the context as max_tokens when the line
    # does not say: the flags' value is only known later, when the combination is checked again.
    try:
        p = SamplingParams(**{"max_tokens": limits.max_context, **out})
    except (ToolkitError, TypeError) as e:
        raise RequestError(str(e)) from None
    if p.max_tokens > limits.max_context:
        raise RequestError(f"max_tokens must be in [0, {limits.max_context}] (at most the context), "
                           f"got {show(p.max_tokens)}")
    for key in ("stop", "bad_words"):
        for i, w in enumerate(getattr(p, key)):
            if isinstance(w, str):
                check_text(w, f'"{key}"[{i}]')
    return out


def _messages(v, limits: Limits) -> list:
    if not isinstance(v, list) or not v:
        raise RequestError('"messages" must be a non-empty array of {"role": ..., "content": ...}')
    total = 0
    for i, m in enumerate(v, start=1):
        if not isinstance(m, dict):
            raise RequestError(f"message {i} must be an object, got {show(m)}")
        extra = [k for k in m if k not in MESSAGE_FIELDS]
        if extra:
            raise RequestError(f"message {i}: unknown field {show(extra[0])} (a message has role and content)")
        for key in MESSAGE_FIELDS:
            if not isinstance(m.get(key), str):
                raise RequestError(f'message {i}: "{key}" must be a string, got {show(m.get(key))}')
            total += check_text(m[key], f'message {i} "{key}"')
        if not m["role"]:
            raise RequestError(f'message {i}: "role" is empty')
    check_size(total, limits, '"messages"')
    return [{"role": m["role"], "content": m["content"]} for m in v]


# -- one request --------------------------------------------------------------------------------------
def from_object(d, rid: str, limits: Limits) -> Request:
    """A parsed JSON value -> Request; raises RequestError (with the best id known so far)."""
    if not isinstance(d, dict):
        raise RequestError(f"expected a JSON object, got {show(d)}")
    own_id = None
    if d.get("id") is not None:
        v = d["id"]
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise RequestError(f'"id" must be a string or an integer, got {show(v)}')
        if isinstance(v, str):
            check_text(v, '"id"')
        rid = own_id = str(v)
    try:
        unknown = [k for k in d if k not in FIELDS]
        if unknown:
            raise RequestError(f"unknown field {show(unknown[0])} (known: {', '.join(FIELDS)})")
        prompt, messages = d.get("prompt"), d.get("messages")
        if (prompt is None) == (messages is None):
            raise RequestError('give exactly one of "prompt" or "messages"')
        if prompt is not None:
            if not isinstance(prompt, str):
                raise RequestError(f'"prompt" must be a string, got {show(prompt)}')
            check_size(check_text(prompt, '"prompt"'), limits, '"prompt"')
        else:
            messages = _messages(messages, limits)
        return Request(id=rid, prompt=prompt, messages=messages, params=_sampling(d, limits))
    except RequestError as e:
        raise RequestError(str(e), own_id) from None  # the request's own id goes with the message


def parse_line(raw: bytes, lineno: int, limits: Limits) -> Request:
    """One JSONL line (bytes, without its newline) -> Request; never raises for bad input."""
    rid = f"line {lineno}"
    try:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            utf16 = lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff")  # a UTF-16 byte-order mark
            hint = " (the file looks like UTF-16: save it as UTF-8)" if utf16 else ""
            raise RequestError(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1}){hint}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise RequestError(f"not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise RequestError("not valid JSON (nested too deeply)") from None
        except ValueError as e:  # e.g. an integer of more than 4,300 digits
            raise RequestError(f"not valid JSON ({e})") from None
        return from_object(d, rid, limits)
    except RequestError as e:
        where = f"line {lineno}" if e.rid is None else f"line {lineno} (id {e.rid})"
        return Request(id=rid if e.rid is None else e.rid, error=f"{where}: {e}")


def read_lines(stream, cap: int):
    """(line number, bytes without the newline, or None when longer than `cap`) for each non-blank
    line of a binary stream. An over-long line is skipped in 1 MiB chunks, never held whole; a UTF-8
    byte-order mark on the first line is dropped."""
    lineno = 0
    while True:
        raw = stream.readline(cap + 2)  # + the newline (and a \r)
        if not raw:
            return
        lineno += 1
        cut_short = len(raw) == cap + 2 and not raw.endswith(b"\n")  # the line goes on
        if lineno == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM):]
        if cut_short or len(raw.rstrip(b"\r\n")) > cap:
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(1 << 20)
            yield lineno, None
            continue
        raw = raw.rstrip(b"\r\n")
        if raw.strip():
            yield lineno, raw


def from_jsonl(stream, limits: Limits, taken_ids=()):
    """Each non-blank line of a binary stream as a Request (or an error record), as it is read. Ids
    stay unique: a line whose id an earlier request (or one of `taken_ids`) has becomes an error
    record, with its line as its id."""
    seen = set(taken_ids)
    for lineno, raw in read_lines(stream, limits.line_bytes):
        if raw is None:
            req = Request(id=f"line {lineno}", error=f"line {lineno}: longer than {limits.line_bytes:,} bytes "
                          f"(a prompt may have {limits.prompt_bytes:,} for a context of {limits.max_context})")
        else:
            req = parse_line(raw, lineno, limits)
        if req.id in seen:
            req = Request(id=f"line {lineno}", error=f"line {lineno}: duplicate id {show(req.id)} (an earlier "
                          "request has it; ids must be unique)")
        seen.add(req.id)
        yield req


def from_prompts(prompts: list[str], limits: Limits) -> list[Request]:
    """Command-line prompts, ids "0", "1", ... (an undecodable byte in argv arrives as a surrogate)."""
    out = []
    for i, p in enumerate(prompts):
        try:
            check_size(check_text(p, "the prompt"), limits, "the prompt")
            out.append(Request(id=str(i), prompt=p))
        except RequestError as e:
            out.append(Request(id=str(i), error=f"request {i}: {e}"))
    return out
