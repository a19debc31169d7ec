"""The model runner: a scheduled step in, one sampled token per request out.

    prepare(scheduled) -> StepBatch      host arrays: ids, positions, slots, qsl, seq_lens, block tables
    stager.stage(batch) -> DeviceStep    one copy into fixed device buffers, before anything launches
    sampler.prepare(...)                 host: the sampler's gate and its per-row inputs, staged likewise
    model.forward + sampler.sample       eager kernels, or the CUDA graph captured for this batch size
                                         (the sampler inside it); only B token ids come back
    launch(...) -> InFlight, collect()   queue all of that and return; wait for the ids later (the engine
                                         queues the next decode step in between: llm_engine._launch_next)

CUDA graphs: a pure decode step (every request feeds one token) is replayed from a graph captured
once per batch-size bucket (1, 2, 4, ..., 256) and context bucket (512, 1024, ..., max_context),
with the batch padded up to its bucket by rows that read and write nothing (KV slot -1, length 0).
A prefill step (prompt chunks, no decodes) of up to 2,048 tokens is replayed too, its tokens padded
to a token bucket by rows of no request and its requests to a batch bucket by empty ones.
On the GPU eager steps are padded the same way, and every step (eager or not) sizes decode
attention for its context bucket, so turning graphs off and on runs the very same kernels on the
very same shapes: the tokens cannot change, only the launch overhead does.
"""
import bisect
import time
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from toolkit.model.decoder import KVCache, Model
from toolkit.model.sparse import runs_dense
from ..sampler.sampler import ALL_STAGES, Sampler
from toolkit.engine.step import StepBatch, StepStager
from toolkit.engine.timings import NullTimer, in_order
from .block_manager import slot_mapping, table_array

GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A prefill step's token buckets. Eagerly, a step's ~220 launches (0.5B shape) take longer on the host than a few
# hundred tokens' kernels on the GPU: a 4,096-token prompt prefilled in chunks of 512 tokens took 43.0 ms of step
# time against 10.2 in one step, in chunks of 1,024 19.5 (H100, bench_prefill_chunked_session17_h100.log). So a
# prefill step of up to 2,048 tokens is replayed from a graph; past that its kernels outlast its launches. Steps
# between buckets compute the padding rows too: at most 2x the tokens up to 256, at most 255 rows above.
PREFILL_GRAPH_TOKENS = (16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048)
# Decode attention's split plan (grid, workspace) is sized for a max_seq_len and stays valid at every length up
# to it (decode_splits in cuda_kernels.py). Sized for max_context, a short-context step launches a long context's
# mostly empty splits: batch 32 took 1.240 ms a step at 4,225 tokens of context vs 1.179 at 640
# (bench_max_context.log). So a step's plan is sized for its context bucket: the smallest power of two >= its
# longest decode row, at least MIN_CONTEXT_BUCKET, and the top bucket is max_context itself, so no plan is sized
# past what a request can reach. MIN_CONTEXT_BUCKET is 256, not 512: the tensor-core decode kernel takes a sequence
# of up to 256 keys as one split, so a 256-key plan has one split, where at batch 32 the 512-key plan's other 4
# splits launched a block each that only returned (experiments/NOTEBOOK.md, "Does the smallest context bucket
# launch empty splits?").
MIN_CONTEXT_BUCKET = 256
NO_TOKEN, NAN_LOGITS = -1, -2  # run()'s token for a row that picks nothing this step / whose logits hold a NaN


def context_buckets(max_context: int, smallest: int = MIN_CONTEXT_BUCKET) -> tuple:
    """(smallest, 2 * smallest, ..., max_context): powers of two below max_context, then max_context."""
    out, b = [], smallest
    while b < max_context:
        out.append(b)
        b *= 2
    return (*out, max_context)


@dataclass(frozen=True)
class StepResult:
    tokens: np.ndarray  # int64 [B]: the sampled id, NO_TOKEN or NAN_LOGITS
    gpu_ms: float
    sections: MappingProxyType
    graph: bool
    sampler_path: str  # "fast" or "slow"
    sampler_why: str  # why the slow path ran ("" on the fast path)
    sampler_bytes: int  # FP32 bytes the sampler materialised
    logprobs: list  # per row: None or {"token", "logprob", "rank", "top": [[id, logprob], ...]}
    options: object  # the EngineOptions the step ran with (pdl off unless replayed from a graph)
    plan: object  # the StepPlan: which kernel ran each op (toolkit/model/plan.py)


@dataclass(frozen=True)
class InFlight:
    """A launched step: what collect() needs once its tokens are back."""
    tokens: object  # the backend's pending download of the sampled ids (.wait() -> int32 [B])
    due: np.ndarray
    clock: object
    timer: object
    gate_ms: float
    graph: bool
    sb: object  # the SamplingBatch
    lp: object  # the logprobs' device arrays, or None
    states: list
    options: object
    plan: object


