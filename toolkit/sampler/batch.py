"""The sampler's inputs for one step, as data: built on the host, staged before the step runs.

For R logits rows (one per request of the step, padded to the CUDA-graph bucket):
    temperature, top_k, top_p, min_p, rep, freq, pres   per-row parameters ([R]; off values on padding rows)
    sample_temp    what gumbel_sample divides by: 0 (greedy) or 1 (temperature, if any, was applied by the
                   processing stage, or is 1 anyway); -1 on the fast path for a row filter_sample samples
    seeds          uint32 [R, 2] Philox key; positions [R]: the position the sampled token will take
    bias_*         CSR (offsets [R+1], tokens, values): logit bias
    pen_*          CSR (offsets [R+1], tokens, output counts): every distinct token of prompt ∪ output
    ban_*          CSR (offsets [R+1], tokens, values = -inf): bad words, stop tokens before min_tokens
Each CSR row lists its tokens sorted (the fast path looks them up by binary search).

Everything lives in one pinned int32 host buffer with fixed regions (floats are the same 4 bytes, viewed
as float32) and its device twin. A CUDA graph captured on the device views replays with each step's new
values; the kernels read the CSR sizes from the offsets, so their grids never depend on them. Staging is
one copy of the per-row part, plus one copy of each CSR entry region's used prefix (none when no row
processes its logits).

The gate, per row: a row that processes its logits goes to filter_sample on the fast path unless the model's
vocabulary is beyond that kernel's shared-memory bitmap (`fast_limit`: over VOCAB_CAP tokens), the one thing
the fast path cannot do; then the step takes the slow path, its reason in `why_slow`. A history of any length
stays on the fast path (beyond HIST_CAP entries, filter_sample reads it from global memory: that row's cost).
"""
from dataclasses import dataclass, replace

import numpy as np

from kernels.sampler import VOCAB_CAP

MAX_BIAS, MAX_BANS = 1024, 320  # per request: 1024 logit-bias entries; 128 bad words + 192 stop ids

_ROW_F32 = ("temperature", "top_p", "min_p", "rep", "freq", "pres", "sample_temp")
_ROW_I32 = ("top_k", "positions")
# A padding row (or one that samples nothing): greedy, every filter off.
_OFF_F32 = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0], np.float32)  # T, top_p, min_p, rep, freq, pres, sample T
_OFF_I32 = np.array([0, 0, 0], np.int32)  # top_k, seed words
_CSR_STAGES = frozenset({"bias", "penalties", "bans"})


@dataclass
class SamplingBatch:
    """Host arrays of one step's sampler inputs (views into the pinned staging buffer)."""
    rows: int  # R, padding included
    real_rows: int  # B
    fast: bool  # the fast path is on and holds every sampling row
    why_slow: str  # the first reason the step took the slow path ("" on the fast path)
    stages: frozenset  # slow: the processing stages some row needs ("bias", "penalties", "bans", "temperature",
    #                    "top_k_top_p"); fast: "filter" when some row processes its logits
    logprobs: int  # the most top logprobs any row asked for; 0: only the sampled token's; -1: no row asked
    ends: dict  # CSR name -> number of entries used


