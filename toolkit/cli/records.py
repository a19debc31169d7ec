"""The requests of one `generate` run, from admission to their records.

Requests come from a Feed (feed.py) as their lines are read, and are admitted between engine steps
while fewer than --max-num-seqs are outstanding (admitted, their record not yet written): the
back-pressure that keeps an endless input in bounded memory, and the reason a slow producer gets
each result while it is still writing.

JSONL mode writes each record as its request finishes (one write and a flush per line, so a reader
never sees half a record). Text mode prints completions in input order (a finished one waits for
its turn, still outstanding), each after a `[id] prompt` header and followed by a blank line; a
single command-line prompt is streamed token by token, bare. Whatever ends the run early (SIGINT,
SIGTERM, an internal error) leaves the finished records as they are and accounts for every other
request read so far, with the text it has: JSONL gets one `"finish_reason": "aborted"` record each,
text mode prints the partial text marked `[aborted]`, so a script knows exactly what to rerun. Only
when the output itself has failed (a full disk, a reader that went away) is nothing more written.
"""
import contextlib
import json
import sys
from dataclasses import dataclass, field

from ..engine import SamplingParams
from ..errors import ToolkitError
from toolkit.cli.requests import Request
from toolkit.model.hub import is_terminal
from .common import EXIT_OK, EXIT_SOME_FAILED, OutputError, say
from .progress import Progress
from .sampling_flags import DEFAULT_MAX_TOKENS, flag_params


class Sink:
    """stdout or the --output file. A failed write becomes OutputError (one line, exit 2), except a
    closed pipe, which stays BrokenPipeError: its reader left on purpose (`| head -1`)."""

    def __init__(self, stream, name: str):
        self.stream, self.name = stream, name

    def write(self, text: str):
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:  # ValueError: the stream was closed under us
            raise OutputError(f"{self.name}: {getattr(e, 'strerror', None) or e}") from None

    def close(self):
        if self.stream is not sys.stdout:
            with contextlib.suppress(OSError):  # every record was flushed already; nothing is lost
                self.stream.close()


def prompt_ids(engine, req: Request, chat: bool, special_in_content: bool = False) -> list[int]:
    if req.messages is None and not chat:
        return engine.tokenizer.encode(req.prompt)
    messages = req.messages or [{"role": "user", "content": req.prompt}]  # "messages" is never an empty list
    if engine.chat_template is None:
        raise ToolkitError("this model has no chat template (needed for --chat and \"messages\")")
    # The template writes BOS and role markers itself; a special token's string in a content is text.
    return engine.chat_template.encode(messages, engine.tokenizer, special_in_content)


def sampling_params(req: Request, args, defaults: dict | None = None) -> SamplingParams:
    """The request's own fields, else the flags', else the model's generation_config.json (`defaults`);
    the combination is validated here (ToolkitError: that request's error record)."""
    return SamplingParams(**{"max_tokens": DEFAULT_MAX_TOKENS, **(defaults or {}), **flag_params(args),
                             **req.params})


def summary(engine, rid: str, stats) -> str:
    gbps = engine.weight_bytes * stats.decode_tps / 1e9
    cached = f", {stats.cached_tokens} from the prefix cache" if stats.cached_tokens else ""
    return (f"[{rid}] prompt {stats.prompt_tokens} tok{cached}, {stats.prefill_tps:.1f} tok/s | "
            f"decode {stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s, "
            f"{stats.ms_per_step:.2f} ms/step, {gbps:.1f} GB/s of weights")


@dataclass
class Pending:
    """One admitted request, until its record is written."""
    req: Request
    ids: list = field(default_factory=list)  # prompt token ids
    tokens: list = field(default_factory=list)
    text: list = field(default_factory=list)
    params: SamplingParams | None = None  # once admitted
    seed: int | None = None  # the seed used (the engine draws one when the request gives none)
    logprobs: list | None = None  # with params.logprobs
    done: tuple | None = None  # (record, stats) once finished: text mode holds it until its turn


def head(req: Request) -> str:
    """The header's prompt: its first 60 characters on one line (a conversation: its last message)."""
    text = " ".join((req.prompt if req.messages is None else req.messages[-1]["content"]).split())
    return text[:60] + ("..." if len(text) > 60 else "")


