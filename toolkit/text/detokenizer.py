"""Streaming detokenizer: turn generated ids into printable text one token at a time.

Decoding each token on its own is wrong in two ways:
- one character may be spread over several tokens (byte-level BPE pieces, or <0xNN> byte-fallback tokens for
  an emoji), and each piece alone decodes to U+FFFD;
- SentencePiece decoders drop the `▁`-space at the start of the text they are given, so "▁world" alone decodes
  to "world" and words would run together.
Decoding everything generated so far at every step is right but O(n) per token.

The fix (HF TextStreamer, vLLM's detokenize_incrementally) decodes a short window of recent ids and prints
only what the newest ids added:
    ids:  ... | prefix ......... read | new ids
    new_text = decode(ids[prefix:])[len(decode(ids[prefix:read])):]
The window starts one emitted chunk back, so its leading-space stripping hits text that was already printed.
Text is held back while it ends in U+FFFD (an unfinished character) and, for byte-fallback models, while the
last real token is a byte token: the ByteFallback decoder turns a whole run of byte tokens into U+FFFDs when
the run is not valid UTF-8, so a character that looks finished can still be unmade by the next byte.
The offsets then move forward and ids before `prefix` are dropped, so each step decodes a few ids only.
"""
from __future__ import annotations

_REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """add_token(id) -> new text; finalize() -> held-back text."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        # Special tokens are skipped by decode(); they must not count as "the last real token" either.
        self._special = tokenizer.specials
        self._byte_ids = tokenizer.byte_fallback_ids
        self._window: list[int] = []   # ids from `prefix` on; earlier ids are no longer needed
        self._read = 0                 # window[:read] is already printed
        self._prefix_text = ""         # decode(window[:read]), kept to avoid decoding it again
        self._in_byte_run = False      # last non-special token was a byte-fallback token

    def _advance(self, new_text: str) -> str:
        """Print everything past the read offset; the printed chunk becomes the next window's prefix."""
        out = new_text[len(self._prefix_text):]
        del self._window[:self._read]
        self._read = len(self._window)
        # Not `out`: decoded on its own the chunk may lose its leading space, and the next step's new_text
        # will be decoded the same way.
        self._prefix_text = self._tok.decode(self._window)
        return out

    def add_token(self, token_id: int) -> str:
        """Feed one generated id; returns the text it completes (often "", e.g. half of an emoji)."""
        token_id = int(token_id)
        self._window.append(token_id)
        if token_id not in self._special:
            self._in_byte_run = token_id in self._byte_ids
        if self._in_byte_run:
            return ""
        new_text = self._tok.decode(self._window)
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        return self._advance(new_text)

    def finalize(self) -> str:
        """Flush what is held back (an unfinished character comes out as U+FFFD, as decode() shows it)."""
        if self._read == len(self._window):
            return ""
        new_text = self._tok.decode(self._window)
        self._in_byte_run = False
        if len(new_text) <= len(self._prefix_text):
            # Nothing printable (special tokens only): keep the window so later text keeps its context.
            return ""
        return self._advance(new_text)
