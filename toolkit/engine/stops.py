"""Stop strings: a request stops when its text contains one, and the stop string itself is never shown.

Text reaches the user a step at a time, so a stop string can arrive split over several steps ("\n\n" as
"\n" then "\n"). The new text of a step is therefore searched together with the tail of what was already
emitted, and any tail of it that could still grow into a stop string is held back (`Sequence.held`) until
the next token settles it, or the request ends (then it is flushed).
"""
from .sequence import Sequence


def stop_strings(seq: Sequence, new: str, final: bool) -> tuple:
    """Search the stop strings across the text emitted so far and `new`; on a hit, emit up to it (the stop
    string itself is trimmed). Otherwise hold back any tail that could still grow into a stop string (unless
    this is the request's `final` text). Returns (text to emit, hit?)."""
    stops = seq.params.stop
    longest = max(map(len, stops))
    held = seq.held + new
    window = seq.text[-(longest - 1):] if longest > 1 else ""
    hay = window + held
    hits = [i for i in (hay.find(s) for s in stops) if i >= 0]
    if hits:
        cut = max(0, min(hits) - len(window))
        out, seq.held = held[:cut], ""
        seq.text += out
        return out, True
    # Unless final: the longest tail of `held` that is a proper prefix of some stop string.
    keep = 0 if final else next((k for k in range(min(len(held), longest - 1), 0, -1)
                                 if any(s.startswith(held[-k:]) for s in stops)), 0)
    out = held[:len(held) - keep]
    seq.held = held[len(held) - keep:]
    seq.text += out
    return out, False


def flush(seq: Sequence, text: str) -> str:
    """The request stops: text held back (for stop strings), then `text`, then the detokenizer's unfinished rest."""
    out = seq.held + text + (seq.detokenizer.finalize() if seq.detokenizer is not None else "")
    seq.held = ""
    return out
