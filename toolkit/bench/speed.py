"""Prefill and decode speed, llama-bench style, through the engine's public API.

- `ppL`: one request of L random tokens that generates one token. Its time is
  the device time (`StepTiming.gpu_ms`) of the step that prefills it, or, where
  L is over `--max-num-batched-tokens` C, of the ceil(L / C) steps of its chunked
  prefill summed (`RequestStats.prefill_gpu_ms`; a note says so): how much the
  chunking costs against one step.
- `tgN@bB dD`: B requests, each with a prompt of max(D, 1) random tokens. Once
  every request has its first token (the prefill, untimed), the next N steps are
  timed, and the requests are aborted. A repeat's time is the median `gpu_ms`
  of those steps that are pure decode at the full batch (kind "decode", B
  sequences; a preemption would break that). Waiting for the whole batch rather
  than giving each request N tokens matters: with chunked prefill the first
  requests start decoding while later ones still prefill, and would finish
  before the batch is ever whole. The early ones decode a few tokens meanwhile
  (`slack` in `Test.context`), which the context and KV sizing include.

Every run draws fresh random prompts, so the prefix cache never hits and each
test measures the cold path whatever `--prefix-caching` says. Decode reads all
weights plus every sequence's K/V once per step; that byte count over the step
time is the achieved bandwidth set against the HBM roofline (K/V counted at the
prompt plus half the timed steps: a slight undercount where early requests ran
ahead). A prefill's dense-equivalent FLOPs over its time give its TFLOPS. A test
the engine cannot hold (context, KV budget, batch limit) is skipped with a note.
"""
import statistics
from dataclasses import dataclass

import numpy as np

from ..engine.build import BLOCK_SIZE as BLOCK
from ..engine.sequence import SamplingParams
from ..errors import ToolkitError
from .sweep import mean_std, switches_label

MIN_STEP_TOKENS = 2048


