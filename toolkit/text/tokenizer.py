"""Text <-> token ids, behaving like Hugging Face's fast tokenizer for the same model folder.

The heavy lifting (normalisation, pre-tokenisation, BPE merges, byte fallback, decoders) is done by the
`tokenizers` package from the folder's `tokenizer.json`. What this file adds is what transformers layers on
top: which special token ids exist (BOS/EOS/PAD) and when BOS/EOS are added around the text.

Two families matter in practice:
- byte-level BPE (Qwen, Llama 3): bytes mapped to printable chars, `ByteLevel` decoder. Qwen adds no BOS;
  Llama 3's tokenizer.json post-processor adds <|begin_of_text|>.
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral): `▁` marks word starts, rare characters are
  spelled as <0xNN> byte tokens, and tokenizer_config.json says `add_bos_token: true`.
"""
from __future__ import annotations

import functools
import json
import re
import secrets
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as _HFTokenizer

from toolkit.errors import ToolkitError

# The named special tokens transformers passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# How SentencePiece byte fallback spells a raw byte: "<0x0A>".
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def read_json(path: Path) -> dict:
    """Parse a JSON object file; a missing file reads as {}. Errors name the file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ToolkitError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ToolkitError(f"{path} does not hold a JSON object")
    return data


def named_tokens(config: dict) -> dict[str, str]:
    """The named special tokens a config sets, as strings. Unset tokens are left out rather than mapped to None,
    so a chat template sees them as undefined (renders "") exactly as under transformers."""
    # An entry is either "<s>" or an AddedToken dict {"content": "<s>", "lstrip": ...}.
    values = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
    values = {name: v.get("content") if isinstance(v, dict) else v for name, v in values.items()}
    return {name: v for name, v in values.items() if isinstance(v, str)}


def read_special_tokens(model_dir: Path) -> dict[str, str]:
    """Named special tokens as strings, the way transformers' `special_tokens_map` shows them:
    tokenizer_config.json wins over the older special_tokens_map.json."""
    return named_tokens({**read_json(model_dir / "special_tokens_map.json"),
                         **read_json(model_dir / "tokenizer_config.json")})


def _id_list(value) -> list[int]:
    """generation_config/config eos_token_id may be an int, a list of ints, or null."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


