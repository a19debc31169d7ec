"""A request's sampling parameters: one frozen value, validated once, when it is made.

    params = SamplingParams(temperature=0.8, top_p=0.95, stop=("\\n\\n",))   # ToolkitError naming a bad field
    params.check_vocab(V)                           # token ids in logit_bias / stop_token_ids / bad_words < V
    params.needs_processing(V, has_stop_ids)        # the sampler's gate flag (fast path when False for all rows)
    params.as_record(seed_used)                     # what a JSONL output record says was used

Where the values come from (toolkit/cli/records.py): the model folder's generation_config.json
(`load_generation_config`), then the command-line flags, then the JSONL request's own fields; the last
one given wins, and the combination is validated again here.

The sampler applies them in vLLM's order: logit bias, penalties (repetition, frequency, presence), bad
words, temperature, min_p, top_k, top_p, sample. Ranges follow vLLM and OpenAI (penalties in [-2, 2],
|bias| <= 100, at most 20 logprobs), so a request that works there works here.
"""
import json
import math
import numbers
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..errors import ToolkitError

# Temperatures below this sample as greedy (vLLM's _SAMPLING_EPS): the limit T -> 0 of temperature
# sampling is the argmax, and dividing by a tiny T only invites overflow.
GREEDY_BELOW = 1e-5
# ... but below this even float32(1 / T) is inf (1 / float32 max ~ 2.9e-39): such a value is a bug upstream
# (a unit mix-up, a denormal), not a request for greedy decoding, so it is refused rather than rounded.
TEMPERATURE_MIN = 1.0 / float(np.finfo(np.float32).max)
MAX_LOGPROBS = 20
DEFAULT_MAX_TOKENS = 256  # a request's max_tokens when neither it nor generation_config.json gives one
MAX_LOGIT_BIAS, MAX_BAD_WORDS, MAX_STOP, MAX_STOP_IDS = 1024, 128, 128, 128
MAX_BIAS = 100.0  # OpenAI's range for logit bias values
MAX_PENALTY = 2.0  # frequency / presence penalty range [-2, 2] (OpenAI, vLLM)
MAX_TOP_K = 2 ** 31 - 1  # the kernels hold k in an int32
SEED_RANGE = 2 ** 64

# The fields generation_config.json may set (vLLM's list). vLLM ignores `do_sample`, and so do we: a
# file with do_sample false and temperature 0.7 samples at 0.7, as it does in vLLM (transformers would be
# greedy). Writing temperature 0 is how a model folder asks for greedy decoding.
GENERATION_CONFIG_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


# -- value checks: each names the field and shows the value ----------------------------------------------
def _int(name: str, v, lo: int, hi: int | None = None, what: str | None = None) -> int:
    # bool is an Integral too, and never a count, an id or a seed
    if not (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= lo
            and (hi is None or v <= hi)):
        rng = what or (f">= {lo}" if hi is None else f"in [{lo}, {hi}]")
        raise ToolkitError(f"{name} must be an integer {rng}, got {_show(v)}")
    return int(v)


def _float(name: str, v, ok, what: str) -> float:
    """v as a Python float, if it is a real number (not a bool), finite and `ok(f)`."""
    f = None
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
        try:
            f = float(v)
        except OverflowError:  # an int beyond the float range
            f = None
    if f is None or not math.isfinite(f) or not ok(f):
        raise ToolkitError(f"{name} must be {what}, got {_show(v)}")
    return f


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:30] + f"... ({len(text)} characters)"


def _tuple(name: str, v, limit: int) -> tuple:
    """A tuple field given as a tuple or a list (a lone string is one item, never its characters)."""
    if isinstance(v, str):
        v = (v,)
    if not isinstance(v, (tuple, list)):
        raise ToolkitError(f"{name} must be a list or one string, got {_show(v)}")
    if len(v) > limit:
        raise ToolkitError(f"{name} has {len(v)} entries; at most {limit} are allowed")
    return tuple(v)


