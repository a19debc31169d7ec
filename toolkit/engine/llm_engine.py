"""The engine: requests in, a stream of tokens with their timings out, many requests at once.

    rid = engine.add_request(prompt_ids, SamplingParams(...))
    while engine.has_unfinished():
        for out in engine.step():      # one batched forward pass for every running request
            out.request_id, out.text, out.token, out.finish_reason, out.step, out.stats

One `step()`: read the options in force (a `set_options` lands here, between steps), let the
scheduler pick the requests and their token counts, stage the step and queue it (runner), then
wait for its tokens, append each one, detokenize, check the stop conditions and emit immutable
outputs. While decode steps follow one another, the next step is queued before that wait
(_launch_next), so the host's work overlaps the device's; a step's options are those read by the
call that queued it.

The engine belongs to one thread: KV blocks, queues and the CUDA stream are not guarded by locks.
A second thread gets a clear error; `EngineWorker` (worker.py) is how a UI drives it from another
thread.
"""
import threading
import time
from typing import Iterator, NamedTuple

import numpy as np

from ..errors import ToolkitError
from toolkit.engine.options import EngineOptions
from toolkit.model.sparse import merge_paths, request_path, step_path
from ..sampler.state import RequestSampling, bad_word_ids
from toolkit.engine.timings import RequestStats, StepTiming
from .block_manager import BlockManager
from .runner import NAN_LOGITS, NO_TOKEN, ModelRunner
from .scheduler import DEFAULT_POLICY, Scheduler
from .sequence import SamplingParams, Sequence
from .stops import flush, stop_strings


class RequestOutput(NamedTuple):
    """What one step produced for one request (mlx-lm's GenerationResponse, batched). Immutable; a NamedTuple
    for the host time, as RequestStats (timings.py)."""
    request_id: str
    token: int | None  # the sampled id (None for an abort or an error)
    text: str  # new text to show (may be "" while a UTF-8 character is incomplete)
    finish_reason: str | None  # None while running; "stop", "length", "abort" or "error"
    step: StepTiming | None
    stats: RequestStats
    error: str | None = None
    seed: int | None = None  # the request's sampling seed (drawn at random when it gave none)
    logprobs: dict | None = None  # with params.logprobs: {"token", "logprob", "rank", "top": [[id, logprob], ...]}


class _Launched(NamedTuple):
    """A step queued on the device, until its tokens are collected."""
    seqs: list
    num_new: list  # tokens fed per row
    live: list | None  # per row, whether its request still runs (None: a scheduled step, every row)
    batch: object  # the StepBatch
    handle: object  # runner.InFlight
    due: list  # rows that pick a token
    options: EngineOptions
    cached_tokens: int
    t0: float  # perf_counter when its scheduling began
    commits: tuple  # (seq, num_tokens): prefix-cache keys to make once the step before has its tokens


