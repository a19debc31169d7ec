"""`python -m toolkit generate`: batch generation from prompts or a JSONL file.

Text mode streams each completion to stdout as it is produced and prints a
timing summary per request on stderr. JSONL mode writes one record per
request. A bad request (unparsable line, prompt longer than the context)
becomes an error record; the rest of the batch still runs.
"""
import argparse
import json
import sys

from ..engine import Engine
from ..errors import ToolkitError
from ..requests import Request, from_jsonl, from_prompts
from .common import add_model_args, non_negative_float, non_negative_int, run

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
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to plain prompts")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--output", metavar="FILE", help="write results here instead of stdout")
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


def _prompt_ids(engine: Engine, req: Request, chat: bool) -> list[int]:
    messages = req.messages
    if messages is None and chat:
        messages = [{"role": "user", "content": req.prompt}]
    if messages is None:
        return engine.tokenizer.encode(req.prompt)
    if engine.chat_template is None:
        raise ToolkitError("this model has no chat template (needed for --chat and \"messages\")")
    # The template writes BOS and role markers itself, so no special tokens are added here.
    return engine.tokenizer.encode(engine.chat_template.render(messages), add_special_tokens=False)


def _run_request(engine: Engine, req: Request, args, stream_to) -> tuple[dict, object]:
    ids = _prompt_ids(engine, req, args.chat)
    tokens, text, finish, stats = [], [], "length", None
    for r in engine.generate(ids, max_tokens=args.max_tokens if req.max_tokens is None else req.max_tokens,
                             temperature=args.temperature if req.temperature is None else req.temperature,
                             seed=args.seed if req.seed is None else req.seed):
        if r.finish_reason != "stop":
            tokens.append(r.token)
        text.append(r.text)
        if stream_to is not None and r.text:
            stream_to.write(r.text)
            stream_to.flush()
        finish, stats = r.finish_reason or finish, r.stats
    record = {"id": req.id, "prompt": req.prompt if req.messages is None else req.messages,
              "prompt_token_ids": [int(i) for i in ids], "token_ids": [int(t) for t in tokens],
              "text": "".join(text), "finish_reason": finish,
              "timings": stats.as_dict() if stats else {}}
    return record, stats


def _summary(engine: Engine, rid: str, stats) -> str:
    return (f"[{rid}] prompt {stats.prompt_tokens} tok, {stats.prefill_tps:.1f} tok/s | "
            f"decode {stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s, "
            f"{stats.ms_per_step:.2f} ms/step, {engine.gbps(stats):.1f} GB/s of weights")


def _generate(args) -> int:
    requests = _read_requests(args)
    engine = Engine.load(args.model, device=args.device, max_context=args.max_context, dtype=args.dtype)
    print(engine.device_note, file=sys.stderr, flush=True)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    failed = 0
    try:
        for req in requests:
            stats = None
            try:
                if req.error:
                    raise ToolkitError(req.error)
                record, stats = _run_request(engine, req, args, out if args.format == "text" else None)
            except ToolkitError as e:
                failed += 1
                msg = str(e) if str(e).startswith("line ") else f"request {req.id}: {e}"
                print(f"error: {msg}", file=sys.stderr, flush=True)
                record = {"id": req.id, "error": msg}
            if args.format == "jsonl":
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            elif "error" not in record:
                out.write("\n")
            out.flush()
            if stats is not None:  # after the text's last newline, so the two streams don't interleave
                print(_summary(engine, req.id, stats), file=sys.stderr, flush=True)
    finally:
        if out is not sys.stdout:
            out.close()
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if not args.prompts and not args.prompts_file:
        parser.error("give at least one prompt or --prompts-file")
    return run(lambda _: _generate(args), argv, args.debug)
