"""Batch requests for `generate`: from command-line prompts or a JSONL file.

Each JSONL line is {"prompt": "..."} or {"messages": [...]}, with optional
"id", "max_tokens", "temperature" and "seed". A line that cannot be used
becomes a `Request` with an `error` set, so the batch reports it and goes on.
"""
import json
from dataclasses import dataclass


@dataclass
class Request:
    id: str
    prompt: str | None = None
    messages: list | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    error: str | None = None  # set when the request is unusable; it is reported, not run


def from_prompts(prompts: list[str]) -> list[Request]:
    return [Request(id=str(i), prompt=p) for i, p in enumerate(prompts)]


def _number(d: dict, key: str, kind, minimum):
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
        raise ValueError(f'"{key}" must be a{"n integer" if kind is int else " number"}, got {v!r}')
    if v < minimum:
        raise ValueError(f'"{key}" must be >= {minimum}, got {v!r}')
    return kind(v)


def parse_line(line: str, lineno: int) -> Request:
    rid = f"line {lineno}"
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        return Request(id=rid, error=f"line {lineno}: not valid JSON ({e.msg} at column {e.colno})")
    if not isinstance(d, dict):
        return Request(id=rid, error=f"line {lineno}: expected a JSON object")
    rid = str(d.get("id", rid))
    try:
        prompt, messages = d.get("prompt"), d.get("messages")
        if (prompt is None) == (messages is None):
            raise ValueError('give exactly one of "prompt" or "messages"')
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError('"prompt" must be a string')
        if messages is not None and not (isinstance(messages, list) and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages) and messages):
            raise ValueError('"messages" must be a non-empty list of {"role": str, "content": str}')
        return Request(id=rid, prompt=prompt, messages=messages,
                       max_tokens=_number(d, "max_tokens", int, 0),
                       temperature=_number(d, "temperature", float, 0.0),
                       seed=_number(d, "seed", int, 0))
    except ValueError as e:
        return Request(id=rid, error=f"line {lineno} (id {rid}): {e}")


def from_jsonl(stream) -> list[Request]:
    """Every non-blank line of `stream` becomes a Request (or an error record)."""
    return [parse_line(line, n) for n, line in enumerate(stream, start=1) if line.strip()]