class LLMEngine:
    def __init__(self, cfg, weights, backend, *, max_context: int, num_blocks: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int, options: EngineOptions = EngineOptions(),
                 tokenizer=None, chat_template=None, device_note: str = "", scheduler_policy: str = DEFAULT_POLICY):
        self.cfg, self.backend, self.weights = cfg, backend, weights
        self.tokenizer, self.chat_template, self.device_note = tokenizer, chat_template, device_note
        self.max_context, self.block_size = max_context, block_size
        self.kv_cache_tokens = num_blocks * block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.weight_bytes = weights.nbytes()
        self.block_manager = BlockManager(num_blocks, block_size, options.prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens, scheduler_policy)
        self.runner = ModelRunner(cfg, weights, backend, max_context, max_num_seqs, max_num_batched_tokens,
                                  num_blocks, block_size)
        options.validate()
        self.options = options  # as requested: effective_options() is what steps run
        self._seqs: dict = {}  # request id -> Sequence, until its final output is emitted
        self._done_now: list = []  # outputs due at the next step() that no forward pass produces
        self._step_index = 0
        # Whether a step is queued ahead (_launch_next): where launches return before the work is done. The CPU
        # backend computes as it launches, so queuing ahead would only reorder its work (tests turn it on there).
        self.queue_ahead = backend.asynchronous
        self._ahead = None  # the step queued on the device before the last one's tokens came back (_launch_next)
        self._error = None  # an exception from that launch, raised by the next step()
        self._last_tokens = 0.0  # perf_counter when the last step's tokens came back
        self._owner = None
        self._eos = frozenset(tokenizer.eos_ids) if tokenizer is not None else frozenset()

    # -- options --------------------------------------------------------------------------------------
    def set_options(self, options: EngineOptions):
        """Takes effect at the next step boundary (any thread may call this: it is one assignment)."""
        options.validate()
        self.options = options

    def effective_options(self) -> EngineOptions:
        """The options as they run on this backend (a toggle it cannot run reads as off)."""
        return self.options.effective(self.backend)

    # -- requests -------------------------------------------------------------------------------------
    def _check_thread(self):
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise RuntimeError("LLMEngine is used from a second thread; it belongs to the thread that first "
                               "used it. Drive it from other threads through toolkit.engine.worker.EngineWorker.")

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue a request; raises ToolkitError (and queues nothing) if it can never run."""
        self._check_thread()
        params = params or SamplingParams()
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise ToolkitError("the prompt is empty (no tokens)")
        if len(ids) >= self.max_context:
            raise ToolkitError(f"the prompt has {len(ids)} tokens but the context holds {self.max_context} "
                               f"({self.cfg.context_hint(self.max_context, 'shorten the prompt')})")
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            raise ToolkitError(f"token id {bad[0]} is outside the vocabulary [0, {self.cfg.vocab_size})")
        need = self.block_manager.blocks_for(len(ids) + 1)
        if need > self.block_manager.num_blocks:
            raise ToolkitError(f"the prompt needs {need * self.block_size} KV-cache slots but the cache has "
                               f"{self.kv_cache_tokens} (raise --kv-cache-tokens)")
        if request_id is not None and request_id in self._seqs:
            raise ToolkitError(f"request id {request_id!r} is already in use")
        params.check_vocab(self.cfg.vocab_size)
        seq = Sequence(ids, params, request_id or "")
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self._eos))
        seq.sampling = RequestSampling(params, ids, self.cfg.vocab_size, seq.seed, stop_ids,
                                       bad_word_ids(params.bad_words, self.tokenizer))
        if self.tokenizer is not None:
            from toolkit.text.detokenizer import StreamingDetokenizer
            seq.detokenizer = StreamingDetokenizer(self.tokenizer)
        self._seqs[seq.request_id] = seq
        if params.max_tokens == 0:
            self._finish(seq)
            self._done_now.append(self._output(seq, None, "", None, "length"))
        else:
            self.scheduler.add(seq)
        return seq.request_id

    def abort(self, request_id: str):
        """Stop a request; its final output (finish_reason "abort") comes with the next step()."""
        self._check_thread()
        seq = self._seqs.get(request_id)
        if seq is None:  # unknown, or finished already (_finish forgets it)
            return
        self._finish(seq)
        self._done_now.append(self._output(seq, None, "", None, "abort"))

    def detach_thread(self):
        """Hand the engine over: the next thread to use it becomes its owner (EngineWorker does this)."""
        self._owner = None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._done_now) or self._ahead is not None

    # -- the step -------------------------------------------------------------------------------------------
    def step(self) -> list:
        """Wait for the step on the device, and return what it produced. One step stays queued ahead where it
        can (see _launch_next): the host schedules and stages step N + 1 while the device runs step N."""
        self._check_thread()
        if self._error is not None:  # the last call's queued launch failed after its own step's tokens came back
            err, self._error = self._error, None
            raise err
        outputs, self._done_now = self._done_now, []
        options = self.effective_options()
        self.block_manager.prefix_caching = options.prefix_caching
        cur, self._ahead = self._ahead, None
        if cur is None:
            cur = self._launch(options, outputs)
            if cur is None:
                return outputs
        try:
            self._ahead = self._launch_next(cur, options)
        except Exception as e:  # raised by the next call, so that cur's tokens are not lost with it
            self._error = e
        self._collect(cur, outputs)
        return outputs

    def _launch(self, options, outputs: list):
        """Schedule a step and queue it on the device (None: nothing can run)."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for seq in sched.out_of_memory:
            self._finish(seq)
            outputs.append(self._output(seq, None, "", None, "length", error="the KV cache cannot hold this request "
                                                                  "(raise --kv-cache-tokens)"))
        if not sched.seqs:
            return None
        seqs = sched.seqs
        batch = self.runner.prepare(seqs, sched.num_new, sched.num_decodes)
        due = [i for i, (s, n) in enumerate(zip(seqs, sched.num_new)) if s.num_computed + n == s.num_tokens]
        handle = self.runner.launch(batch, options, [s.sampling for s in seqs], due)
        return _Launched(seqs, sched.num_new, None, batch, handle, due, options, sched.cached_tokens, t0, ())

    def _launch_next(self, cur, options):
        """Queue the decode step after `cur` before cur's tokens are on the host (vLLM's asynchronous scheduling).

        The host's work for a step (schedule, stage, then outputs and detokenising) used to run while the device
        idled: ~0.7 ms a step at batch 256 against ~2 ms on the device (experiments/NOTEBOOK.md, "Where does a
        throughput run's wall time go"). Here the next step needs only cur's tokens, and those the device copies
        into its input itself (runner.launch(feed=True)). That holds when cur is a pure decode step, no waiting
        request can be admitted (none waits, or every seat stays taken: more requests than max_num_seqs), every
        running request is in cur, and no request's sampling reads its own output (penalties,
        bad words, min_tokens) or asks for logprobs. A request that ends with cur by its length is left out of the
        next step (a padding row); one that ends by a stop token, which only its token tells, wastes its row, and
        its output is dropped. When enough rows have ended that a smaller graph bucket would do, None: the next
        call schedules a compact step."""
        waiting = bool(self.scheduler.waiting)
        # A waiting request is admitted as soon as a seat is free: then the scheduler decides the next step.
        if (not self.queue_ahead or cur.batch.kind != "decode" or cur.handle.lp is not None
                or (waiting and len(self.scheduler.running) < self.max_num_seqs)):
            return None
        t0 = time.perf_counter()
        live, alive = [], 0
        for seq, was in zip(cur.seqs, cur.live or [True] * len(cur.seqs)):
            ok = was and self._seqs.get(seq.request_id) is seq
            if ok:
                alive += 1
                smp, p = seq.sampling, seq.params
                if smp.use_penalties or smp.bad_words or p.min_tokens or p.logprobs is not None:
                    return None
                n = len(seq.token_ids) + 1  # its tokens once cur's is kept
                ok = n - len(seq.prompt_ids) < p.max_tokens and n < self.max_context
            live.append(ok)
        runner, n_live = self.runner, sum(live)
        if (not n_live or alive != len(self.scheduler.running) or (waiting and n_live < alive)
                or runner.padded_rows(n_live) != runner.padded_rows(len(live))):
            return None
        bm, bs = self.block_manager, self.block_size
        pos = cur.batch.positions.tolist()  # each row's position in cur (its num_computed: cur is not collected)
        grow = [seq for seq, ok, p in zip(cur.seqs, live, pos) if ok and p + 2 > len(seq.block_table) * bs]
        if len(grow) > bm.num_free:  # room is made by preempting, which only the scheduler does
            return None
        for seq in grow:
            bm.append_slots(seq, 2)  # cur's token and the next one's
        # Blocks the next step fills are keyed once cur's token, the last of them, is known (_collect).
        commits = tuple((seq, p + 2) for seq, ok, p in zip(cur.seqs, live, pos)
                        if ok and (p + 2) // bs > len(seq.block_hashes))
        batch = runner.prepare_next(cur.batch, cur.seqs, live)
        rows = [i for i, ok in enumerate(live) if ok]
        handle = runner.launch(batch, options, [s.sampling if ok else None for s, ok in zip(cur.seqs, live)], rows,
                               feed=True)
        return _Launched(cur.seqs, [1] * len(live), live, batch, handle, rows, options, 0, t0, commits)

    def _collect(self, cur, outputs: list):
        """Wait for cur's tokens; append, detokenize and stop-check them; emit cur's outputs."""
        res = self.runner.collect(cur.handle)
        now = time.perf_counter()  # the tokens are back
        options, batch, live = cur.options, cur.batch, cur.live
        # Host time per request per step bounds a large batch (the GPU waits for it): each request is visited
        # twice here, not five times as before (experiments/NOTEBOOK.md, "Where does a throughput run's wall time go").
        produced, t_detok = [], 0.0
        for i, (seq, n, tok, lp) in enumerate(zip(cur.seqs, cur.num_new, res.tokens.tolist(), res.logprobs)):
            if (live is not None and not live[i]) or self._seqs.get(seq.request_id) is not seq:
                continue  # a padding row, or a request aborted (or stopped) while this step was queued
            decoding = n == 1 and seq.num_computed >= len(seq.prompt_ids)  # read before num_computed moves
            seq.num_computed += n
            if tok == NO_TOKEN:
                produced.append((i, seq, decoding, None))
                continue
            if tok == NAN_LOGITS:  # a numerical fault ends this request only
                self._finish(seq)
                outputs.append(self._output(seq, None, "", None, "error",
                                            error="the model produced NaN logits (check the weights and --dtype)"))
                produced.append((i, seq, decoding, None))
                continue
            if seq.detokenizer is None:
                text, finish = self._append(seq, tok)
            else:
                td = time.perf_counter()
                text, finish = self._append(seq, tok)
                t_detok += time.perf_counter() - td
            produced.append((i, seq, decoding, (tok, text, finish, lp)))
        if self._ahead is not None:
            for seq, upto in self._ahead.commits:
                if self._seqs.get(seq.request_id) is seq and len(seq.token_ids) >= upto:
                    self.block_manager.commit(seq, upto)
        # A step's wall time: from its scheduling, or from the step before's tokens if it was queued before they
        # came, to its own tokens. Summed over steps, the run's wall time; per step, the time between tokens.
        wall = (now - max(cur.t0, self._last_tokens)) * 1e3
        self._last_tokens = now
        path = step_path(batch.prefill_lens, options)
        n_rows = len(produced) if live is not None else batch.num_seqs
        timing = StepTiming(self._step_index, batch.kind, batch.num_tokens if live is None else n_rows, n_rows, wall,
                            res.gpu_ms, res.sections, res.graph, res.options, cur.cached_tokens, t_detok * 1e3,
                            res.sampler_path, res.sampler_why, res.sampler_bytes,
                            prefill_path=path, plan=res.plan, context_bucket=batch.context_bucket,
                            queued=live is not None)
        self._step_index += 1
        row_bytes = 4 * self.cfg.vocab_size if res.sampler_path == "slow" else 0  # a sampled row's FP32 copy
        due_rows = set(cur.due)
        for i, seq, is_decode, out in produced:
            st = seq.stats
            if is_decode:
                st.decode_ms_total += wall
                st.decode_steps += 1
            else:
                st.prefill_ms += wall
                st.prefill_gpu_ms += res.gpu_ms
                st.prefill_path = merge_paths(st.prefill_path, request_path(seq.num_computed, options, path))
            if i in due_rows:
                st.add_sampler_step(res.sampler_path, row_bytes)
            if out is None:
                continue
            tok, text, finish, lp = out
            if st.generated_tokens == 0 and st.ttft_ms == 0:
                st.ttft_ms = (now - st.arrival) * 1e3
            if finish != "stop":
                st.generated_tokens += 1
            if finish:
                self._finish(seq)
            outputs.append(self._output(seq, tok, text, timing, finish, logprobs=lp))

    def _append(self, seq: Sequence, tok: int):
        """Take a sampled token: stop on EOS / stop ids / stop strings, else keep it and return its text."""
        p = seq.params
        if (tok in self._eos and not p.ignore_eos) or tok in p.stop_token_ids:
            return flush(seq, ""), "stop"
        seq.token_ids.append(tok)
        seq.sampling.on_token(tok)
        text = seq.detokenizer.add_token(tok) if seq.detokenizer is not None else ""
        n = len(seq.token_ids)  # (seq.num_tokens; num_generated is n - len(prompt_ids): read once, per token)
        finish = "length" if n - len(seq.prompt_ids) >= p.max_tokens or n >= self.max_context else None
        if finish:  # held-back text moves into `text`, where stop_strings still searches it
            text = flush(seq, text)
        if p.stop:
            if seq.num_generated < p.min_tokens:  # stop strings count only from min_tokens on
                seq.text += text
                return text, finish
            text, hit = stop_strings(seq, text, final=finish is not None)
            return text, "stop" if hit else finish
        return text, finish

    def _finish(self, seq: Sequence):
        self.scheduler.remove(seq)
        self._seqs.pop(seq.request_id, None)

    def _output(self, seq, tok, text, timing, finish, error=None, logprobs=None) -> RequestOutput:
        return RequestOutput(seq.request_id, tok, text, finish if not error else "error", timing,
                             seq.stats.snapshot(), error, seq.seed, logprobs)

    # -- conveniences ---------------------------------------------------------------------------------------
    def generate(self, prompt_ids, params: SamplingParams | None = None, **kw) -> Iterator[RequestOutput]:
        """One request, start to finish: a thin loop over add_request/step (the engine must be idle)."""
        if self.has_unfinished():
            raise ToolkitError("generate() needs an idle engine; use add_request/step for concurrent requests")
        rid = self.add_request(prompt_ids, params or SamplingParams(**kw))
        while self.has_unfinished():
            for out in self.step():
                if out.request_id == rid:
                    yield out

    def logits(self, ids, chunk: int | None = None) -> np.ndarray:
        """fp32 logits [T, V] at every position of `ids`, prefilled in chunks through the paged cache."""
        return self.score(ids, chunk=chunk)[0]

    def score(self, ids, decode_ids=(), chunk: int | None = None) -> tuple:
        """Prefill `ids` (logits at every position), then feed `decode_ids` one token per step through the
        decode path; returns (prompt logits [T, V], decode logits [len(decode_ids), V]). Tests, perplexity."""
        self._check_thread()
        if self.has_unfinished():
            raise ToolkitError("score() needs an idle engine")
        ids = [int(i) for i in ids] + [int(i) for i in decode_ids]
        if not 0 < len(ids) < self.max_context:
            raise ToolkitError(f"score: {len(ids)} tokens do not fit the context of {self.max_context}")
        seq = Sequence(ids, SamplingParams())
        bm, run = self.block_manager, self.runner
        chunk = min(chunk or self.max_num_batched_tokens, self.max_num_batched_tokens)
        n_prompt = len(ids) - len(decode_ids)
        logits_dev = self.backend.empty((chunk, self.cfg.vocab_size), np.float32)
        out = []
        opts = self.effective_options()
        try:
            while seq.num_computed < len(ids):
                left = (n_prompt if seq.num_computed < n_prompt else len(ids)) - seq.num_computed
                n = min(left, chunk)
                if bm.needed(seq, n) > bm.num_free:
                    raise ToolkitError("score: the KV cache is too small for this sequence")
                bm.append_slots(seq, n)
                batch = run.prepare([seq], [n], int(n == 1 and seq.num_computed >= n_prompt))
                run.forward_all_rows(batch, logits_dev, opts)
                out.append(self.backend.to_host(logits_dev[:n]))
                seq.num_computed += n
        finally:
            bm.release(seq)
        all_rows = np.concatenate(out)
        return all_rows[:n_prompt], all_rows[n_prompt:]
