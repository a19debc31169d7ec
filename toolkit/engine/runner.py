"""The model runner: a scheduled step in, one sampled token per request out.

    prepare(scheduled) -> StepBatch      host arrays: ids, positions, slots, qsl, seq_lens, block tables
    stager.stage(batch) -> DeviceStep    one copy into fixed device buffers, before anything launches
    model.forward(...) or graph replay   eager kernels, or the CUDA graph captured for this batch size
    argmax / sampling                    on the device for greedy rows; only B ids come back

CUDA graphs: a pure decode step (every request feeds one token) is replayed from a graph captured
once per batch-size bucket (1, 2, 4, ..., 256), with the batch padded up to its bucket by rows
that read and write nothing (KV slot -1, length 0). On the GPU eager decode steps are padded the
same way, so turning graphs off and on runs the very same kernels on the very same shapes: the
tokens cannot change, only the launch overhead does.
"""
import bisect
import time
from types import MappingProxyType

import numpy as np

from ..model import KVCache, Model
from ..step import StepBatch, StepStager
from ..sampling import sample_temperature
from ..timings import NullTimer
from .block_manager import slot_mapping

GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NO_TOKEN, NAN_LOGITS = -1, -2  # run()'s token for a row that picks nothing this step / whose logits hold a NaN


class ModelRunner:
    def __init__(self, cfg, weights, backend, max_context: int, max_num_seqs: int, max_num_batched_tokens: int,
                 num_blocks: int, block_size: int):
        self.cfg, self.be = cfg, backend
        self.max_context, self.block_size = max_context, block_size
        self.max_blocks = -(-max_context // block_size)
        rows = max(max_num_batched_tokens, max_num_seqs)
        self.model = Model(cfg, weights, backend, max_context, rows, max_num_seqs)
        self.kv = KVCache.allocate(backend, cfg, num_blocks, block_size)
        self.stager = StepStager(backend, rows, max_num_seqs, self.max_blocks)
        self.logits = backend.empty((max_num_seqs, cfg.vocab_size), np.float32)
        self.sampled = backend.empty((max_num_seqs,), np.int32)
        self.on_gpu = backend.name == "cuda"
        self.buckets = [b for b in GRAPH_BUCKETS if b <= max_num_seqs] if self.on_gpu else []
        self.graphs = {}  # (bucket, small_batch_gemv) -> captured graph
        self._timer = backend.section_timer()
        self._clock = backend.step_clock()

    # -- host side ------------------------------------------------------------------------------------
    def prepare(self, seqs, num_new, num_decodes: int) -> StepBatch:
        bs = self.block_size
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        width = max(len(s.block_table) for s in seqs)
        tables = np.zeros((len(seqs), width), np.int32)
        for i, (seq, n) in enumerate(zip(seqs, num_new)):
            start = seq.num_computed
            ids += seq.token_ids[start:start + n]
            pos += range(start, start + n)
            table = seq.block_table
            slots += slot_mapping(table, start, n, bs)
            qsl.append(qsl[-1] + n)
            lens.append(start + n)
            tables[i, :len(table)] = table
        i32 = np.int32
        return StepBatch(np.array(ids, i32), np.array(pos, i32), np.array(slots, i32), np.array(qsl, i32),
                         np.array(lens, i32), tables, num_decodes)

    def _bucket(self, batch: StepBatch):
        if batch.kind != "decode" or not self.buckets or batch.num_seqs > self.buckets[-1]:
            return None
        return self.buckets[bisect.bisect_left(self.buckets, batch.num_seqs)]

    # -- one step -----------------------------------------------------------------------------------------
    def run(self, batch: StepBatch, options, sample_rows: list, temperatures: list, rngs: list):
        """Run the step; returns (token per request or NO_TOKEN / NAN_LOGITS, gpu_ms, sections, graph?)."""
        be = self.be
        be.bind_thread()
        B = batch.num_seqs
        bucket = self._bucket(batch)
        use_graph = bucket is not None and options.cuda_graphs
        clock = self._clock
        clock.start()
        step = self.stager.stage(batch, pad_to=bucket)
        timer = NullTimer() if use_graph else self._timer
        if use_graph:
            be.replay(self._graph(bucket, step, options))
        else:
            self.model.forward(step, self.kv, self.logits, options, timer)
        be.argmax(self.logits[:B], self.sampled[:B])
        timer.lap("sampling")
        clock.stop()
        tokens = be.ids_to_host(self.sampled, B).astype(np.int64)  # the step's one synchronisation
        t0 = time.perf_counter()
        nan = tokens < 0  # argmax marks a row holding a NaN logit with -1
        hot = [i for i in sample_rows if temperatures[i] > 0 and not nan[i]]
        if hot:  # temperature sampling on the host (the full GPU sampler is its own module to come)
            for r, i in zip(be.to_host(self.logits[hot]), hot):
                tokens[i] = sample_temperature(r, temperatures[i], rngs[i])
        tokens[nan] = NAN_LOGITS
        due = np.full(B, False)
        due[sample_rows] = True
        tokens[~due] = NO_TOKEN  # rows that fed only part of a prompt pick nothing
        gpu_ms = clock.elapsed_ms()
        sections = {}
        if not use_graph:
            sections = self._timer.sections_ms()
            sections["sampling"] += (time.perf_counter() - t0) * 1e3  # host-side sampling, if any
        return tokens, gpu_ms, MappingProxyType(sections), use_graph

    def forward_all_rows(self, batch: StepBatch, logits_out, options):
        """Eager forward writing the logits of every fed token into logits_out[:N] (tests, perplexity)."""
        self.be.bind_thread()
        step = self.stager.stage(batch)
        self.model.forward(step, self.kv, logits_out, options, NullTimer(), all_rows=True)

    # -- graphs ------------------------------------------------------------------------------------------
    def _graph(self, bucket: int, step, options):
        # A graph bakes in its kernels: one per bucket and per option that changes a decode step's kernels.
        key = (bucket, options.small_batch_gemv)
        g = self.graphs.get(key)
        if g is None:
            # One eager run first: kernels get compiled and loaded, per-shape workspaces allocated and
            # cuBLAS picks its algorithms outside the capture (none of that may happen inside it).
            self.model.forward(step, self.kv, self.logits, options, NullTimer())
            g = self.graphs[key] = self.be.capture(
                lambda: self.model.forward(step, self.kv, self.logits, options, NullTimer()))
        return g

    def capture_all(self, options):
        """Capture every bucket now (at start-up), so no request pays for a capture."""
        for b in self.buckets:
            if (b, options.small_batch_gemv) not in self.graphs:
                z = np.zeros(b, np.int32)
                batch = StepBatch(z, z, np.full(b, -1, np.int32), np.arange(b + 1, dtype=np.int32), z,
                           np.zeros((b, 1), np.int32), b)
                self.be.bind_thread()
                self._graph(b, self.stager.stage(batch), options)
        self.be.synchronize()

