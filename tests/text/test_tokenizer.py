"""Tokenizer: encode/decode and special-token rules against HF fast-tokenizer behaviour.

Small tokenizers of both families are trained here with the `tokenizers` API (a second or so), so the tests
need no downloads; the real stories260K folder pins exact ids where it is present.
The builders are imported by test_detokenizer.py too.
"""
import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from toolkit.errors import ToolkitError
from toolkit.text.tokenizer import Tokenizer

CORPUS = [
    "Once upon a time there was a little girl named Lily.",
    "She loved to play outside in the park with her friends.",
    "One day, the sun was shining and the birds were singing!",
    "Tom said: \"Let's go home now\", and they went home, happy.",
    "The end. 1234567890 (and more) [brackets] {braces} #tag @at 50% & co.",
]
# Not in CORPUS on purpose: these must go through raw bytes / byte fallback.
MULTIBYTE = "café 🤗 naïve — “quoted” 日本語 ½ Ωmega"
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]


def byte_level_backend(vocab_size=400):
    """Qwen / Llama 3 family: BPE over bytes mapped to printable chars (setup from platform.md §8)."""
    tok = HFTokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=CHATML_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def sentencepiece_backend(vocab_size=150):
    """Llama 2 / Mistral family: `▁` word marks, BPE with <0xNN> byte fallback, Llama 2's decoder chain."""
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False)
    plain = HFTokenizer(models.BPE(unk_token=None))
    # Trained per word (split=True) so merges stay inside words, as SentencePiece's do.
    plain.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    plain.train_from_iterator(CORPUS, trainer)
    trained = json.loads(plain.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in trained["vocab"]:
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) for m in trained["merges"]]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def write_model(path, backend, tokenizer_config=None, generation_config=None, config=None):
    """A model folder as Hugging Face lays it out (only the tokenizer-related files)."""
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    for name, data in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config),
                       ("config.json", config)):
        if data is not None:
            (path / name).write_text(json.dumps(data))
    return path


def qwen_style_dir(path):
    tc = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None}
    return write_model(path, byte_level_backend(), tc, {"bos_token_id": 0, "eos_token_id": [2, 0]},
                       {"bos_token_id": 0, "eos_token_id": 2})


def llama2_style_dir(path):
    # Llama 2 writes its special tokens as AddedToken dicts.
    tc = {"add_bos_token": True, "add_eos_token": False, "unk_token": "<unk>", "pad_token": None,
          "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False},
          "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False}}
    return write_model(path, sentencepiece_backend(), tc, {"bos_token_id": 1, "eos_token_id": 2})


# --- the real model ------------------------------------------------------------------------------------------

def test_stories_encode_pins_ids(stories_dir):
    tok = Tokenizer.from_dir(stories_dir)
    assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]
    assert tok.encode("Once upon a time", add_special_tokens=False) == [403, 407, 261, 378]
    assert tok.decode([1, 403, 407, 261, 378]) == "Once upon a time"
    assert tok.decode([1, 403, 2], skip_special_tokens=False) == "<s> Once</s>"


def test_stories_properties(stories_dir):
    tok = Tokenizer.from_dir(stories_dir)
    assert (tok.bos_id, tok.eos_ids, tok._tok.get_vocab_size(with_added_tokens=True)) == (1, frozenset({2}), 512)
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    assert tok.byte_fallback_ids == frozenset(range(3, 259))


def test_stories_byte_fallback_round_trip(stories_dir):
    tok = Tokenizer.from_dir(stories_dir)
    ids = tok.encode(MULTIBYTE)
    assert ids[0] == 1 and ids.count(1) == 1
    assert any(3 <= i < 259 for i in ids)  # the emoji really went through <0xNN> tokens
    assert tok.decode(ids) == MULTIBYTE


# --- byte-level BPE ------------------------------------------------------------------------------------------

def test_qwen_style_no_bos_and_round_trip(tmp_path):
    tok = Tokenizer.from_dir(qwen_style_dir(tmp_path))
    # tokenizer_config says bos_token: null, so no BOS id even though generation_config names one (as in HF).
    assert tok.bos_id is None
    ids = tok.encode(MULTIBYTE)
    assert ids == tok.encode(MULTIBYTE, add_special_tokens=False)
    assert tok.decode(ids) == MULTIBYTE
    for text in CORPUS:
        assert tok.decode(tok.encode(text)) == text