def _logit_bias(v) -> tuple:
    """{id: bias} or pairs -> ((id, bias), ...) sorted by id, each id once."""
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, (tuple, list)):
        items = list(v)
    else:
        raise ToolkitError(f"logit_bias must be a mapping of token id to bias, got {_show(v)}")
    if len(items) > MAX_LOGIT_BIAS:
        raise ToolkitError(f"logit_bias has {len(items)} entries; at most {MAX_LOGIT_BIAS} are allowed")
    out = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ToolkitError(f"logit_bias entries must be (token id, bias) pairs, got {_show(item)}")
        tok = _int("logit_bias token id", item[0], 0)
        if tok in out:
            raise ToolkitError(f"logit_bias: token {tok} is given twice")
        out[tok] = _float(f"logit_bias[{tok}]", item[1], lambda b: abs(b) <= MAX_BIAS,
                          f"a finite number in [-{MAX_BIAS:g}, {MAX_BIAS:g}]")
    return tuple(sorted(out.items()))


def _bad_words(v) -> tuple:
    out = []
    for i, w in enumerate(_tuple("bad_words", v, MAX_BAD_WORDS)):
        if isinstance(w, str) and w:
            out.append(w)
        elif isinstance(w, (tuple, list)) and w:
            out.append(tuple(_int(f"bad_words[{i}] token id", t, 0) for t in w))
        else:
            raise ToolkitError(f"bad_words[{i}] must be a non-empty string or a non-empty list of token ids, "
                               f"got {_show(w)}")
    return tuple(out)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy; 0 < T < GREEDY_BELOW is taken as 0
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple = ()  # ((token id, bias), ...) sorted by id; a dict {id: bias} is accepted
    bad_words: tuple = ()  # each a non-empty string or a non-empty tuple of token ids
    stop: tuple = ()  # strings: stop when one appears, and trim it
    stop_token_ids: tuple = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # no stopping (EOS, stop ids) before this many tokens
    seed: int | None = None  # None: drawn at random (and recorded on the Sequence)
    logprobs: int | None = None  # None = off; N = the sampled token's logprob plus the top N

    def __post_init__(self):
        # Every caller (the CLI's admission boundary, chat, bench, the UI, tests) ends up here: the one
        # place that decides what a valid request is. Values are normalised (frozen: object.__setattr__).
        def put(name, value):
            object.__setattr__(self, name, value)

        put("max_tokens", _int("max_tokens", self.max_tokens, 0))
        t = _float("temperature", self.temperature, lambda f: f >= 0, "a finite number >= 0")
        if 0 < t < TEMPERATURE_MIN:
            raise ToolkitError(f"temperature {t!r} is too small: 1/temperature overflows float32 "
                               f"(use 0 for greedy decoding)")
        put("temperature", 0.0 if t < GREEDY_BELOW else t)
        top_k = _int("top_k", self.top_k, -1, MAX_TOP_K, f"in [-1, {MAX_TOP_K}] (0 or -1 = off)")
        put("top_k", max(top_k, 0))  # -1 and 0 both mean off: one spelling
        put("top_p", _float("top_p", self.top_p, lambda f: 0 < f <= 1, "in (0, 1]"))
        put("min_p", _float("min_p", self.min_p, lambda f: 0 <= f <= 1, "in [0, 1]"))
        put("repetition_penalty", _float("repetition_penalty", self.repetition_penalty, lambda f: f > 0,
                                         "a finite number > 0"))
        for name in ("frequency_penalty", "presence_penalty"):
            put(name, _float(name, getattr(self, name), lambda f: abs(f) <= MAX_PENALTY,
                             f"a finite number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]"))
        put("logit_bias", _logit_bias(self.logit_bias))
        put("bad_words", _bad_words(self.bad_words))
        stop = _tuple("stop", self.stop, MAX_STOP)
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise ToolkitError(f"stop[{i}] must be a non-empty string, got {_show(s)}")
        put("stop", stop)
        put("stop_token_ids", tuple(_int("stop_token_ids entry", t, 0)
                                    for t in _tuple("stop_token_ids", self.stop_token_ids, MAX_STOP_IDS)))
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise ToolkitError(f"ignore_eos must be true or false, got {_show(self.ignore_eos)}")
        put("ignore_eos", bool(self.ignore_eos))
        put("min_tokens", _int("min_tokens", self.min_tokens, 0))
        if self.min_tokens > self.max_tokens:
            raise ToolkitError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        if self.seed is not None:
            put("seed", _int("seed", self.seed, 0, SEED_RANGE - 1, "in [0, 2^64)"))
        if self.logprobs is not None:
            put("logprobs", _int("logprobs", self.logprobs, 0, MAX_LOGPROBS))
        if self.temperature == 0:
            # Greedy: filters that always keep the maximum cannot change an argmax (vLLM resets them too),
            # and off values keep a greedy row off the slow path.
            put("top_k", 0)
            put("top_p", 1.0)
            put("min_p", 0.0)

    def check_vocab(self, vocab_size: int):
        """Every token id the parameters name must exist; the engine calls this at admission."""
        named = [("logit_bias", t) for t, _ in self.logit_bias] + [("stop_token_ids", t) for t in self.stop_token_ids]
        named += [(f"bad_words[{i}]", t) for i, w in enumerate(self.bad_words) if not isinstance(w, str) for t in w]
        for what, tok in named:
            if not 0 <= tok < vocab_size:
                raise ToolkitError(f"{what}: token {tok} is outside the vocabulary [0, {vocab_size})")

    def needs_processing(self, vocab_size: int, has_stop_ids: bool) -> bool:
        """The gate flag, computed once at admission: does this request change its logits (False: the sampler
        may take the fast path for it)? `has_stop_ids`: the request stops on some token (stop_token_ids, or an
        EOS it does not ignore), which min_tokens then has to mask.

        Exact float comparisons on purpose (vLLM PR #47711): T = 1 + 1e-7 or top_p = 0.9999 is not a no-op.
        Note the gate compares the stored float64 values: float32(1 + 1e-7) == 1, but the request still
        takes the slow path, where dividing by that 1.0 is harmless."""
        return (self.temperature not in (0.0, 1.0) or 0 < self.top_k < vocab_size or self.top_p != 1.0
                or self.min_p != 0.0 or self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0 or bool(self.logit_bias) or bool(self.bad_words)
                or (self.min_tokens > 0 and has_stop_ids))  # stop tokens are masked until min_tokens

    def as_record(self, seed_used: int | None) -> dict:
        """Every parameter as JSON values (all fields, always: a record says exactly what ran). The result
        is itself a valid set of JSONL request fields, so a record's params reproduce its run."""
        rec = {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}
        rec["logit_bias"] = {str(tok): b for tok, b in self.logit_bias}
        rec["bad_words"] = [w if isinstance(w, str) else list(w) for w in self.bad_words]
        rec["seed"] = self.seed if seed_used is None else seed_used
        return rec


def load_generation_config(model_dir) -> dict:
    """The sampling defaults a model folder's generation_config.json sets ({} without the file). A bad
    value is a ToolkitError naming the file and the field: the model folder itself is broken."""
    path = Path(model_dir) / "generation_config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ToolkitError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ToolkitError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ToolkitError(f"{path}: expected a JSON object")
    out = {k: cfg[k] for k in GENERATION_CONFIG_FIELDS if cfg.get(k) is not None}  # null: not set
    for k, v in out.items():
        try:
            # temperature > 0 so the other fields are checked as they are (greedy would reset them)
            SamplingParams(**{"temperature": 1.0, k: v})
        except ToolkitError as e:
            raise ToolkitError(f"{path}: {k}: {e}") from None
    return out
