"""`python -m toolkit generate`: batch generation from prompts or a JSONL file.

Every request goes through the scheduler at once (continuous batching). JSONL mode writes each
record as its request finishes (flushed, with its `id`), so a long batch can be followed with
`tail -f`; text mode prints completions in input order, and with a single prompt streams it token
by token. A timing summary per request goes to stderr, and a progress bar too when stderr is a
terminal. A bad request (unparsable line, prompt longer than the context, one the KV cache
cannot hold) becomes an error record; the rest of the batch still runs.
"""
import argparse
import json
import sys

from ..assembly import build_engine
from ..engine import SamplingParams
from ..errors import ToolkitError
from ..requests import Request, from_jsonl, from_prompts
from .common import add_engine_args, add_model_args, engine_kwargs, non_negative_float, non_negative_int, run
from .progress import Progress

DEFAULT_MAX_TOKENS = 256


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit generate",
                                description="Generate text for one or more prompts.")
    p.add_argument("prompts", nargs="*", help="prompts (one request each)")
    p.add_argument("--prompts-file", metavar="FILE.jsonl",
                   help='JSONL requests, one {"prompt": ...} or {"messages": [...]} per line; - for stdin')
    add_model_args(p)
    p.add_argument("--max-tokens", type=non_negative_int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens to generate per request (default: {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 is greedy (default: 0)")
    p.add_argument("--seed", type=non_negative_int, default=None, help="sampling seed (default: random)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to plain prompts")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--output", metavar="FILE", help="write results here instead of stdout")
    add_engine_args(p)
    return p


def _read_requests(args) -> list[Request]:
    requests = from_prompts(args.prompts)
    if args.prompts_file == "-":
        requests += from_jsonl(sys.stdin)
    elif args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                requests += from_jsonl(f)
        except OSError as e:
            raise ToolkitError(f"{args.prompts_file}: {e.strerror}") from None
    return requests


def prompt_ids(engine, req: Request, chat: bool) -> list[int]:
    messages = req.messages
    if messages is None and chat:
        messages = [{"role": "user", "content": req.prompt}]
    if messages is None:
        return engine.tokenizer.encode(req.prompt)
    if engine.chat_template is None:
        raise ToolkitError("this model has no chat template (needed for --chat and \"messages\")")
    # The template writes BOS and role markers itself, so no special tokens are added here.
    return engine.tokenizer.encode(engine.chat_template.render(messages), add_special_tokens=False)


def _params(req: Request, args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens if req.max_tokens is None else req.max_tokens,
                          temperature=args.temperature if req.temperature is None else req.temperature,
                          seed=args.seed if req.seed is None else req.seed)


def summary(engine, rid: str, stats) -> str:
    gbps = engine.weight_bytes * stats.decode_tps / 1e9
    cached = f", {stats.cached_tokens} from the prefix cache" if stats.cached_tokens else ""
    return (f"[{rid}] prompt {stats.prompt_tokens} tok{cached}, {stats.prefill_tps:.1f} tok/s | "
            f"decode {stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s, "
            f"{stats.ms_per_step:.2f} ms/step, {gbps:.1f} GB/s of weights")


class _Run:
    """The requests of one `generate` call, from submission to their records."""

    def __init__(self, engine, requests, args, out):
        self.engine, self.requests, self.args, self.out = engine, requests, args, out
        self.records = [None] * len(requests)
        self.parts = {}  # engine request id -> (index, ids, token list, text list)
        self.next_text = 0  # text mode prints records in input order
        self.failed = 0
        self.stream = args.format == "text" and len(requests) == 1

    def submit(self, progress):
        for i, req in enumerate(self.requests):
            try:
                if req.error:
                    raise ToolkitError(req.error)
                ids = prompt_ids(self.engine, req, self.args.chat)
                rid = self.engine.add_request(ids, _params(req, self.args), request_id=str(i))
                self.parts[rid] = (i, ids, [], [])
            except ToolkitError as e:
                msg = str(e) if str(e).startswith("line ") else f"request {req.id}: {e}"
                self.finish(i, {"id": req.id, "error": msg}, None, progress)

    def on_output(self, o, progress):
        i, ids, tokens, text = self.parts[o.request_id]
        if o.token is not None and o.finish_reason != "stop":
            tokens.append(o.token)
        text.append(o.text)
        if self.stream and o.text:
            self.out.write(o.text)
            self.out.flush()
        if progress:
            progress.tokens(1 if o.token is not None else 0)
        if o.finish_reason is None:
            return
        req = self.requests[i]
        if o.error:
            rec = {"id": req.id, "error": f"request {req.id}: {o.error}"}
        else:
            rec = {"id": req.id, "prompt": req.prompt if req.messages is None else req.messages,
                   "prompt_token_ids": [int(t) for t in ids], "token_ids": [int(t) for t in tokens],
                   "text": "".join(text), "finish_reason": o.finish_reason, "timings": o.stats.as_dict()}
        self.finish(i, rec, o.stats, progress)

    def finish(self, i, rec, stats, progress):
        if "error" in rec:
            self.failed += 1
            print(f"error: {rec['error']}", file=sys.stderr, flush=True)
        self.records[i] = (rec, stats)
        if progress:
            progress.done()
        if self.args.format == "jsonl":
            self.out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.out.flush()
            self._summary(rec, stats)
        else:  # text: in input order, each completion on its own line(s)
            while self.next_text < len(self.records) and self.records[self.next_text] is not None:
                r, st = self.records[self.next_text]
                if "error" not in r:
                    self.out.write(("" if self.stream else r["text"]) + "\n")
                    self.out.flush()
                self._summary(r, st)
                self.next_text += 1

    def _summary(self, rec, stats):
        if stats is not None:  # after the text's last newline, so the two streams don't interleave
            print(summary(self.engine, rec["id"], stats), file=sys.stderr, flush=True)


def _generate(args) -> int:
    requests = _read_requests(args)
    engine = build_engine(args.model, **engine_kwargs(args))
    print(engine.device_note, file=sys.stderr, flush=True)
    try:
        out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    except OSError as e:
        raise ToolkitError(f"--output {args.output}: {e.strerror}") from None
    job = _Run(engine, requests, args, out)
    try:
        with Progress(len(requests), enabled=sys.stderr.isatty() and not job.stream) as progress:
            job.submit(progress)
            while engine.has_unfinished():
                for o in engine.step():
                    job.on_output(o, progress)
    finally:
        if out is not sys.stdout:
            out.close()
    return 1 if job.failed else 0


def main(argv=None) -> int:
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if not args.prompts and not args.prompts_file:
        parser.error("give at least one prompt or --prompts-file")
    return run(lambda _: _generate(args), argv, args.debug)