def test_qwen_style_special_ids(tmp_path):
    tok = Tokenizer.from_dir(qwen_style_dir(tmp_path))
    im_start, im_end, eot = (tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert tok.eos_ids == frozenset({im_end, eot})  # generation_config list + tokenizer_config eos_token
    assert tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    # Special tokens written in the text are single tokens; decode drops them unless asked not to.
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == im_start and ids[-1] == im_end
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_llama3_style_post_processor_adds_bos_once(tmp_path):
    backend = byte_level_backend()
    bot = backend.token_to_id("<|begin_of_text|>")
    # Llama 3's tokenizer.json: ByteLevel then TemplateProcessing that puts <|begin_of_text|> first.
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bot)])])
    tc = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}
    tok = Tokenizer.from_dir(write_model(tmp_path / "a", backend, tc, {"eos_token_id": 2}))
    bare = tok.encode("Once upon a time", add_special_tokens=False)
    assert tok.bos_id == bot
    assert tok.encode("Once upon a time") == [bot, *bare]
    # add_bos_token stated as well: HF rebuilds the post-processor from the flag, still one BOS.
    tok2 = Tokenizer.from_dir(write_model(tmp_path / "b", backend, {**tc, "add_bos_token": True}))
    assert tok2.encode("Once upon a time") == [bot, *bare]
    # add_bos_token: false removes nothing the post-processor adds (transformers v5 ignores the flag here).
    tok3 = Tokenizer.from_dir(write_model(tmp_path / "c", backend, {**tc, "add_bos_token": False}))
    assert tok3.encode("Once upon a time") == [bot, *bare]


# --- SentencePiece-style BPE ---------------------------------------------------------------------------------

def test_llama2_style_add_bos_token_prepends(tmp_path):
    tok = Tokenizer.from_dir(llama2_style_dir(tmp_path))
    assert (tok.bos_id, tok.eos_ids) == (1, frozenset({2}))
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    ids = tok.encode("Once upon a time")
    assert ids[0] == 1 and 1 not in ids[1:] and 2 not in ids
    assert tok.decode(ids) == "Once upon a time"
    assert tok.decode(tok.encode(MULTIBYTE)) == MULTIBYTE
    assert len(tok.byte_fallback_ids) == 256


def test_post_processor_with_bos_and_flag_adds_bos_once(tmp_path):
    # The real Llama 2 / Mistral layout: add_bos_token true *and* a TemplateProcessing that adds <s>.
    backend = sentencepiece_backend()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tc = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"}
    tok = Tokenizer.from_dir(write_model(tmp_path, backend, tc))
    ids = tok.encode("<s>the park")  # a literal "<s>" in the text stays: HF gives [1, 1, ...] too
    assert ids[:2] == [1, 1] and ids.count(1) == 2
    assert tok.encode("the park") == [1, *tok.encode("the park", add_special_tokens=False)]


def test_add_eos_token(tmp_path):
    tc = {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>", "eos_token": "</s>"}
    tok = Tokenizer.from_dir(write_model(tmp_path, sentencepiece_backend(), tc))
    ids = tok.encode("the park")
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(2) == 1
    assert tok.encode("the park", add_special_tokens=False) == ids[1:-1]


def test_eos_from_config_json_when_no_generation_config(tmp_path):
    tok = Tokenizer.from_dir(write_model(tmp_path, sentencepiece_backend(), None, None,
                                         {"bos_token_id": 1, "eos_token_id": [2, 0]}))
    assert tok.bos_id == 1 and tok.eos_ids == frozenset({0, 2})
    assert tok.special_tokens == {}


def test_special_tokens_map_json_is_read(tmp_path):
    d = write_model(tmp_path, sentencepiece_backend(), {"add_bos_token": True})
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    tok = Tokenizer.from_dir(d)
    assert tok.bos_id == 1 and tok.eos_ids == frozenset({2}) and tok.encode("park")[0] == 1


# --- errors --------------------------------------------------------------------------------------------------

def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(ToolkitError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(ToolkitError, match="SentencePiece-only"):
        Tokenizer.from_dir(tmp_path)


def test_broken_files_are_named(tmp_path):
    d = write_model(tmp_path / "a", sentencepiece_backend())
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ToolkitError, match="tokenizer_config.json"):
        Tokenizer.from_dir(d)
    (d / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ToolkitError, match="tokenizer_config.json"):
        Tokenizer.from_dir(d)
    d2 = tmp_path / "b"
    d2.mkdir()
    (d2 / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(ToolkitError, match="tokenizer.json"):
        Tokenizer.from_dir(d2)


# --- pieces: special-token strings as text where the caller says so -----------------------------------------

@pytest.mark.parametrize("build", [qwen_style_dir, llama2_style_dir], ids=["byte-level", "sentencepiece"])
def test_encode_pieces_is_encode_where_specials_are_parsed(build, tmp_path):
    """Parsed everywhere, the pieces encode exactly as the whole text does: the same splits at special tokens
    (Metaspace's "first" prefix included) and the same merges between them."""
    tok = Tokenizer.from_dir(build(tmp_path))
    special = "<|im_start|>" if build is qwen_style_dir else "</s>"
    text = f"{special}user\nOnce upon a time {special}{special} there was{special}x"
    a, b = text.index("Once"), text.index(" there")
    pieces = [(text[:a], True), (text[a:b], True), (text[b:], True)]
    assert tok.encode_pieces(pieces) == tok.encode(text, add_special_tokens=False)
    sid = tok.token_to_id(special)
    as_text = tok.encode_pieces([(special + "user\n", True), (f"Once {special} upon", False), (special, True)])
    assert as_text.count(sid) == 2 and as_text[0] == as_text[-1] == sid  # the middle one is text
    assert tok.decode(as_text, skip_special_tokens=False) == f"{special}user\nOnce {special} upon{special}"
