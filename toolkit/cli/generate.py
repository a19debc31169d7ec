"""`python -m toolkit generate`: batch generation from prompts or a JSONL file (or stream).

Requests are read as they arrive (feed.py) and run together as the scheduler admits them (continuous
batching); records.py writes their records (JSONL as each finishes, text in input order) and the timing
summaries on stderr. A bad request becomes an error record; the rest of the batch still runs.

The order matters for a user's time: flags are checked by argparse, then the input and output
files are opened (a wrong path is exit 2 in a fraction of a second, not after the model loads),
then the model loads, then requests are parsed (toolkit/cli/requests.py, which needs the context to
bound prompts) and run.
"""
import argparse
import os
import sys

from toolkit.engine.build import build_engine
from ..errors import ToolkitError
from toolkit.cli.requests import Limits, from_jsonl, from_prompts
from .common import add_engine_args, add_model_args, engine_kwargs, run, say, signals
from .feed import Feed
from .records import Batch, Sink
from .sampling_flags import add_sampling_args, check_against_model, check_sampling_args


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit generate",
                                description="Generate text for one or more prompts.")
    p.add_argument("prompts", nargs="*", help="prompts (one request each)")
    p.add_argument("--prompts-file", metavar="FILE.jsonl",
                   help='JSONL requests, one {"prompt": ...} or {"messages": [...]} per line; - for stdin')
    add_model_args(p)
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to plain prompts")
    p.add_argument("--format", choices=("text", "jsonl"), default="text")
    p.add_argument("--output", metavar="FILE", help="write results here instead of stdout")
    add_sampling_args(p)
    add_engine_args(p)
    return p


def _open_prompts(args):
    """The --prompts-file as a binary stream (lines are decoded one by one), or None."""
    if not args.prompts_file:
        return None
    if args.prompts_file == "-":
        if sys.stdin is None:
            raise ToolkitError("--prompts-file -: stdin is closed")
        return getattr(sys.stdin, "buffer", sys.stdin)
    try:
        return open(args.prompts_file, "rb")
    except OSError as e:
        raise ToolkitError(f"--prompts-file {args.prompts_file}: {e.strerror or e}") from None


def _open_output(args) -> Sink:
    """Opened before the model loads, so a wrong path costs nothing."""
    if not args.output:
        if sys.stdout is None:  # started with stdout closed (`>&-`): there is nowhere to write
            raise ToolkitError("stdout is closed (give --output FILE)")
        return Sink(sys.stdout, "stdout")
    if args.prompts_file and args.prompts_file != "-" and os.path.exists(args.output) \
            and os.path.exists(args.prompts_file) and os.path.samefile(args.output, args.prompts_file):
        raise ToolkitError(f"--output {args.output} is the --prompts-file: it would be emptied before it is read")
    try:
        return Sink(open(args.output, "w", encoding="utf-8"), f"--output {args.output}")
    except OSError as e:
        raise ToolkitError(f"--output {args.output}: {e.strerror or e}") from None


def _requests(args, source, limits: Limits):
    """The command-line prompts, then the file's requests as its lines are read (on the feed's thread)."""
    yield from from_prompts(args.prompts, limits)
    if source is not None:
        try:
            yield from from_jsonl(source, limits, taken_ids=[str(i) for i in range(len(args.prompts))])
        except OSError as e:
            raise ToolkitError(f"--prompts-file {args.prompts_file}: {e.strerror or e}") from None


def _generate(args) -> int:
    source = _open_prompts(args)
    sink = feed = None
    try:
        sink = _open_output(args)
        engine = build_engine(args.model, **engine_kwargs(args))
        say(engine.device_note)
        check_against_model(args, engine)
        feed = Feed(_requests(args, source, Limits(engine.max_context)), ahead=engine.max_num_seqs)
        batch = Batch(engine, feed, args, sink, headers=bool(args.prompts_file) or len(args.prompts) > 1)
        rc = batch.run(signals)
        if not batch.admitted:
            say(f"--prompts-file {args.prompts_file} holds no requests: nothing to do")
        return rc
    finally:
        if feed is not None:
            feed.close()  # before the file closes under its reader
        if source is not None and args.prompts_file != "-":
            source.close()
        if sink is not None:
            sink.close()


def main(argv=None) -> int:
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if not args.prompts and not args.prompts_file:
        parser.error("give at least one prompt or --prompts-file")
    check_sampling_args(parser, args)
    if args.logprobs is not None and args.format == "text":
        parser.error("--logprobs needs --format jsonl (text mode prints only the text)")
    return run(_generate, args)
