"""The conversation, apart from any widget: what the prompt is, which requests run, what comes back.

    session = ChatSession.open(model_dir, device="cpu")   # build_engine + EngineWorker (or wrap any worker)
    turn = session.start("Hello")                          # N requests of one prompt, one batch
    turn.note                                              # what had to go to fit the context, or None
    for out in session.stream(turn):                       # RequestOutputs of all N, merged, as they come
        ...
    session.finish(turn)                                   # the reply joins the history

With a chat template each turn renders the whole conversation; the engine's prefix cache holds the earlier
turns' KV blocks, so only the new turn is prefilled (RequestStats.cached_tokens says how much was reused).
A base model without a template gets plain continuation: the transcript is the prompt. When the history
outgrows the context, the oldest turns go (or, continuing, the oldest text), and the turn's note says so.
The terminal UI and the plain chat (toolkit/cli/chat.py) both run on this class.

Everything here runs on whichever thread calls it except `stream`, which the app calls from its worker thread;
the engine itself lives on the EngineWorker's thread, reached only through its queues.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.engine import SamplingParams
from toolkit.engine.options import EngineOptions
from toolkit.sampler.batch import vocab_limit

DEFAULT_MAX_TOKENS = 512


@dataclass
class Turn:
    """One prompt and its N replies, as they arrive."""
    user_text: str
    handles: list
    texts: list = field(default_factory=list)
    finish: list = field(default_factory=list)  # finish_reason per reply (None while running)
    stats: list = field(default_factory=list)  # last RequestStats per reply
    errors: list = field(default_factory=list)
    note: str | None = None  # what had to go to fit the context (ChatSession._prompt)
    cancelled: bool = False
    index: dict = field(default_factory=dict)  # request id -> reply number
    merged: queue.Queue | None = None  # every reply's outputs, once streaming started
    streaming: int = 0  # replies whose outputs have not all been streamed

    def __post_init__(self):
        n = self.streaming = len(self.handles)
        self.texts, self.finish, self.stats, self.errors = [""] * n, [None] * n, [None] * n, [None] * n
        self.index = {h.request_id: i for i, h in enumerate(self.handles)}

    def apply(self, out) -> int:
        """Record one RequestOutput (UI thread); returns its reply number."""
        i = self.index[out.request_id]
        self.texts[i] += out.text
        self.stats[i] = out.stats
        if out.finish_reason is not None:
            self.finish[i] = out.finish_reason
            if out.error:
                self.errors[i] = out.error
        return i


class ChatSession:
    def __init__(self, worker, *, model_name: str = "model", system: str = "", peak_gbps: float | None = None,
                 special_in_content: bool = False):
        """`worker`: an EngineWorker (or anything with submit_many/cancel/set_options/close and `.engine`)."""
        self.worker, self.engine = worker, worker.engine
        self.model_name = model_name
        # generation_config.json's sampling defaults (build_engine read them), with a chat-sized reply length
        self.params = SamplingParams(**{"max_tokens": DEFAULT_MAX_TOKENS, **self.engine.generation_defaults})
        self.replies = 1
        self.system = system
        self.peak_gbps = peak_gbps
        self.options = self.engine.options
        self.chat_mode = self.engine.chat_template is not None
        self.messages: list = []  # chat mode: user/assistant turns (the system prompt is added when rendering)
        self.transcript = ""  # continuation mode: the running text
        self._last_piece = self._last_user = ""
        self._dropped = 0  # turns dropped from this conversation to fit the context
        self.special_in_content = special_in_content  # special-token strings in a message are tokens, not text
        self._seed = self.params.seed

    @classmethod
    def open(cls, model_dir, device: str = "auto", system: str = "", special_in_content: bool = False,
             **engine_kw) -> "ChatSession":
        from toolkit.engine.build import build_engine
        from toolkit.engine.worker import EngineWorker

        engine = build_engine(model_dir, device=device, **engine_kw)
        peak = None
        if engine.backend.name == "cuda":
            from toolkit.bench.env import peak_gbps
            peak = peak_gbps("cuda", None)[0]
        return cls(EngineWorker(engine), model_name=Path(model_dir).name if model_dir else "model", system=system,
                   peak_gbps=peak, special_in_content=special_in_content)

    # -- what the panel header shows ---------------------------------------------------------------------
    @property
    def header(self) -> dict:
        e = self.engine
        return {"device": e.backend.name, "model": self.model_name, "dtype": e.backend.dtype,
                "context": e.max_context}

    @property
    def toggles(self) -> tuple:
        """The toggles this backend can run (the UI shows no others)."""
        return EngineOptions.available(self.engine.backend)

    def fast_path_why(self) -> str | None:
        """Why the sampler fast path will not apply to this session's requests (None: it will). It holds every
        sampling setting, so only the model's vocabulary can rule it out in advance (toolkit/sampler/batch.py)."""
        return vocab_limit(self.engine.cfg.vocab_size) or None

    def effective(self):
        """The options as this backend runs them (a toggle it cannot run reads as off)."""
        return self.options.effective(self.engine.backend)

    # -- settings -----------------------------------------------------------------------------------------
    def configure(self, params: SamplingParams | None = None, replies: int | None = None,
                  system: str | None = None):
        if params is not None:
            self.params, self._seed = params, params.seed
        if replies is not None:  # the settings modal checked it against its MAX_REPLIES
            self.replies = replies
        if system is not None:
            self.system = system

    def set_option(self, name: str, value: bool):
        self.options = self.options.with_(**{name: value})
        self.worker.set_options(self.options)

    # -- conversation -------------------------------------------------------------------------------------
    def clear(self):
        self.messages, self.transcript, self._last_piece, self._dropped = [], "", "", 0

    def _prompt(self, user_text: str) -> tuple:
        """(prompt ids, a note when old history had to go to fit the context, else None)."""
        e = self.engine
        reserve = max(1, min(self.params.max_tokens, e.max_context // 2))  # room for the reply
        if not self.chat_mode:
            ids = e.tokenizer.encode(self.transcript + user_text)
            keep = max(1, e.max_context - reserve - 1)
            if len(ids) <= keep or len(e.tokenizer.encode(user_text)) >= e.max_context:
                return ids, None  # fits, or the message alone is too long: the engine says so
            return ids[-keep:], (f"continuing from the last {keep} tokens of the text (the first {len(ids) - keep} "
                                 f"do not fit the {e.max_context}-token context)")
        system = [{"role": "system", "content": self.system}] if self.system else []
        history, dropped = self.messages + [{"role": "user", "content": user_text}], 0
        ids = e.chat_template.encode(system + history, e.tokenizer, self.special_in_content)
        while len(ids) + reserve >= e.max_context and len(history) > 1:  # drop the oldest turns until it fits
            del history[:2]
            dropped += 1
            ids = e.chat_template.encode(system + history, e.tokenizer, self.special_in_content)
        if not dropped or len(ids) >= e.max_context:  # or the message alone is too long: the engine says so,
            return ids, None  # and the history stays
        self.messages = history[:-1]
        first, self._dropped = self._dropped + 1, self._dropped + dropped
        turns = f"turn {first}" if dropped == 1 else f"turns {first}-{self._dropped}"
        return ids, f"dropped {turns} (of {self._dropped + len(history) // 2 + 1}) to fit the " \
                    f"{e.max_context}-token context"

    def start(self, user_text: str) -> Turn:
        ids, note = self._prompt(user_text)
        seeds = [None if self._seed is None else (self._seed + i) % 2 ** 64 for i in range(self.replies)]
        # One command for all replies: the engine admits them before its next step, as one batch.
        handles = self.worker.submit_many([(ids, dataclasses.replace(self.params, seed=s)) for s in seeds])
        if self._seed is not None:  # a fresh but reproducible draw each turn
            self._seed = (self._seed + self.replies) % 2 ** 64
        return Turn(user_text, handles, note=note)

    def stream(self, turn: Turn, cancelled=lambda: False, poll_s: float = 0.05):
        """Every reply's outputs, merged in arrival order, until each has its final output (worker thread).

        One small reader thread per request forwards its handle into the turn's queue, so N replies need
        nothing beyond the worker's public API; `cancelled()` is polled so a quitting app never waits here.
        A stream left early can be taken up again: what arrived meanwhile waits in the queue."""
        if turn.merged is None:
            turn.merged = queue.Queue()

            def forward(handle):
                for out in handle:
                    turn.merged.put(out)
                turn.merged.put(None)

            for h in turn.handles:
                threading.Thread(target=forward, args=(h,), daemon=True, name=f"reply-{h.request_id}").start()
        while turn.streaming and not cancelled():
            try:
                out = turn.merged.get(timeout=poll_s)
            except queue.Empty:
                continue
            if out is None:
                turn.streaming -= 1
            else:
                yield out

    def cancel(self, turn: Turn | None):
        if turn is None:
            return
        turn.cancelled = True
        for h in turn.handles:
            self.worker.cancel(h.request_id)

    def finish(self, turn: Turn, chosen: int = 0) -> None:
        """Add the turn to the history: the chosen reply, even a cancelled one's partial text. A turn whose
        requests all failed (a prompt longer than the context) leaves the history as it was."""
        if all(e is not None for e in turn.errors):
            return
        reply = turn.texts[chosen] if turn.errors[chosen] is None else next(
            t for t, e in zip(turn.texts, turn.errors) if e is None)
        if self.chat_mode:
            self.messages += [{"role": "user", "content": turn.user_text},
                              {"role": "assistant", "content": reply.strip()}]
        else:
            self.transcript += turn.user_text + reply
            self._last_piece, self._last_user = turn.user_text + reply, turn.user_text

    def undo_last(self) -> str | None:
        """Take the last turn back out of the history (to regenerate it); returns its user text."""
        if self.chat_mode:
            if len(self.messages) < 2:
                return None
            user = self.messages[-2]["content"]
            del self.messages[-2:]
            return user
        piece = self._last_piece
        if not piece or not self.transcript.endswith(piece):
            return None
        self.transcript = self.transcript[:-len(piece)]
        self._last_piece = ""
        return self._last_user

    def close(self):
        self.worker.close()
