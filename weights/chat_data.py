"""Turn training text into short ChatML conversations, so the default model knows the chat format.

A model that never saw <|im_start|> / <|im_end|> in training answers a chat prompt with noise and never stops.
Nothing in the corpus is a conversation, so we make some from the corpus itself (no new text, no outside
source): the user asks for a definition or a passage, the assistant answers with text from the corpus.

  definitions  The Devil's Dictionary ("ABASEMENT, n. A decent ...") and the Jargon File (":foo: n. ...")
  passages     a paragraph of the Bible or of Austen, a speech or a few lines of Shakespeare or Milton

Only *training* segments are used (the caller passes them), so validation text never leaks in. Each
conversation is rendered exactly as the model folder's chat template renders it ("<|im_start|>role\\n
content<|im_end|>\\n" per message), ends with the assistant's <|im_end|>, and becomes one document.
Deterministic: everything is drawn from random.Random(seed) over inputs in a fixed order.
"""
import random, re

SYSTEM = ["You are a helpful assistant.", "You are a helpful assistant who speaks plainly.",
          "You are a well-read assistant."]

DEVIL_Q = ["What is {w}?", "Define {w}.", "What does \"{w}\" mean?", "What is the meaning of the word \"{w}\"?",
           "Give me a definition of {w}.", "What is a cynic's definition of {w}?"]
JARGON_Q = ["What does \"{w}\" mean in hacker slang?", "What is {w}?", "Explain the hacker term \"{w}\".",
            "What does the Jargon File say about {w}?", "Define {w}."]
PASSAGE_Q = {
    "web": ["Tell me a story from the Bible.", "Read me a passage from the Bible.", "Tell me a story.",
            "Share a passage from scripture.", "What does the Bible say?"],
    "austen": ["Tell me a story.", "Write a paragraph in the style of Jane Austen.", "Describe a scene from a novel.",
               "Tell me about a young lady and her family.", "Write a paragraph of a novel."],
    "shakespeare": ["Write a few lines in the style of Shakespeare.", "Recite some Shakespeare.",
                    "Write a short scene from a play.", "Give me a speech from a play."],
    "milton": ["Recite some verse.", "Write a few lines of epic poetry.", "Recite some Milton."],
}
PASSAGES_PER_SOURCE = {"web": 700, "austen": 700, "shakespeare": 500, "milton": 150}
JARGON_MAX = 900   # of ~2,000 usable entries: more would make the chat model talk mostly hacker slang


def render(messages):
    """The chat template of the model folder, in Python (keep the two in step)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def devil_entries(texts):
    """'WORD, n. Definition...' paragraphs -> (word, definition) (entries whose text is verse only are skipped)."""
    for text in texts:
        for para in text.split("\n\n"):
            m = re.match(r"([A-Z][A-Z' \-]+), (?:[a-z]+\.)+ (\S.{30,600})$", para, re.S)
            if m and "\n" not in m.group(2):
                yield m.group(1).lower(), m.group(2)


def jargon_entries(texts):
    """':word: pron, n.' header + its first paragraph of prose -> (word, definition); a paragraph that is only a
    usage tag ("[common]") is skipped, {cross refs} lose their braces."""
    for text in texts:
        paras = text.split("\n\n")
        for i, head in enumerate(paras):
            m = re.match(r":([^:\n]+):", head)
            if not m:
                continue
            body = next((p for p in paras[i + 1:i + 3] if not re.fullmatch(r"\[[^\]]*\]", p)), ":")
            body = re.sub(r"^\[[^\]]*\] ", "", body)          # "[common] ...": usage tag
            body = re.sub(r"^\d\. |^(?:[a-z]+\.,?)+ ", "", body).replace("{", "").replace("}", "")  # "1. ", "n. "
            if not body.startswith(":") and "\n" not in body and 40 <= len(body) <= 700:
                yield m.group(1), body


def passages(source, texts, rng, n):
    """n random passages of one source: a prose paragraph (200-900 chars), 1-3 consecutive speeches of a play,
    or 8 lines of a poem."""
    cands = []
    for text in texts:
        paras = text.split("\n\n")
        if source in ("web", "austen"):
            cands += [p for p in paras if 200 <= len(p) <= 900 and "\n" not in p and p[0].isupper()]
        elif source == "shakespeare":   # a speech is "Name.\nline\nline..."
            for i in range(len(paras)):
                w = "\n\n".join(paras[i:i + 1 + i % 3])
                if re.match(r"[A-Z][\w ]*\.\n", w) and 4 <= w.count("\n") <= 20 and 150 <= len(w) <= 900:
                    cands.append(w)
        else:
            lines = text.split("\n")
            for i in range(0, len(lines) - 8, 8):
                w = [ln.strip() for ln in lines[i:i + 8]]
                if all(w) and not any(ln.isupper() for ln in w):
                    cands.append("\n".join(w))
    return rng.sample(cands, min(n, len(cands)))


def make_dialogues(train_texts, seed=1234):
    """train_texts: {source: [training segment text, ...]} -> list of ChatML conversation strings."""
    rng = random.Random(seed)
    qa = []  # (question, answer)
    for w, d in devil_entries(train_texts.get("devil", [])):
        qa.append((rng.choice(DEVIL_Q).format(w=w), f"{w.capitalize()}: {d}"))
    jargon = list(jargon_entries(train_texts.get("jargon", [])))
    for w, d in rng.sample(jargon, min(JARGON_MAX, len(jargon))):
        qa.append((rng.choice(JARGON_Q).format(w=w), d))
    for source, n in PASSAGES_PER_SOURCE.items():
        for p in passages(source, train_texts.get(source, []), rng, n):
            qa.append((rng.choice(PASSAGE_Q[source]), p))
    rng.shuffle(qa)
    dialogues, i = [], 0
    while i < len(qa):
        turns = 2 if rng.random() < 0.15 and i + 1 < len(qa) else 1   # some two-turn conversations
        messages = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < 0.3 else []
        for q, a in qa[i:i + turns]:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        dialogues.append(render(messages))
        i += turns
    return dialogues
