"""Train the byte-level BPE tokenizer and tokenize the corpus into train.bin / val.bin (no PyTorch needed).

Input:  weights/data/corpus/<source>.txt from build_corpus.py (documents separated by a form-feed line).
Output: weights/data/tokenizer.json and weights/<MODEL>/tokenizer.json   the tokenizer (same file twice)
        weights/data/train.bin, val.bin        token ids, np.uint16, documents separated by <|endoftext|>
        weights/data/tokens.json               counts and the split settings (read by train.py)
        weights/val.bin                        a copy of val.bin that ships (177 KB), for the toolkit's own checks
        weights/wordlist.txt                   lowercase words seen >= 2 times in the training text

The held-out split, exactly: every document is cut at paragraph boundaries into chunks of at least
CHUNK_CHARS characters (the last chunk of a document may be shorter). Chunks are numbered across the whole
corpus in file order (SOURCES order, then document order); chunk k is validation text when
k % VAL_EVERY == VAL_OFFSET, otherwise training text. Consecutive chunks of one document that land in the
same split are joined again ("\\n\\n") into a segment; every segment is encoded on its own and followed by
<|endoftext|>. So val.bin is ~2% of the corpus, spread evenly over all sources, and no validation paragraph is
ever seen in training -- also not through the tokenizer, which is trained on the training segments only, nor
through the chat conversations (chat_data.py), which are made from training segments and go to train.bin only.

Usage: python3 weights/train_tokenizer.py [--vocab 8192]
"""
import argparse, collections, json, os, re, sys, time

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_corpus import CORPUS, DATA, DOC_SEP, HERE, SOURCES  # noqa: E402
from chat_data import make_dialogues  # noqa: E402

MODEL = "tiny-pd"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # ids 0, 1, 2
CHUNK_CHARS, VAL_EVERY, VAL_OFFSET = 4000, 50, 25
WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)*")               # the word list's (and its test's) notion of a word
WORD_MIN_COUNT = 2


def chunks_of(doc):
    """Cut a document at paragraph boundaries into pieces of >= CHUNK_CHARS characters."""
    out, cur, n = [], [], 0
    for para in doc.split("\n\n"):
        cur.append(para)
        n += len(para) + 2
        if n >= CHUNK_CHARS:
            out.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return out


def split_corpus():
    """-> ({source: [training segment, ...]}, [validation segment, ...]) following the rule in the docstring."""
    train, val, k = {}, [], 0
    for source in SOURCES:
        train[source] = []
        with open(os.path.join(CORPUS, source + ".txt"), encoding="utf-8") as f:
            docs = f.read().rstrip("\n").split(DOC_SEP)
        for doc in docs:
            run, run_is_val = [], None
            for chunk in chunks_of(doc):
                is_val = k % VAL_EVERY == VAL_OFFSET
                k += 1
                if run and is_val != run_is_val:
                    (val if run_is_val else train[source]).append("\n\n".join(run))
                    run = []
                run.append(chunk)
                run_is_val = is_val
            if run:
                (val if run_is_val else train[source]).append("\n\n".join(run))
    return train, val, k


def train_bpe(texts, vocab):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert [tok.token_to_id(s) for s in SPECIAL] == [0, 1, 2]
    return tok


def encode(tok, segments, eot):
    """Encode each segment on its own and append <|endoftext|>; -> one uint16 array."""
    ids = []
    for enc in tok.encode_batch(segments, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def write_wordlist(texts, path):
    counts = collections.Counter()
    for t in texts:
        counts.update(WORD_RE.findall(t.lower()))
    words = sorted(w for w, c in counts.items() if c >= WORD_MIN_COUNT)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(words) + "\n")
    return len(words)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    t0 = time.time()
    train, val, n_chunks = split_corpus()
    train_texts = [s for source in SOURCES for s in train[source]]
    dialogues = make_dialogues(train)

    tok = train_bpe(train_texts, args.vocab)
    os.makedirs(os.path.join(HERE, MODEL), exist_ok=True)
    for path in (os.path.join(DATA, "tokenizer.json"), os.path.join(HERE, MODEL, "tokenizer.json")):
        tok.save(path)
    assert tok.get_vocab_size() <= 65536   # ids fit np.uint16
    t1 = time.time()

    eot = tok.token_to_id("<|endoftext|>")
    stats = {"vocab_size": tok.get_vocab_size(), "chunk_chars": CHUNK_CHARS, "val_every": VAL_EVERY,
             "val_offset": VAL_OFFSET, "chunks": n_chunks, "sources": {}}
    parts = []
    for source in SOURCES:
        ids = encode(tok, train[source], eot)
        chars = sum(len(s) for s in train[source])
        stats["sources"][source] = {"train_tokens": len(ids), "chars_per_token": round(chars / len(ids), 3)}
        parts.append(ids)
    chat = encode(tok, dialogues, eot)
    stats["sources"]["chat"] = {"train_tokens": len(chat), "dialogues": len(dialogues)}
    parts.append(chat)
    train_ids, val_ids = np.concatenate(parts), encode(tok, val, eot)
    train_ids.tofile(os.path.join(DATA, "train.bin"))
    val_ids.tofile(os.path.join(DATA, "val.bin"))
    val_ids.tofile(os.path.join(HERE, "val.bin"))   # shipped: the toolkit's perplexity check reads it
    stats.update(train_tokens=len(train_ids), val_tokens=len(val_ids), val_segments=len(val))
    with open(os.path.join(DATA, "tokens.json"), "w") as f:
        json.dump(stats, f, indent=1)
    n_words = write_wordlist(train_texts + dialogues, os.path.join(HERE, "wordlist.txt"))

    print(f"tokenizer: vocab {tok.get_vocab_size()}, trained in {t1 - t0:.1f} s")
    for source, s in stats["sources"].items():
        print(f"  {source:12s} {s['train_tokens']:9d} train tokens  " +
              (f"{s['chars_per_token']:.2f} chars/token" if "chars_per_token" in s else f"{s['dialogues']} dialogues"))
    print(f"train.bin {len(train_ids)} tokens, val.bin {len(val_ids)} tokens ({len(val)} segments of "
          f"{n_chunks} chunks), wordlist {n_words} words, {time.time() - t0:.1f} s total")


if __name__ == "__main__":
    main()
