"""Streaming detokenizer: the pieces it prints add up to decode() of all ids, for both tokenizer families."""
import random

import pytest

# pytest puts tests/ on sys.path (no __init__.py there), so the tokenizer builders are shared this way.
from tests.text.test_tokenizer import CORPUS, MULTIBYTE, llama2_style_dir, qwen_style_dir
from toolkit.text.detokenizer import StreamingDetokenizer
from toolkit.text.tokenizer import Tokenizer

# Characters of 1 to 4 UTF-8 bytes, spaces in odd places, and text the tiny vocabularies never saw.
ALPHABET = list("abcdefghij  .,!\n") + list("éïü—“”½Ω日本語🤗😀🎉") + [" the", " park", "Once", " upon"]


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece", "stories260K"])
def tokenizer(request, tmp_path_factory):
    if request.param == "byte_level":
        return Tokenizer.from_dir(qwen_style_dir(tmp_path_factory.mktemp("qwen")))
    if request.param == "sentencepiece":
        return Tokenizer.from_dir(llama2_style_dir(tmp_path_factory.mktemp("llama2")))
    return Tokenizer.from_dir(request.getfixturevalue("stories_dir"))  # skips where the folder is absent


def stream(tokenizer, ids):
    detok = StreamingDetokenizer(tokenizer)
    pieces = [detok.add_token(i) for i in ids]
    pieces.append(detok.finalize())
    return pieces


def random_text(rng, n):
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def test_random_texts_stream_exactly(tokenizer):
    rng = random.Random(1)
    for _ in range(300):
        text = random_text(rng, rng.randrange(1, 30))
        ids = tokenizer.encode(text)
        pieces = stream(tokenizer, ids)
        assert "".join(pieces) == tokenizer.decode(ids)
        # Valid text never shows a replacement character, even while a character is half-generated.
        assert not any("\ufffd" in p for p in pieces), (text, pieces)


def test_random_ids_stream_exactly(tokenizer):
    # Arbitrary ids (as a badly sampled model could produce): invalid byte runs, lone special tokens, all of it.
    rng, vocab = random.Random(2), tokenizer._tok.get_vocab_size(with_added_tokens=True)
    for _ in range(1500):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids), ids


def test_multibyte_split_over_tokens(tokenizer):
    ids = tokenizer.encode(MULTIBYTE)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == MULTIBYTE
    assert not any("\ufffd" in p for p in pieces)
    # The emoji really was spread over several tokens, and none of them printed a fragment of it.
    assert len(ids) > len(tokenizer.encode("café naïve — “quoted” 日本語 ½ Ωmega")) + 1


def test_word_leading_spaces(stories_dir):
    tok = Tokenizer.from_dir(stories_dir)
    assert stream(tok, [1, 403, 407, 261, 378]) == ["", "Once", " upon", " a", " time", ""]


def test_special_tokens_are_skipped_mid_stream(tokenizer):
    eos = min(tokenizer.eos_ids)
    words = tokenizer.encode(" upon the park", add_special_tokens=False)
    ids = words[:1] + [eos, eos] + words[1:]
    assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids) == tokenizer.decode(words)


def test_finalize_flushes_unfinished_character(tokenizer):
    ids = tokenizer.encode("ab🤗", add_special_tokens=False)
    head = ids[:-1]  # the emoji's last byte is missing
    detok = StreamingDetokenizer(tokenizer)
    printed = "".join(detok.add_token(i) for i in head)
    assert "\ufffd" not in printed
    assert printed + detok.finalize() == tokenizer.decode(head)
    assert detok.finalize() == ""  # nothing is left after a flush


def test_cost_per_token_stays_small(tokenizer):
    """A long generation decodes short windows, not the whole history, at every step."""
    class CountingTokenizer:
        def __init__(self, inner):
            self.inner, self.longest, self.calls = inner, 0, 0
            self.specials, self.byte_fallback_ids = inner.specials, inner.byte_fallback_ids

        def decode(self, ids, skip_special_tokens=True):
            self.longest, self.calls = max(self.longest, len(ids)), self.calls + 1
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tokenizer.encode(" ".join(CORPUS * 40) + MULTIBYTE * 20)
    counting = CountingTokenizer(tokenizer)
    pieces = stream(counting, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert len(ids) > 2000
    assert counting.longest <= 16          # a handful of tokens, however long the text
    assert counting.calls <= 2 * len(ids) + 2
