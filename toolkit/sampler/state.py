"""One request's sampler state, built once when the request is admitted.

Everything the sampler needs from a request's history is kept here, incrementally, so a step
only reads it:
    needs_processing   does this request ever change its logits? Computed once, at admission, from its
                       parameters: such a row goes to filter_sample on the fast path, the others to
                       gumbel_sample alone.
    seed_words         its 64-bit seed as two 32-bit Philox key words
    penalty entries    every distinct token of prompt ∪ output, sorted, with its output count (0: prompt only;
                       the prompt's tokens only under a repetition penalty), kept sorted as tokens arrive, in
                       arrays with room to grow: a step copies them as they are (rebuilding them each step cost
                       ~20 µs a row: 2.8 ms of host time a step at B = 128, more than the GPU's step)
    bad_words          token sequences; a word's last token is banned when the rest of the word
                       matches the end of the output
    stop_ids           tokens banned while fewer than min_tokens tokens have been generated

The per-step entries it hands the sampler are sparse: (token, value) pairs for logit bias and bans,
(token, output count) pairs for the penalties, so a step never builds a [V] array on the host.
"""
import itertools

import numpy as np

_serial = itertools.count()
NEG_INF = float("-inf")


def bad_word_ids(words, tokenizer) -> list:
    """Each bad word as token sequences: as written and with a leading space (vLLM does the same, so a word
    is banned at the start of the text and in the middle of it). Token sequences are taken as they are."""
    out = []
    for w in words:
        if not isinstance(w, str):
            out.append(tuple(int(t) for t in w))
            continue
        if tokenizer is None:
            continue
        plain = tuple(tokenizer.encode(w.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + w.lstrip(), add_special_tokens=False))
        out.append(plain)
        # The spaced form only when it is a different word token of the same length (vLLM's rule).
        if spaced and spaced != plain and len(spaced) == len(plain) and spaced[0] != plain[0]:
            out.append(spaced)
    return [w for w in out if w]


class RequestSampling:
    def __init__(self, params, prompt_ids, vocab_size: int, seed: int, stop_ids=(), bad_words=()):
        p = self.params = params
        self.serial = next(_serial)  # identifies this request's rows across steps (ids of objects get reused)
        self.stop_ids = tuple(sorted(set(stop_ids)))
        self.vocab_size = vocab_size
        self.needs_processing = p.needs_processing(vocab_size, bool(self.stop_ids))
        self.seed_words = (seed & 0xFFFFFFFF, seed >> 32)
        self.greedy = p.temperature == 0
        # This request's row of the sampler's per-row arrays (batch.py stacks B of them per step).
        self.row_f32 = np.array([p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.frequency_penalty,
                                 p.presence_penalty, 0.0 if self.greedy else 1.0], np.float32)
        self.row_i32 = np.array([p.top_k, *np.array(self.seed_words, np.uint32).view(np.int32)], np.int32)
        self.use_penalties = (p.repetition_penalty != 1 or p.frequency_penalty != 0
                              or p.presence_penalty != 0)
        start = np.unique(np.asarray(prompt_ids, np.int32)) if p.repetition_penalty != 1 else ()
        self._n = len(start)
        self._tok, self._cnt = np.zeros(max(16, 2 * self._n), np.int32), np.zeros(max(16, 2 * self._n), np.int32)
        self._tok[:self._n] = start
        self.bad_words = [tuple(w) for w in bad_words]
        self.output: list = []  # generated tokens (bad-word prefixes are matched against its end)
        self.num_generated = 0
        self._track = any(len(w) > 1 for w in self.bad_words)
        self.bias_tokens = np.array([t for t, _ in p.logit_bias], np.int32)
        self.bias_values = np.array([b for _, b in p.logit_bias], np.float32)

    def on_token(self, token: int):
        """A generated token joins the output (called by the engine for every kept token)."""
        self.num_generated += 1
        if self._track:
            self.output.append(token)
        if self.use_penalties:
            n, tok = self._n, self._tok
            i = int(np.searchsorted(tok[:n], token))
            if i < n and tok[i] == token:
                self._cnt[i] += 1
                return
            if n == len(tok):  # full: double the room (amortised O(1) a token)
                self._tok, self._cnt = (np.concatenate((a, np.zeros_like(a))) for a in (tok, self._cnt))
            for a, v in ((self._tok, token), (self._cnt, 1)):  # shift the tail up one place, then insert
                a[i + 1:n + 1] = a[i:n]
                a[i] = v
            self._n = n + 1

    def penalty_entries(self) -> tuple:
        """(tokens, output counts): views of the penalties' sorted history (see the top)."""
        return self._tok[:self._n], self._cnt[:self._n]

    # -- per-step sparse entries -----------------------------------------------------------------------

    def banned(self) -> list:
        """Tokens that must not come next: bad words whose prefix ends the output, and the stop tokens
        while fewer than min_tokens have been generated."""
        ban = set()
        for w in self.bad_words:
            k = len(w) - 1
            if k == 0 or (len(self.output) >= k and tuple(self.output[-k:]) == w[:-1]):
                ban.add(w[-1])
        if self.num_generated < self.params.min_tokens:
            ban.update(self.stop_ids)
        return sorted(ban)