class ModelRunner:
    def __init__(self, cfg, weights, backend, max_context: int, max_num_seqs: int, max_num_batched_tokens: int,
                 num_blocks: int, block_size: int):
        self.be, self.block_size = backend, block_size
        rows = max(max_num_batched_tokens, max_num_seqs)
        self.model = Model(cfg, weights, backend, max_context, rows, max_num_seqs)
        self.kv = KVCache.allocate(backend, cfg, num_blocks, block_size)
        self.stager = StepStager(backend, rows, max_num_seqs, -(-max_context // block_size))
        # The lm_head writes logits in the compute dtype (bf16/fp16 on the GPU), as vLLM's does; only the
        # sampler's slow path makes an FP32 copy.
        self.logits = backend.empty((max_num_seqs, cfg.vocab_size))
        self.sampler = Sampler(backend, cfg.vocab_size, max_num_seqs, max_context)
        self.buckets = [b for b in GRAPH_BUCKETS if b <= max_num_seqs] if backend.name == "cuda" else []
        self.context_buckets = context_buckets(max_context)
        self.graphs = {}  # _graph_key(...) -> captured graph
        self._timers = [backend.section_timer() for _ in range(2)]
        self._clocks = [backend.step_clock() for _ in range(2)]
        self._token_bufs = [backend.int_buffer(max_num_seqs)[0] for _ in range(2)]  # pinned: downloads are async
        self._staged = backend.fence()  # after the last step's uploads (launch waits on it before staging)
        self._launches = 0

    # -- host side ------------------------------------------------------------------------------------
    def prepare(self, seqs, num_new, num_decodes: int) -> StepBatch:
        bs, B = self.block_size, len(seqs)
        rows = [table_array(s) for s in seqs]  # int32 already: each row is one copy (a list was ~1 µs a row more)
        tables = np.zeros((B, max(map(len, rows))), np.int32)
        for i, row in enumerate(rows):
            tables[i, :len(row)] = row
        if num_decodes == B:  # a pure decode step, one token a request: the common step, two passes and arrays
            pos = np.fromiter([s.num_computed for s in seqs], np.int32, B)
            ids = np.fromiter([s.token_ids[s.num_computed] for s in seqs], np.int32, B)
            slots = tables[np.arange(B), pos // bs] * bs + pos % bs
            return StepBatch(ids, pos, slots.astype(np.int32), np.arange(B + 1, dtype=np.int32), pos + 1, tables, B,
                             self.context_bucket(int(pos.max()) + 1))
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        for seq, n in zip(seqs, num_new):
            start = seq.num_computed
            ids += seq.token_ids[start:start + n]
            pos += range(start, start + n)
            slots += slot_mapping(seq.block_table, start, n, bs)
            qsl.append(qsl[-1] + n)
            lens.append(start + n)
        arrays = (np.array(a, np.int32) for a in (ids, pos, slots, qsl, lens))
        return StepBatch(*arrays, tables, num_decodes, self.context_bucket(max(lens[:num_decodes], default=0)))

    def prepare_next(self, batch: StepBatch, seqs, live) -> StepBatch:
        """The decode step after `batch`, a pure decode step still on the device: the same rows in the same order,
        so that row i feeds the token `batch` samples into row i (launch(feed=True) copies them on the device;
        the input ids here are placeholders). A row whose request ends with `batch` (live[i] False) becomes a
        padding row: slot -1, length 0, reads and writes nothing."""
        bs, B = self.block_size, batch.num_seqs
        live = np.asarray(live, bool)
        pos = np.where(live, batch.positions + 1, 0).astype(np.int32)
        rows = [table_array(s) if ok else None for s, ok in zip(seqs, live)]
        tables = np.zeros((B, max(len(r) for r in rows if r is not None)), np.int32)
        for i, row in enumerate(rows):
            if row is not None:
                tables[i, :len(row)] = row
        slots = np.where(live, tables[np.arange(B), pos // bs] * bs + pos % bs, -1).astype(np.int32)
        lens = np.where(live, pos + 1, 0).astype(np.int32)
        return StepBatch(np.zeros(B, np.int32), pos, slots, np.arange(B + 1, dtype=np.int32), lens, tables, B,
                         self.context_bucket(int(lens.max())))

    def graph_bucket(self, rows: int):
        """The graph bucket a pure decode step of `rows` requests replays (None: it runs eagerly)."""
        if not self.buckets or rows > self.buckets[-1]:
            return None
        return self.buckets[bisect.bisect_left(self.buckets, rows)]

    def prefill_bucket(self, seqs: int, tokens: int):
        """(requests, tokens) a prefill step of `seqs` requests feeding `tokens` tokens is padded to and replayed
        at (None: it runs eagerly as it is): a batch bucket and the next token bucket, at most the staged rows."""
        b = self.graph_bucket(seqs)
        if b is None or tokens > PREFILL_GRAPH_TOKENS[-1]:
            return None
        return b, min(PREFILL_GRAPH_TOKENS[bisect.bisect_left(PREFILL_GRAPH_TOKENS, tokens)], self.stager.max_tokens)

    def padded_rows(self, rows: int) -> int:
        """How many rows a pure decode step of `rows` requests runs: its graph bucket, on the GPU."""
        return self.graph_bucket(rows) or rows

    def context_bucket(self, longest: int) -> int:
        """The context bucket of a step whose longest decode row has `longest` tokens of context (past
        max_context: max_context, and the stager refuses the step)."""
        cb = self.context_buckets
        return cb[min(bisect.bisect_left(cb, longest), len(cb) - 1)]

    def _padding(self, batch: StepBatch, options):
        """(requests, tokens) the step runs padded to, eagerly or from the graph of that size; tokens None for a
        decode step (one padding row a padding request). None: it runs eagerly as it is (a step mixing decodes
        and prompt chunks; a prefill whose sparse kernels run, sized on the host from the real lengths)."""
        if batch.kind == "decode":
            b = self.graph_bucket(batch.num_seqs)
            return None if b is None else (b, None)
        if batch.kind == "prefill" and (not options.sparse_prefill or runs_dense(batch.prefill_lens, options)):
            return self.prefill_bucket(batch.num_seqs, batch.num_tokens)
        return None

    # -- one step -----------------------------------------------------------------------------------------
    def launch(self, batch: StepBatch, options, states: list, sample_rows: list, feed: bool = False) -> "InFlight":
        """Queue the step on the device and return at once; `states` holds each request's RequestSampling,
        `sample_rows` the requests that pick a token this step (the others fed part of a prompt). With `feed`,
        each row's input id is the token the step queued before this one sampled for the same row, copied on
        the device (batch.input_ids are placeholders then): the host queues this step before it knows them."""
        be, sampler = self.be, self.sampler
        be.bind_thread()
        B = batch.num_seqs
        pad = self._padding(batch, options)
        use_graph = pad is not None and options.cuda_graphs
        if not use_graph or pad[1] is not None:
            # PDL only inside decode graphs: eagerly, each cuLaunchKernelEx through cuda-bindings costs more host
            # time than it saves (batch-1 decode without graphs: 3.650 vs 2.633 ms, bench_pdl_eager.log); in a
            # prefill step the kernels, not their launch latency, are the time, and PDL was measured on decode.
            options = options.with_(pdl=False)
        due = np.zeros(B, bool)
        due[sample_rows] = True
        # The step before may still be queued: its copies read the pinned host buffers this step rewrites.
        self._staged.wait()
        t0 = time.perf_counter()
        sb = sampler.prepare(states, batch.seq_lens, due, pad[0] if pad else B, options.sampler_fast_path)
        gate_ms = (time.perf_counter() - t0) * 1e3
        step = self.stager.stage(batch, *(pad or ()))
        sampler.stage(sb)
        self._staged = be.fence()
        if feed:  # before this step's sampling overwrites them
            be.copy_ids(sampler.sampled, step.input_ids, B)
        k = self._launches = self._launches + 1
        timer = NullTimer() if use_graph else self._timers[k % 2]  # two steps may be queued: one timer each
        # The step's clock: events around the launch (graph replay, or the eager forward and sampling). Staging
        # (the host packs the step's ints, then one copy each for the step and the sampler) comes before it, as
        # the torch peer's input updates come outside its timed region; while the host packs, the GPU idles, and
        # a clock started before staging counted that idle time (experiments/NOTEBOOK.md, "Does the step clock
        # measure the GPU's work?").
        clock = self._clocks[k % 2]
        plan = self.model.plan(step, options)
        if use_graph:
            graph = self._graph(pad, step, sb, plan)
            clock.start()
            be.replay(graph)
        else:
            clock.start()
            self.model.forward(step, self.kv, self.logits, plan, timer)
            sampler.sample(self.logits, sb, timer)
        lp = sampler.logprobs(self.logits, sb, timer) if sb.logprobs >= 0 else None
        clock.stop()
        tokens = be.download(sampler.sampled, self._token_bufs[k % 2], B)
        return InFlight(tokens, due, clock, timer, gate_ms, use_graph, sb, lp, states, options, plan)

    def collect(self, f: "InFlight") -> StepResult:
        """Wait for a launched step's tokens (the step's one synchronisation) and read its timings."""
        tokens = f.tokens.wait().astype(np.int64)
        tokens[tokens < 0] = NAN_LOGITS  # the sampling kernel marks a row holding a NaN logit with -1
        tokens[~f.due] = NO_TOKEN  # rows that fed only part of a prompt pick nothing
        sections = {} if f.graph else in_order([*f.timer.laps_ms(), ("gate", f.gate_ms)])  # gate: host time
        sb = f.sb
        return StepResult(tokens, f.clock.elapsed_ms(), MappingProxyType(sections), f.graph,
                          "fast" if sb.fast else "slow", sb.why_slow, self.sampler.materialised_bytes(sb),
                          self._logprobs_to_host(f.lp, f.states, tokens) if f.lp is not None else [None] * len(tokens),
                          f.options, f.plan)

    def _logprobs_to_host(self, lp, states, tokens) -> list:
        ids, vals, slp, rank = lp
        B, n = ids.shape
        get = self.be.ids_to_host
        ids = get(ids.reshape(-1), B * n).reshape(B, n)
        vals = get(vals.reshape(-1), B * n).reshape(B, n)
        slp, rank = get(slp, B), get(rank, B)
        out = []
        for i, s in enumerate(states):
            k = s.params.logprobs if s is not None else None
            if k is None or tokens[i] < 0:
                out.append(None)
                continue
            out.append({"token": int(tokens[i]), "logprob": float(slp[i]), "rank": int(rank[i]),
                        "top": [[int(t), float(v)] for t, v in zip(ids[i, :k], vals[i, :k])]})
        return out

    def forward_all_rows(self, batch: StepBatch, logits_out, options):
        """Eager forward writing the logits of every fed token into logits_out[:N] (tests, perplexity)."""
        self.be.bind_thread()
        self._staged.wait()
        step = self.stager.stage(batch)
        self.model.forward(step, self.kv, logits_out, self.model.plan(step, options.with_(pdl=False)), NullTimer(),
                           all_rows=True)

    # -- graphs ------------------------------------------------------------------------------------------
    def _graph(self, pad: tuple, step, sb, plan):
        # A graph bakes in its kernels: one per batch bucket, per context bucket (decode attention's grid and
        # workspace), per step plan (which kernels, launched with PDL or not) and per sampler path (the fast
        # path, or the slow one with every processing stage). Bounded: at most 9 batch buckets x (1 +
        # ceil(log2(max_context / 256))) context buckets x 2 sampler paths per option set (90 at 4,096 tokens of
        # context), and only those that steps reach are made; a prefill step's graphs add at most 9 batch x 12
        # token buckets x 2 sampler paths (at the smallest context bucket: a prefill step has no decode rows).
        # Every graph reads the same static step, scratch and logits buffers; what a context bucket adds is its
        # graphs' nodes, per batch bucket its own decode-attention workspace (B x Hq x splits x (D + 2) fp32
        # words, under 4 MB at batch 256 for Qwen2.5-0.5B on the H200), and, the first time a step reaches it,
        # one eager step plus the capture. Key: a decode graph's batch bucket, or a prefill graph's (requests,
        # tokens).
        key = (pad[0] if pad[1] is None else pad, step.context_bucket, plan, sb.fast)
        g = self.graphs.get(key)
        if g is None:
            body = self.graph_body(step, sb, plan)
            # One eager run first: kernels get compiled and loaded, per-shape workspaces allocated and
            # cuBLAS picks its algorithms outside the capture (none of that may happen inside it).
            body()
            g = self.graphs[key] = self.be.capture(body)
        return g

    def graph_body(self, step, sb, plan):
        """What a graph (decode or prefill) holds: the forward, then the sampling with every stage (eagerly the
        sampler runs only the stages the batch needs; a graph is replayed for later batches too)."""
        def body():
            self.model.forward(step, self.kv, self.logits, plan, NullTimer())
            self.sampler.sample(self.logits, sb, NullTimer(), stages=ALL_STAGES)
        return body

    def capture_all(self, options):
        """Capture every batch bucket now (at start-up) at the smallest context bucket, fast and slow sampler
        paths, so no short request pays for it; a longer context's graphs are captured by the first step that
        needs them (a long request pays it once, over many steps; start-up stays as fast as one bucket)."""
        ctx = self.context_buckets[0]
        for b in self.buckets:
            for fast in (True, False):
                z = np.zeros(b, np.int32)
                batch = StepBatch(z, z, np.full(b, -1, np.int32), np.arange(b + 1, dtype=np.int32), z,
                                  np.zeros((b, 1), np.int32), b, ctx)
                self.be.bind_thread()
                sb = self.sampler.prepare([None] * b, z, np.ones(b, bool), b, fast)
                step = self.stager.stage(batch)
                self.sampler.stage(sb)
                self._graph((b, None), step, sb, self.model.plan(step, options))
        self.be.synchronize()
