"""Chat templates: turn a list of {"role", "content"} messages into the prompt text a model was trained on.

Hugging Face ships the template as Jinja2 source, and the same source renders differently under different
Jinja settings (whitespace control especially). So the environment below copies transformers'
`_compile_jinja_template` setting for setting; the rendered text is then encoded with
add_special_tokens=False, because the template writes BOS itself when the model wants one.

Only the template writes control tokens: `encode` reads a special-token string inside a message's content
("<|im_start|>" pasted by a user) as the text it is, so no message can forge a turn (transformers and vLLM
parse it as the token; `special_in_content=True` does too).
"""
from __future__ import annotations

import json
import re
import secrets
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from toolkit.errors import ToolkitError
from toolkit.text.tokenizer import read_json, read_special_tokens


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers uses it to mark assistant tokens for training
    masks. For inference it must simply render its body, but without the tag the template would not parse."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message):
    # Templates call this to reject conversations they cannot format (e.g. "roles must alternate").
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson HTML-escapes <, >, & and ' -- wrong inside a prompt -- so transformers replaces it.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _validate(messages) -> None:
    if not isinstance(messages, (list, tuple)):
        raise ToolkitError(f"chat messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ToolkitError(f"chat message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                got = "missing" if key not in m else type(m[key]).__name__
                raise ToolkitError(f"chat message {i}: '{key}' must be a string ({got})")


def _pick_template(source, where: str) -> str:
    """tokenizer_config's chat_template is a string, or a list of named templates ("default", "tool_use", ...)."""
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ToolkitError(f"{where}: chat_template list has no 'default' template (has {sorted(map(str, named))})")
    raise ToolkitError(f"{where}: chat_template must be a string or a list, got {type(source).__name__}")


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to ({{ bos_token }} etc.)."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None, name: str = "chat template"):
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.name = name  # where it came from, for error messages
        # Templates come from model repos, i.e. untrusted code: the immutable sandbox blocks attribute tricks and
        # in-place mutation of our message lists.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        # strftime_now: Llama 3.1+ templates print today's date in the system prompt.
        env.globals.update(raise_exception=_raise_exception,
                           strftime_now=lambda format: datetime.now().strftime(format))
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ToolkitError(f"{name}: template syntax error on line {e.lineno}: {e.message}") from None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ChatTemplate | None":
        """The folder's template, or None when it has none (base models: prompt with plain text instead).

        Newer HF repos keep it in chat_template.jinja, older ones in tokenizer_config.json; the .jinja file wins,
        as in transformers.
        """
        d = Path(model_dir)
        jinja_file = d / "chat_template.jinja"
        special = read_special_tokens(d)
        if jinja_file.is_file():
            try:
                source = jinja_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ToolkitError(f"cannot read {jinja_file}: {e}") from None
            return cls(source, special, name=str(jinja_file))
        config = read_json(d / "tokenizer_config.json")
        if config.get("chat_template") is None:
            return None
        where = str(d / "tokenizer_config.json")
        return cls(_pick_template(config["chat_template"], where), special, name=where)

    def render(self, messages, add_generation_prompt: bool = True, **extra) -> str:
        """Prompt text for `messages`; `extra` reaches the template as variables (e.g. enable_thinking=False).

        Variables as transformers passes them: messages, tools=None, documents=None, add_generation_prompt, the
        named special tokens; `extra` overrides any of them.
        """
        _validate(messages)
        variables = {"tools": None, "documents": None, **self.special_tokens, **extra}
        # Copies: a template must not see (or keep) the caller's own dicts.
        msgs = [dict(m) for m in messages]
        try:
            return self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            # raise_exception() messages are written for users ("Conversation roles must alternate ..."): pass
            # them through as they are; other template failures get the template's name for context.
            if type(e) is jinja2.TemplateError:
                raise ToolkitError(f"chat template: {e.message or 'rejected the conversation'}") from None
            raise ToolkitError(f"{self.name}: {type(e).__name__}: {e.message or e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
            # Python errors raised by template code (e.g. `content + 1`): the template and our messages disagree.
            raise ToolkitError(f"{self.name}: {type(e).__name__}: {e}") from None

    def encode(self, messages, tokenizer, special_in_content: bool = False, add_generation_prompt: bool = True,
               **extra) -> list[int]:
        """Prompt ids for `messages` (toolkit/text/tokenizer.py Tokenizer): the rendered text, in which special
        tokens come from the template only, unless special_in_content (the raw text's tokens).

        Each special string in a content is swapped for a unique marker before rendering, so the rendered text
        says which of its special strings are content; content the template edits (trim, split) keeps them."""
        text = self.render(messages, add_generation_prompt, **extra)
        find = tokenizer.special_pattern
        if special_in_content or find is None or not any(find.search(m["content"]) for m in messages):
            return tokenizer.encode(text, add_special_tokens=False)
        nonce, found = secrets.token_hex(8), []

        def mark(m):
            found.append(m.group())
            return f"\ue000{nonce}.{len(found) - 1}\ue001"

        marked = self.render([{**m, "content": find.sub(mark, m["content"])} for m in messages],
                             add_generation_prompt, **extra)
        # re.split with a group: template text and content text alternate with marker numbers.
        parts = re.split(f"\ue000{nonce}\\.(\\d+)\ue001", marked)
        pieces = [(p, True) if i % 2 == 0 else (found[int(p)], False) for i, p in enumerate(parts)]
        if "".join(p for p, _ in pieces) != text:  # the template cut through a marker
            raise ToolkitError(f"{self.name}: cannot tell the template's special tokens from those in the message "
                               "content (--allow-special-in-content reads them all as tokens)")
        return tokenizer.encode_pieces(pieces)

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r}, {len(self.source)} chars)"