@dataclass(frozen=True)
class Test:
    kind: str  # "prefill" or "decode"
    length: int = 0  # prefill tokens
    batch: int = 1
    depth: int = 0
    steps: int = 0  # decode steps

    @property
    def name(self) -> str:
        return f"pp{self.length}" if self.kind == "prefill" else f"tg{self.steps}@b{self.batch} d{self.depth}"

    @property
    def prompt_len(self) -> int:
        return self.length if self.kind == "prefill" else max(self.depth, 1)

    def context(self, step_tokens: int) -> int:
        """Tokens one sequence needs in the cache when a step feeds at most step_tokens tokens."""
        if self.kind == "prefill":
            return self.length + 1
        # Steps until the last prompt is prefilled; each earlier request decodes one token per step.
        slack = -(-self.batch * self.prompt_len // max(step_tokens - self.batch, 1)) + 1
        return self.prompt_len + slack + self.steps


def plan(prefill, batches, depths, decode) -> list[Test]:
    """The tests of the flags; a prefill length of 0 or 0 decode steps means none of that kind (llama-bench's -p 0,
    -n 0)."""
    return ([Test("prefill", length=n) for n in prefill if n]
            + [Test("decode", batch=b, depth=d, steps=decode) for d in depths for b in batches if decode])


def engine_sizes(tests, context_limit, max_seqs=None, step_tokens=None, max_context=None, kv_tokens=None) -> tuple:
    """(max_num_seqs, max_num_batched_tokens, max_context, kv_cache_tokens) that hold `tests`; a given value stays."""
    max_seqs = max_seqs or max(t.batch for t in tests)
    # One step must hold the longest prefill; at least MIN_STEP_TOKENS keeps the untimed depth prefill short.
    longest = max([t.length for t in tests if t.length < context_limit] or [0])
    step_tokens = step_tokens or max(longest, MIN_STEP_TOKENS, max_seqs)
    max_context = max_context or min(context_limit, max(t.context(step_tokens) for t in tests))
    fits = [t for t in tests if t.context(step_tokens) <= max_context]
    kv_tokens = kv_tokens or max(  # whole blocks
        [t.batch * (-(-t.context(step_tokens) // BLOCK) + 1) * BLOCK for t in fits] or [max_context + BLOCK])
    return max_seqs, step_tokens, max_context, kv_tokens


def peer_sizes(tests, step_tokens) -> tuple[int, int]:
    """(max_batch, max_seq_len) of the peer's static cache for `tests`: every row holds the longest context."""
    return max([t.batch for t in tests] or [1]), max([t.context(step_tokens) for t in tests] or [2])


def skip_reason(engine, t: Test) -> str | None:
    need = t.context(engine.max_num_batched_tokens)
    if need > engine.max_context:
        return f"needs {need} tokens of context; the engine has {engine.max_context} " \
               f"({engine.cfg.context_hint(engine.max_context)})"
    if t.batch * need > engine.kv_cache_tokens:
        return f"needs {t.batch} x {need} KV tokens; the budget is {engine.kv_cache_tokens} (--kv-cache-tokens)"
    if t.batch > engine.max_num_seqs:
        return f"batch {t.batch} > --max-num-seqs {engine.max_num_seqs}"
    return None


def prefill_flops(cfg, length: int) -> float:
    """Dense-equivalent FLOPs of a prefill (the sparse prefill skips some): the projections and MLP of every token,
    causal attention (QK^T and PV over length (length + 1) / 2 pairs), and the lm_head of the last token."""
    per_token = 2 * cfg.hidden_size * (cfg.qkv_size + cfg.num_heads * cfg.head_dim + 3 * cfg.intermediate_size)
    attention = 4 * cfg.num_heads * cfg.head_dim * length * (length + 1) / 2
    return cfg.num_layers * (length * per_token + attention) + 2 * cfg.hidden_size * cfg.vocab_size


def decode_bytes(engine, t: Test) -> float:
    """Bytes one decode step reads: all weights, plus K/V of each sequence at its mean timed length."""
    cfg, mean_ctx = engine.cfg, t.prompt_len + (t.steps + 1) / 2
    kv_per_tok = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (4 if engine.backend.dtype == "float32" else 2)
    return engine.weight_bytes + t.batch * mean_ctx * kv_per_tok


def _step(engine) -> list:
    outs = engine.step()
    for out in outs:
        if out.error:
            raise ToolkitError(f"bench request failed: {out.error}")
    return outs


def measure(engine, t: Test, rng) -> tuple:
    """One run of a test: (device ms, wall ms, steps it is timed over, the options they ran with)."""
    prompts = [rng.integers(0, engine.cfg.vocab_size, t.prompt_len) for _ in range(t.batch)]
    if t.kind == "prefill":
        engine.add_request(prompts[0], SamplingParams(max_tokens=1, ignore_eos=True))
        first, n_steps = None, 0
        while engine.has_unfinished():
            outs = _step(engine)
            n_steps += 1
            first = first or next((out for out in outs if out.token is not None), None)
        chunks = -(-t.length // engine.max_num_batched_tokens)
        if first is None or first.stats.cached_tokens or n_steps != chunks:
            raise ToolkitError(f"{t.name}: the prompt was not prefilled in {chunks} step(s) of up to "
                               f"{engine.max_num_batched_tokens} tokens")
        return first.stats.prefill_gpu_ms, first.stats.prefill_ms, n_steps, first.step.options
    params = SamplingParams(max_tokens=t.context(engine.max_num_batched_tokens) - t.prompt_len, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    started, timed = set(), []
    while engine.has_unfinished() and len(timed) < t.steps:
        whole = len(started) == t.batch
        outs = _step(engine)
        started.update(out.request_id for out in outs if out.token is not None)
        if whole and outs:
            timed.append(outs[0].step)
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    pure = [s for s in timed if s.kind == "decode" and s.n_seqs == t.batch]
    if not pure:
        raise ToolkitError(f"{t.name}: no pure decode step at batch {t.batch}")
    return (statistics.median(s.gpu_ms for s in pure), statistics.median(s.wall_ms for s in pure), len(pure),
            pure[-1].options)


def make_row(t: Test, impl: str, switches, ms: list, wall: list | None, n_steps, bytes_per_step, peak,
             flops=None) -> dict:
    tokens = t.length if t.kind == "prefill" else t.batch
    ms_m, ms_s = mean_std(ms)
    tps_m, tps_s = mean_std(tokens * 1e3 / x for x in ms)
    row = {"test": t.name, "kind": t.kind, "impl": impl, "switches": switches,
           "batch": t.batch, "depth": t.depth if t.kind == "decode" else 0,
           "prefill": t.length, "decode": t.steps, "repeats": len(ms),
           "ms": ms_m, "ms_std": ms_s, "wall_ms": None, "wall_ms_std": None,
           "tok_per_s": tps_m, "tok_per_s_std": tps_s, "timed_steps": n_steps,
           "gb_per_s": None, "hbm_pct": None, "tflops": flops and flops / (ms_m / 1e3) / 1e12, "vs_peer": None}
    if wall:
        row["wall_ms"], row["wall_ms_std"] = mean_std(wall)
    if bytes_per_step:
        row["gb_per_s"] = bytes_per_step / (ms_m / 1e3) / 1e9
        if peak:
            row["hbm_pct"] = 100 * row["gb_per_s"] / peak
    return row


def failure(e: Exception) -> str:
    """An exception in one line: its type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def run_speed(engine, tests, grid, repeats, warmup, peak, peer=None) -> tuple[list[dict], list[str]]:
    """Rows grouped by test: one per switch setting, then the peer's, with the ours/peer speed ratio. Without an
    engine (`--peer-only`) the peer's rows alone, without GB/s (the byte count takes our engine's weights)."""
    rng = np.random.default_rng(0)
    rows, notes = [], []
    cfg = (engine or peer.model).cfg
    for t in tests:
        why = engine and skip_reason(engine, t)
        if why:
            notes.append(f"skipped {t.name}: {why}")
            continue
        nbytes = decode_bytes(engine, t) if engine and t.kind == "decode" else None
        flops = prefill_flops(cfg, t.length) if t.kind == "prefill" else None
        ours = []
        for opts in grid:
            engine.set_options(opts)
            runs = [measure(engine, t, rng) for _ in range(warmup + repeats)][warmup:]
            eff = runs[-1][3]  # as the steps ran them (a switch the backend cannot honour reads as off)
            ours.append(make_row(t, "toolkit", eff.as_dict(), [r[0] for r in runs], [r[1] for r in runs],
                                 min(r[2] for r in runs), nbytes, peak, flops))
            if t.kind == "decode" and ours[-1]["timed_steps"] < t.steps:
                notes.append(f"{t.name} ({switches_label(eff)}): only {ours[-1]['timed_steps']} of {t.steps} steps "
                             "were pure decode at the full batch (preemption?)")
        if ours and t.kind == "prefill" and ours[0]["timed_steps"] > 1:
            notes.append(f"{t.name}: a chunked prefill, {ours[0]['timed_steps']} steps of up to "
                         f"{engine.max_num_batched_tokens} tokens (--max-num-batched-tokens); its time is theirs "
                         "summed")
        rows += ours
        if peer is not None:
            try:
                ms = (peer.prefill_ms(t.length, repeats) if t.kind == "prefill"
                      else peer.decode_ms_per_step(t.batch, t.depth, t.steps, repeats))
            except Exception as e:  # e.g. torch.OutOfMemoryError: our rows stand, the cell gets no ratio
                notes.append(f"peer skipped {t.name}: {failure(e)}")
                continue
            prow = make_row(t, peer.label, None, list(ms), None, None, nbytes, peak, flops)
            for r in ours:
                r["vs_peer"] = r["tok_per_s"] / prow["tok_per_s"]
            rows.append(prow)
    return rows, notes
