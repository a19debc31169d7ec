"""The requests of one `generate` run, from submission to their records.

JSONL mode writes each record as its request finishes (one write and a flush per line, so a reader
never sees half a record); text mode prints completions in input order, and with a single prompt
streams it token by token. Whatever ends the run early (SIGINT, SIGTERM, an internal error) leaves
the finished records as they are and accounts for every other request: JSONL gets one
`"finish_reason": "aborted"` record each, text mode lists them on stderr, so a script knows exactly
what to rerun. Only when the output itself has failed (a full disk, a reader that went away) is
nothing more written.
"""
import json
import sys

from ..engine import SamplingParams
from ..errors import ToolkitError
from toolkit.cli.requests import Request
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
            try:
                self.stream.close()
            except OSError:  # every record was flushed already; nothing is lost
                pass


def prompt_ids(engine, req: Request, chat: bool, special_in_content: bool = False) -> list[int]:
    messages = req.messages
    if messages is None and chat:
        messages = [{"role": "user", "content": req.prompt}]
    if messages is None:
        return engine.tokenizer.encode(req.prompt)
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


class Batch:
    def __init__(self, engine, requests: list[Request], args, sink: Sink):
        self.engine, self.requests, self.args, self.sink = engine, requests, args, sink
        self.jsonl = args.format == "jsonl"
        self.records = [None] * len(requests)  # (record, stats) once finished
        self.parts = {}  # engine request id -> (index, prompt ids, token list, text list)
        self.params = {}  # index -> (SamplingParams, the seed the engine drew or None, logprobs list or None)
        self.next_text = 0  # text mode prints records in input order
        self.failed = 0
        self.stream = not self.jsonl and len(requests) == 1
        self.streamed = False  # text already on stdout (streaming mode)

    def run(self, signals) -> int:
        """Submit everything, step the engine until done; signals are taken between steps."""
        try:
            with Progress(len(self.requests), enabled=sys.stderr.isatty() and not self.stream) as progress, \
                    signals.deferred():
                self.submit(progress, signals)
                while self.engine.has_unfinished():
                    signals.check()
                    for o in self.engine.step():
                        self.on_output(o, progress)
                signals.check()  # a signal during the last step still means "interrupted"
        except (OutputError, BrokenPipeError):
            raise  # the output is gone: there is nowhere to write the rest
        except BaseException:  # interrupted, or a bug: account for every request, then report it
            try:
                self.abort_unfinished()
            except (OSError, ToolkitError):
                pass
            raise
        return EXIT_SOME_FAILED if self.failed else EXIT_OK

    def submit(self, progress, signals):
        for i, req in enumerate(self.requests):
            signals.check()  # tokenizing a long batch takes a while: stay interruptible
            try:
                if req.error:
                    raise ToolkitError(req.error)
                ids = prompt_ids(self.engine, req, self.args.chat, self.args.allow_special_in_content)
                params = sampling_params(req, self.args, getattr(self.engine, "generation_defaults", None))
                rid = self.engine.add_request(ids, params, request_id=str(i))
                self.parts[rid] = (i, ids, [], [])
                self.params[i] = (params, params.seed, [] if params.logprobs is not None else None)
            except ToolkitError as e:
                msg = str(e) if req.error else f"request {req.id}: {e}"
                self.finish(i, {"id": req.id, "error": msg}, None, progress)

    def on_output(self, o, progress):
        i, ids, tokens, text = self.parts[o.request_id]
        params, seed, logprobs = self.params[i]
        if getattr(o, "seed", None) is not None:  # the seed the engine drew when the request gave none
            self.params[i] = params, o.seed, logprobs
        if o.token is not None and o.finish_reason != "stop":
            tokens.append(o.token)
            lp = getattr(o, "logprobs", None)
            if logprobs is not None and lp is not None:
                logprobs.extend(lp if isinstance(lp, list) else [lp])
        text.append(o.text)
        if self.stream and o.text:
            self.sink.write(o.text)
            self.streamed = True
        if progress:
            progress.tokens(1 if o.token is not None else 0)
        if o.finish_reason is None:
            return
        req = self.requests[i]
        if o.error:
            rec = {"id": req.id, "error": f"request {req.id}: {o.error}"}
        else:
            rec = self._record(req, ids, tokens, text, o.finish_reason, self.params.get(i))
            rec["timings"] = o.stats.as_dict()
        self.finish(i, rec, o.stats, progress)

    @staticmethod
    def _record(req, ids, tokens, text, finish_reason, used=None) -> dict:
        """`used`: (SamplingParams, seed used, logprobs or None), once the request was admitted."""
        rec = {"id": req.id, "prompt": req.prompt if req.messages is None else req.messages,
               "prompt_token_ids": [int(t) for t in ids], "token_ids": [int(t) for t in tokens],
               "text": "".join(text), "finish_reason": finish_reason}
        if used is not None:
            params, seed, logprobs = used
            rec["params"] = params.as_record(seed)
            if logprobs is not None:
                rec["logprobs"] = logprobs
        return rec

    def finish(self, i, rec, stats, progress):
        if "error" in rec:
            self.failed += 1
            say(f"error: {rec['error']}")
        self.records[i] = (rec, stats)
        if progress:
            progress.done()
        if self.jsonl:
            self.sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self._summary(rec, stats)
            return
        # text: in input order, each completion on its own line(s)
        while self.next_text < len(self.records) and self.records[self.next_text] is not None:
            r, st = self.records[self.next_text]
            if "error" not in r:
                self.sink.write(("" if self.stream else r["text"]) + "\n")
            self._summary(r, st)
            self.next_text += 1

    def _summary(self, rec, stats):
        if stats is not None:  # after the text's last newline, so the two streams don't interleave
            say(summary(self.engine, rec["id"], stats))

    def abort_unfinished(self):
        """The run ends early: an "aborted" record for each unfinished request (JSONL), or a list on
        stderr of every request whose completion was not printed (text, which keeps input order)."""
        by_index = {i: (ids, tokens, text) for i, ids, tokens, text in self.parts.values()}
        if self.jsonl:
            unfinished = [i for i, r in enumerate(self.records) if r is None]
            for i in unfinished:
                ids, tokens, text = by_index.get(i, ([], [], []))
                self.records[i] = (self._record(self.requests[i], ids, tokens, text, "aborted",
                                                self.params.get(i)), None)
                self.sink.write(json.dumps(self.records[i][0], ensure_ascii=False) + "\n")
            if unfinished:
                say(f"aborted: {len(unfinished)} unfinished request(s), each with a record whose "
                    'finish_reason is "aborted"')
            return
        if self.streamed:
            self.sink.write("\n")  # end the partial line
        missing = [self.requests[i].id for i in range(self.next_text, len(self.requests))]
        if missing:
            shown = ", ".join(missing[:50]) + (f" and {len(missing) - 50} more" if len(missing) > 50 else "")
            say(f"aborted: no output for request(s) {shown}")