class Tokenizer:
    """A model's tokenizer: `encode`, `decode`, and the special token ids generation needs."""

    def __init__(self, backend: _HFTokenizer, tokenizer_config: dict | None = None,
                 generation_config: dict | None = None, model_config: dict | None = None,
                 special_tokens: dict[str, str] | None = None):
        self._tok = backend
        tc = tokenizer_config or {}
        gc = generation_config or {}
        mc = model_config or {}
        # A bare __init__ (tests, no folder) still gets tokenizer_config's named tokens where none are given.
        self.special_tokens: dict[str, str] = {**named_tokens(tc), **(special_tokens or {})}

        # tokenizer_config decides when it names the token at all (Qwen says bos_token: null, and HF's
        # tokenizer.bos_token_id is then None even though config.json has a bos_token_id).
        bos_text = self.special_tokens.get("bos_token")  # also from special_tokens_map.json
        if "bos_token" in tc or bos_text is not None:
            self.bos_id: int | None = None if bos_text is None else self._tok.token_to_id(bos_text)
        else:
            self.bos_id = next(iter(_id_list(gc.get("bos_token_id")) or _id_list(mc.get("bos_token_id"))), None)
        # Generation stops on any of these: instruct models list several (Llama 3: <|end_of_text|>, <|eom_id|>,
        # <|eot_id|>; Qwen: <|im_end|>, <|endoftext|>). config.json only speaks when generation_config doesn't.
        eos_text = self.special_tokens.get("eos_token")
        self.eos_id: int | None = None if eos_text is None else self._tok.token_to_id(eos_text)
        eos = set(_id_list(gc.get("eos_token_id")) or _id_list(mc.get("eos_token_id")))
        self.eos_ids: frozenset[int] = frozenset(eos if self.eos_id is None else eos | {self.eos_id})
        if self.eos_id is None and self.eos_ids:
            self.eos_id = min(self.eos_ids)

        # What tokenizer.json's post-processor adds by itself (Llama 3's adds <|begin_of_text|>, Qwen's nothing).
        bare = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        post_bos = self.bos_id is not None and full[:1] == [self.bos_id] and bare[:1] != [self.bos_id]
        post_eos = self.eos_id is not None and full[-1:] == [self.eos_id] and bare[-1:] != [self.eos_id]
        # add_bos_token/add_eos_token from tokenizer_config add what the post-processor lacks (transformers v4's
        # LlamaTokenizerFast rebuilt its post-processor from them). A false flag removes nothing: v5 ignores the
        # flags whenever tokenizer.json exists. Real Llama 2/Mistral folders say add_bos_token and their
        # post-processor adds <s> as well, so every version agrees on them.
        self._flag_bos = bool(tc.get("add_bos_token")) and self.bos_id is not None and not post_bos
        self._flag_eos = bool(tc.get("add_eos_token")) and self.eos_id is not None and not post_eos

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "Tokenizer":
        """Load from a Hugging Face model folder (tokenizer.json required; the config files are optional)."""
        d = Path(model_dir)
        path = d / "tokenizer.json"
        if not path.is_file():
            hint = " (only tokenizer.model found: SentencePiece-only folders are not supported)" \
                if (d / "tokenizer.model").is_file() else ""
            raise ToolkitError(f"tokenizer.json not found in {d}{hint}")
        try:
            backend = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception with a serde message
            raise ToolkitError(f"cannot load {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                from None
        return cls(backend, read_json(d / "tokenizer_config.json"), read_json(d / "generation_config.json"),
                   read_json(d / "config.json"), read_special_tokens(d))

    # --- text <-> ids -------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; with add_special_tokens, BOS/EOS exactly as HF's fast tokenizer adds them
        (a chat template writes BOS into its text itself: encode that with add_special_tokens=False).
        A text that is not a str is the `tokenizers` package's TypeError."""
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._flag_bos:
            ids.insert(0, self.bos_id)
        if add_special_tokens and self._flag_eos:
            ids.append(self.eos_id)
        return ids

    def encode_pieces(self, pieces) -> list[int]:
        """Token ids for the concatenated `pieces`, [(text, parse_special)], with add_special_tokens=False: where
        parse_special is false, special-token strings are ordinary text (a chat message's content, in which a
        typed "<|im_start|>" must not open a turn); elsewhere they are their tokens (the chat template's).

        One encode of the whole text on `_twin`, so the text is split and normalised exactly as `encode` does:
        the specials to parse become their twins first, and the twin ids map back."""
        pattern = self.special_pattern
        if pattern is None:
            return self.encode("".join(text for text, _ in pieces), add_special_tokens=False)
        twin, twins, ids = self._twin
        text = "".join(pattern.sub(lambda m: twins[m.group()], t) if parse else t for t, parse in pieces)
        return [ids.get(i, i) for i in twin.encode(text, add_special_tokens=False).ids]

    @functools.cached_property
    def special_pattern(self) -> re.Pattern | None:
        """Matches any special token's string (longest first, as the tokenizer matches), or None if none."""
        texts = sorted({t.content for t in self.specials.values()}, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    @functools.cached_property
    def _twin(self):
        """(a copy of the backend, special string -> its twin's string, twin id -> special id). Each special token
        gets a twin: a non-special added token with the same matching flags under an unguessable private-use
        name. With encode_special_tokens set, the copy reads special strings as text but still splits at twins."""
        twin = _HFTokenizer.from_str(self._tok.to_str())
        nonce = secrets.token_hex(8)
        names = {t.content: f"\ue000{nonce}.{i}\ue001" for i, t in self.specials.items()}
        twin.add_tokens([AddedToken(names[t.content], single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                                    normalized=t.normalized, special=False) for t in self.specials.values()])
        twin.encode_special_tokens = True
        return twin, names, {twin.token_to_id(names[t.content]): i for i, t in self.specials.items()}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text for `ids`. Like transformers v5, no clean_up_tokenization_spaces: it skips that for BPE models."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # --- vocabulary ----------------------------------------------------------------------------------------

    @property
    def id_limit(self) -> int:
        """One more than the largest token id (ids may have gaps): the embedding rows the model needs at least."""
        return max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @functools.cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of <0xNN> byte tokens when the model uses SentencePiece byte fallback, else empty (the streaming
        detokenizer holds text back while a run of them goes on: detokenizer.py says why)."""
        if not getattr(self._tok.model, "byte_fallback", False):  # BPE and Unigram models carry the flag
            return frozenset()
        return frozenset(i for token, i in self._tok.get_vocab(with_added_tokens=False).items()
                         if len(token) == 6 and _BYTE_TOKEN.fullmatch(token))

    @functools.cached_property
    def specials(self) -> dict:
        """id -> AddedToken of the added tokens flagged special (those decode(skip_special_tokens=True) drops)."""
        return {i: t for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self._tok.get_vocab_size(with_added_tokens=True)}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)})")