class Batch:
    def __init__(self, engine, feed, args, sink: Sink, headers: bool):
        """headers: the input may hold several requests (text mode then heads each completion)."""
        self.engine, self.feed, self.args, self.sink = engine, feed, args, sink
        self.jsonl = args.format == "jsonl"
        self.stream = not self.jsonl and not headers  # one prompt: its text goes out token by token
        self.headers = not self.jsonl and headers
        self.pending = {}  # input index -> Pending, in input order
        self.admitted, self.last = 0, None  # requests taken from the feed, and the latest
        self.next_text = 0  # text mode prints records in input order
        self.failed = 0

    def run(self, signals) -> int:
        """Admit what the feed has, step the engine, until both are done; signals are taken between steps."""
        try:
            show_bar = is_terminal(sys.stderr) and not self.stream
            with Progress() if show_bar else contextlib.nullcontext() as progress, signals.deferred():
                while True:
                    signals.check()
                    self.admit(progress)
                    if self.engine.has_unfinished():
                        for o in self.engine.step():
                            self.on_output(o, progress)
                    elif self.feed.done:
                        break
                signals.check()  # a signal during the last step still means "interrupted"
        except (OutputError, BrokenPipeError):
            raise  # the output is gone: there is nowhere to write the rest
        except BaseException:  # interrupted, or a bug: account for every request, then report it
            with contextlib.suppress(OSError, ToolkitError):
                self.abort_unfinished()
            raise
        return EXIT_SOME_FAILED if self.failed else EXIT_OK

    def admit(self, progress):
        """Take requests while fewer than max_num_seqs are outstanding; wait (briefly, to stay
        interruptible) only when the engine has nothing else to do."""
        while len(self.pending) < self.engine.max_num_seqs:
            req = self.feed.get(wait=not self.engine.has_unfinished())
            if req is None:
                return
            self.submit(self._take(req), progress)

    def _take(self, req: Request) -> int:
        i, self.admitted, self.last = self.admitted, self.admitted + 1, req
        self.pending[i] = Pending(req)
        return i

    def submit(self, i: int, progress):
        p = self.pending[i]
        if progress:
            progress.admitted()
        try:
            if p.req.error:
                raise ToolkitError(p.req.error)
            p.ids = prompt_ids(self.engine, p.req, self.args.chat, self.args.allow_special_in_content)
            params = sampling_params(p.req, self.args, getattr(self.engine, "generation_defaults", None))
            self.engine.add_request(p.ids, params, request_id=str(i))
            p.params, p.seed = params, params.seed
            p.logprobs = [] if params.logprobs is not None else None
        except ToolkitError as e:
            self.finish(i, self._error(p.req, e), None, progress)

    @staticmethod
    def _error(req: Request, e: Exception) -> dict:
        return {"id": req.id, "error": str(e) if req.error else f"request {req.id}: {e}"}

    def on_output(self, o, progress):
        i = int(o.request_id)
        p = self.pending[i]
        if o.seed is not None:  # the seed the engine drew when the request gave none
            p.seed = o.seed
        if o.token is not None and o.finish_reason != "stop":
            p.tokens.append(o.token)
            if p.logprobs is not None and o.logprobs is not None:
                p.logprobs.extend(o.logprobs if isinstance(o.logprobs, list) else [o.logprobs])
        p.text.append(o.text)
        if self.stream and o.text:
            self.sink.write(o.text)
        if progress:
            progress.tokens(1 if o.token is not None else 0)
        if o.finish_reason is None:
            return
        if o.error:
            rec = self._error(p.req, o.error)
        else:
            rec = self._record(p, o.finish_reason)
            rec["timings"] = o.stats.as_dict()
        self.finish(i, rec, o.stats, progress)

    @staticmethod
    def _record(p: Pending, finish_reason: str) -> dict:
        req = p.req
        rec = {"id": req.id, "prompt": req.prompt if req.messages is None else req.messages,
               "prompt_token_ids": [int(t) for t in p.ids], "token_ids": [int(t) for t in p.tokens],
               "text": "".join(p.text), "finish_reason": finish_reason}
        if p.params is not None:
            rec["params"] = p.params.as_record(p.seed)
            if p.logprobs is not None:
                rec["logprobs"] = p.logprobs
        return rec

    def finish(self, i, rec, stats, progress):
        if "error" in rec:
            self.failed += 1
            say(f"error: {rec['error']}")
        if progress:
            progress.done()
        if self.jsonl:
            del self.pending[i]
            self.sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self._summary(rec, stats)
            return
        self.pending[i].done = (rec, stats)
        while self.next_text in self.pending and self.pending[self.next_text].done:
            self._print(self.pending.pop(self.next_text))
            self.next_text += 1

    def _print(self, p: Pending):
        """Text mode: the header, the completion (an aborted one's partial text, then `[aborted]`), a blank line."""
        rec, stats = p.done
        if "error" not in rec:  # an error's line is on stderr already
            text = "" if self.stream else rec["text"]  # streamed: on stdout already
            if rec["finish_reason"] == "aborted":
                text += ("\n" if rec["text"] else "") + "[aborted]"
            self.sink.write((f"[{rec['id']}] {head(p.req)}\n" if self.headers else "") + text + "\n"
                            + ("\n" if self.headers else ""))
        self._summary(rec, stats)

    def _summary(self, rec, stats):
        if stats is not None:  # after the text's last newline, so the two streams don't interleave
            say(summary(self.engine, rec["id"], stats))

    def abort_unfinished(self):
        """The run ends early: every request read and not yet written (running, waiting for its turn,
        or still in the feed's queue) gets its record now, in text mode in input order."""
        for req in self.feed.close():
            self._take(req)
        unfinished = [i for i, p in self.pending.items() if p.done is None]
        for i in unfinished:
            p = self.pending[i]
            rec = self._error(p.req, p.req.error) if p.req.error else self._record(p, "aborted")
            self.finish(i, rec, None, None)
        if unfinished:
            mark = 'a record whose finish_reason is "aborted"' if self.jsonl else "its partial text marked [aborted]"
            rest = "" if self.feed.done else f"; the input after request {self.last.id} was not run"
            say(f"aborted: {len(unfinished)} unfinished request(s), each with {mark}{rest}")