class SamplingStager:
    def __init__(self, backend, max_rows: int, max_context: int):
        self.be, self.max_rows = backend, max_rows
        R1 = max_rows + 1
        fixed = [(n, max_rows) for n in _ROW_F32 + _ROW_I32] + [("seeds", 2 * max_rows)] + \
                [(n + "_off", R1) for n in ("bias", "pen", "ban")]
        csr = [("bias_tok", max_rows * MAX_BIAS), ("bias_val", max_rows * MAX_BIAS),
               ("ban_tok", max_rows * MAX_BANS), ("ban_val", max_rows * MAX_BANS),
               ("pen_tok", max_rows * max_context), ("pen_cnt", max_rows * max_context)]
        self.off, total = {}, 0
        for name, n in fixed + csr:
            self.off[name] = (total, n)
            total += n
        self.fixed_end = self.off["bias_tok"][0]
        self.host, self.dev = backend.int_buffer(total)
        # Views are made once: a CuPy slice costs microseconds, and a step would otherwise make dozens.
        self.host_views = {name: self._view(self.host, name) for name in self.off}
        self._device_views = {}  # rows -> dict of device views
        self._last_key, self._last = None, None  # the previous step's batch (see prepare)

    def _view(self, arr, name):
        off, n = self.off[name]
        f32 = name in _ROW_F32 or name.endswith("_val")
        return arr[off:off + n].view(np.float32 if f32 else np.int32)  # NumPy and CuPy take NumPy dtypes

    def device(self, rows: int) -> dict:
        """Device views for R rows: per-row arrays [R], seeds uint32 [R, 2], CSR offsets [R+1], whole entry
        regions (the kernels stop at the offsets)."""
        d = self._device_views.get(rows)
        if d is not None:
            return d
        d = self._device_views[rows] = {n: self._view(self.dev, n)[:rows] for n in _ROW_F32 + _ROW_I32}
        d["seeds"] = self._view(self.dev, "seeds")[:2 * rows].view(np.uint32).reshape(rows, 2)
        for n in ("bias", "pen", "ban"):
            d[n + "_off"] = self._view(self.dev, n + "_off")[:rows + 1]
        for n in ("bias_tok", "bias_val", "ban_tok", "ban_val", "pen_tok", "pen_cnt"):
            d[n] = self._view(self.dev, n)
        return d

    # -- host side ------------------------------------------------------------------------------------
    def prepare(self, states: list, positions, sampling_rows, rows: int, fast_path_on: bool) -> SamplingBatch:
        """Host side of a step, the gate included: fill the host buffer for `states` (one per request; None = a
        row that samples nothing). Then `stage()` before the kernels launch."""
        h = self.host_views
        B = len(states)
        # A decode batch is usually the batch of the step before: then only the positions (and, on the slow
        # path, the penalty/ban entries) change, and the per-row parameters already in the buffer stay.
        key = (rows, fast_path_on, tuple(-1 if s is None else s.serial for s in states),
               np.asarray(sampling_rows, bool).tobytes())
        rows_needing = [i for i, s in enumerate(states) if s is not None and sampling_rows[i] and s.needs_processing]
        needs = [states[i] for i in rows_needing]
        beyond = next((why for why in map(fast_limit, needs) if why), "")
        fast = fast_path_on and not beyond
        if key == self._last_key and fast == self._last.fast:
            h["positions"][:B] = positions
            last = self._last
            if not needs:
                return last
            ends, stages = self._entries(states, rows)
            return replace(last, ends=ends, stages=(last.stages - _CSR_STAGES | stages) if not fast else last.stages)
        why = "" if fast else ("switched off" if not fast_path_on else beyond)
        # One stacked array per kind (each request keeps its row ready), then one vector store per field.
        f32 = np.array([s.row_f32 if s is not None else _OFF_F32 for s in states], np.float32).reshape(B, -1)
        i32 = np.array([s.row_i32 if s is not None else _OFF_I32 for s in states], np.int32).reshape(B, -1)
        if fast and needs:  # these rows are filter_sample's
            f32[rows_needing, 6] = -1.0
        for j, name in enumerate(_ROW_F32):
            h[name][:B] = f32[:, j]
            h[name][B:rows] = _OFF_F32[j]
        top_k, seeds, pos = h["top_k"], h["seeds"], h["positions"]
        top_k[:B], top_k[B:rows] = i32[:, 0], 0
        seeds[:2 * B] = i32[:, 1:3].reshape(-1)
        seeds[2 * B:2 * rows] = 0
        pos[:B], pos[B:rows] = positions, 0
        live = [s for s in states if s is not None]
        logprobs = max([s.params.logprobs for s in live if s.params.logprobs is not None] + [-1])
        ends, stages = self._entries(states, rows) if needs or not fast else ({}, frozenset())
        if fast:
            stages = frozenset({"filter"} if needs else ())
        else:
            T, min_p = f32[:, 0], f32[:, 2]
            if ((T != 0) & ((T != 1) | (min_p != 0))).any():
                stages |= {"temperature"}
            if (i32[:, 0] > 0).any() or (f32[:, 1] != 1).any():
                stages |= {"top_k_top_p"}
        self._last_key = key
        self._last = SamplingBatch(rows, B, fast, why, stages, logprobs, ends)
        return self._last

    def _entries(self, states, rows) -> tuple:
        """The step's sparse entries (logit bias, penalties, bans), and the stages they need. A kind no request
        uses costs one vector store of zero offsets (a step with temperature alone builds nothing per row)."""
        live = [s for s in states if s is not None]
        ends = {"bias": 0, "pen": 0, "ban": 0}
        if any(len(s.bias_tokens) for s in live):
            ends["bias"] = self._csr("bias", [s.bias_tokens if s else None for s in states],
                                     [s.bias_values if s else None for s in states], rows)
        if any(s.use_penalties for s in live):
            pens = [s.penalty_entries() if s and s.use_penalties else (None, None) for s in states]
            ends["pen"] = self._csr("pen", [t for t, _ in pens], [c for _, c in pens], rows)
        if any(s.bad_words or s.params.min_tokens for s in live):
            bans = [s.banned() if s else None for s in states]
            ends["ban"] = self._csr("ban", bans, [np.full(len(b), -np.inf, np.float32) if b else None
                                                  for b in bans], rows)
        for name, n in ends.items():
            if not n:
                self.host_views[name + "_off"][:rows + 1] = 0
        stages = frozenset(k for k, n in (("bias", ends["bias"]), ("penalties", ends["pen"]), ("bans", ends["ban"]))
                           if n)
        return ends, stages

    def _csr(self, name, tokens, values, rows) -> int:
        off = self.host_views[name + "_off"]
        tok = self.host_views[name + "_tok"]
        val = self.host_views[name + ("_val" if name != "pen" else "_cnt")]
        n = 0
        off[0] = 0
        for i in range(rows):
            t = tokens[i] if i < len(tokens) else None
            if t is not None and len(t):
                if n + len(t) > len(tok):
                    raise ValueError(f"sampler: more than {len(tok)} {name} entries in one step")
                tok[n:n + len(t)] = t
                val[n:n + len(t)] = values[i]
                n += len(t)
            off[i + 1] = n
        return n

    def stage(self, batch: SamplingBatch):
        """Copy the step's inputs to the device (asynchronous; before the step's kernels launch)."""
        up = self.be.upload
        up(self.host, self.dev, self.fixed_end)
        for name, n in batch.ends.items():
            if n:
                for arr in (name + "_tok", name + ("_cnt" if name == "pen" else "_val")):
                    off, _ = self.off[arr]
                    up(self.host, self.dev, n, offset=off)


def vocab_limit(vocab_size: int) -> str:
    """Why no processing row of this model can take the fast path ("" if they can), known before any request."""
    return f"vocabulary of {vocab_size} tokens (the fast path holds {VOCAB_CAP})" if vocab_size > VOCAB_CAP else ""


def fast_limit(state) -> str:
    """Why filter_sample cannot take this processing row ("" if it can): its shared memory keeps a bitmap of the
    vocabulary."""
    return vocab_limit(state.vocab_size)
