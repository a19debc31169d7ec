"""A scripted engine for the TUI tests: the real EngineWorker drives it, so cancel/options/close are the real
thing, while the tokens and the StepTiming numbers are fixed (stable snapshots, no model, no JIT).

Its step times follow a rule the tests can check: a decode step takes DECODE_MS + BATCH_MS per request, plus
SLOW_MS when the sampler takes its slow path; the options, sampler path and context bucket a step records
follow the engine's rules (toolkit/engine/runner.py, toolkit/sampler/batch.py)."""
import threading
import time
from types import MappingProxyType, SimpleNamespace

from toolkit.engine.llm_engine import RequestOutput
from toolkit.engine.worker import EngineWorker
from toolkit.errors import ToolkitError
from toolkit.engine.options import EngineOptions
from toolkit.engine.timings import RequestStats, StepTiming
from toolkit.sampler.params import load_generation_config

from tui.session import ChatSession

REPLY = ["Hello", "!", " This", " is", " **a", " scripted**", " reply", "."]
PREFILL_SECTIONS = {"embedding": 0.5, "attention": 6.0, "mlp": 9.0, "lm_head": 3.0, "sample": 0.5}
DECODE_SECTIONS = {"embedding": 0.1, "attention": 1.5, "mlp": 4.0, "lm_head": 2.0, "sample": 0.4}
DECODE_MS, BATCH_MS, SLOW_MS = 8.0, 0.5, 0.5
VOCAB = 256
MIN_CONTEXT_BUCKET = 64

Step = StepTiming


class FakeTokenizer:
    eos_ids = (0,)

    def encode(self, text, add_special_tokens=True):
        return [1 + (ord(c) % 200) for c in text]  # one token per character


class FakeTemplate:
    def render(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, messages, tokenizer, special_in_content=False):
        return tokenizer.encode(self.render(messages), add_special_tokens=False)


class FakeEngine:
    def __init__(self, reply=REPLY, max_context=256, chat=True, delay=0.0, backend="cpu", model_dir=None):
        self.reply = list(reply)
        self.max_context = max_context
        self.tokenizer = FakeTokenizer()
        self.chat_template = FakeTemplate() if chat else None
        self.backend = SimpleNamespace(name=backend, dtype="float32" if backend == "cpu" else "bfloat16",
                                       num_sms=132, sm90=True, graphs_supported=True, pdl_supported=True)
        self.cfg = SimpleNamespace(vocab_size=VOCAB)
        self.generation_defaults = load_generation_config(model_dir) if model_dir else {}  # as build_engine
        self.weight_bytes = 50_000_000
        self.device_note = "fake device"
        self.options = EngineOptions()
        self.delay = delay
        self.requests = []  # (prompt ids, params) as added, for the tests to inspect
        self._active = {}  # rid -> [prompt, n emitted, prefilled]
        self._done_now = []
        self._index = 0
        self._cache = []
        self.gate = threading.Event()
        self.gate.set()

    # -- what EngineWorker calls -------------------------------------------------------------------------
    def detach_thread(self):
        pass

    def set_options(self, options):
        self.options = options

    def has_unfinished(self):
        return bool(self._active or self._done_now)

    def add_request(self, ids, params, request_id):
        if len(ids) >= self.max_context:
            raise ToolkitError(f"the prompt has {len(ids)} tokens but the context holds {self.max_context} "
                               "(raise --max-context or shorten the prompt)")
        self.requests.append((list(ids), params))
        self._active[request_id] = [list(ids), 0, False, params]

    def abort(self, rid):
        if self._active.pop(rid, None) is not None:
            self._done_now.append(RequestOutput(rid, None, "", "abort", None, RequestStats()))

    def _cached(self, ids):
        if not self.options.prefix_caching:
            return 0
        best = 0
        for old in self._cache:
            n = 0
            while n < min(len(old), len(ids) - 1) and old[n] == ids[n]:
                n += 1
            best = max(best, n // 16 * 16)
        return best

    def step(self):
        self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        outs, self._done_now = self._done_now, []
        if not self._active:
            return outs
        opts = self.options.effective(self.backend)
        prefill = [rid for rid, a in self._active.items() if not a[2]]
        rows = len(self._active)
        fast = opts.sampler_fast_path  # the fast path holds every setting (toolkit/sampler/batch.py's gate)
        why = "" if fast else "switched off"
        sampler = dict(sampler_path="fast" if fast else "slow", sampler_why=why,
                       sampler_bytes=0 if fast else rows * VOCAB * 4)
        if prefill:
            cached = sum(self._cached(self._active[r][0]) for r in prefill)
            n_tokens = sum(len(self._active[r][0]) for r in prefill) - cached
            timing = Step(self._index, "prefill", n_tokens, len(prefill), 20.0, 18.0,
                          MappingProxyType(PREFILL_SECTIONS), False, opts.with_(pdl=False), cached, 0.2,
                          context_bucket=MIN_CONTEXT_BUCKET, **sampler)
        else:
            longest = max(len(a[0]) + a[1] for a in self._active.values())
            bucket = MIN_CONTEXT_BUCKET
            while bucket < min(longest, self.max_context):
                bucket *= 2
            graph = self.backend.name == "cuda" and opts.cuda_graphs
            gpu = DECODE_MS + BATCH_MS * rows + (0.0 if fast else SLOW_MS)
            timing = Step(self._index, "decode", rows, rows, gpu + 1.5, gpu,
                          MappingProxyType({} if graph else DECODE_SECTIONS), graph,
                          opts if graph else opts.with_(pdl=False), 0, 0.1, context_bucket=bucket, **sampler)
        self._index += 1
        for rid in list(self._active):
            a = self._active[rid]
            ids, n, _, params = a[:4]
            if not a[2]:
                a[2] = True
                a.append(self._cached(ids))
                self._cache.append(ids)
            limit = min(params.max_tokens, len(self.reply))
            text = self.reply[n] if n < len(self.reply) else " more"
            a[1] = n = n + 1
            finish = "length" if n >= params.max_tokens else ("stop" if n >= limit and n >= len(self.reply)
                                                              else None)
            stats = RequestStats(prompt_tokens=len(ids), cached_tokens=a[4], generated_tokens=n, ttft_ms=20.0,
                                 prefill_ms=20.0, decode_ms_total=10.0 * (n - 1), decode_steps=n - 1)
            outs.append(RequestOutput(rid, 5, text, finish, timing, stats))
            if finish:
                del self._active[rid]
        return outs


def fake_session(**kw) -> ChatSession:
    return ChatSession(EngineWorker(FakeEngine(**kw)), model_name="fake-model")
