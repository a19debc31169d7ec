"""A step's inputs as data: what the model needs to run one batched forward pass.

The scheduler decides which requests run and how many tokens each feeds; the
runner turns that into a `StepBatch` of flat host arrays, and `StepStager`
copies it into fixed device buffers *before* the step launches, so nothing
inside the step touches the host (the condition for replaying it as a CUDA
graph). For B requests feeding N tokens in total:

    input_ids     [N]    the tokens fed this step, request after request
    positions     [N]    their positions in their own sequence
    slot_mapping  [N]    KV-cache slot each token's K/V is written to (-1: padding, not written)
    query_start_loc [B+1] request b's tokens are rows qsl[b]..qsl[b+1]-1
    seq_lens      [B]    request b's context length once this step's K/V are written
    block_tables  [B, M] request b's KV blocks, in order (M = blocks of the longest context)
    logits_rows   [B]    the row whose logits pick request b's next token (its last fed token)

Requests feeding one token (decodes) come first: the model runs the decode
attention kernel on rows 0..num_decodes-1 and the varlen prefill kernel on
the rest, from the same staged arrays.

One host scalar rides along: `context_bucket`, the max_seq_len the decode
attention plan (split count, grid, workspace) is sized for, >= every decode
row's seq_len. The runner picks it when it builds the step (ModelRunner.prepare),
so an eager step and a replayed graph of the same step run the same plan.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepBatch:
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    num_decodes: int
    context_bucket: int  # decode attention's max_seq_len (see the module docstring)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_query_len(self) -> int:
        return int(np.diff(self.query_start_loc).max()) if self.num_seqs else 0

    @property
    def prefill_lens(self) -> tuple:
        """Host (q_len, seq_len) of each prefill request (toolkit/model/sparse.py sizes and picks its path by it)."""
        nd = self.num_decodes
        return tuple(zip(np.diff(self.query_start_loc[nd:]).tolist(), self.seq_lens[nd:].tolist()))

    @property
    def kind(self) -> str:
        if self.num_decodes == self.num_seqs:
            return "decode"
        return "prefill" if self.num_decodes == 0 else "mixed"


@dataclass(frozen=True)
class DeviceStep:
    """The staged step as the model reads it: backend arrays (views of fixed buffers) plus host scalars."""
    input_ids: object
    positions: object
    slot_mapping: object
    query_start_loc: object
    seq_lens: object
    block_tables: object
    logits_rows: object
    num_tokens: int
    num_seqs: int
    num_decodes: int
    max_query_len: int
    context_bucket: int  # decode attention's max_seq_len: fixes its plan, so it is part of a graph's key
    prefill_lens: tuple = ()  # host (q_len, seq_len) of each prefill request (toolkit/model/sparse.py sizes from it)


class StepStager:
    """Fixed buffers for the largest step, and the one host->device copy that fills them.

    All int32 fields live in one buffer (pinned on the host, one device array), laid out
    [qsl | seq_lens | logits_rows | ids | positions | slots | block_tables], so staging a step is
    one contiguous copy up to its last block-table row. The regions never move: a CUDA graph
    captured on these views reads each new step's values on replay.
    """

    def __init__(self, backend, max_tokens: int, max_seqs: int, max_blocks: int):
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        sizes = {"qsl": max_seqs + 1, "seq_lens": max_seqs, "logits_rows": max_seqs, "ids": max_tokens,
                 "positions": max_tokens, "slots": max_tokens, "block_tables": max_seqs * max_blocks}
        self.host, self.dev = backend.int_buffer(sum(sizes.values()))
        self.h, self.d, off = {}, {}, 0  # name -> its region of the host / device buffer
        for name, n in sizes.items():
            self.h[name], self.d[name] = self.host[off:off + n], self.dev[off:off + n]
            off += n
        self._upload = backend.upload

    def stage(self, batch: StepBatch, pad_to: int | None = None, pad_tokens_to: int | None = None) -> DeviceStep:
        """Write `batch` into the buffers; `pad_to` pads a decode batch to a graph bucket with padding rows (one-token
        decodes: slot -1, length 0) that read and write nothing. With `pad_tokens_to`, a prefill step: its tokens
        are padded to that many with rows of no request (slot -1: computed, never attended to, never written to the
        cache) and its requests to `pad_to` with empty ones (no tokens, length 0), and max_query_len becomes the
        padded token count, so that one graph serves every step of the same padded size."""
        B, N = batch.num_seqs, batch.num_tokens
        Bp = pad_to or B
        prefill_pad = pad_tokens_to is not None
        Np = pad_tokens_to if prefill_pad else N + (Bp - B)  # a decode's padding rows are one-token decodes
        if prefill_pad and (batch.num_decodes or Np < N):
            raise ValueError(f"a prefill step of {N} tokens cannot be padded to {Np} (decodes: {batch.num_decodes})")
        if Bp > self.max_seqs or Np > self.max_tokens:
            raise ValueError(f"step of {Np} tokens / {Bp} requests exceeds the staged maximum "
                             f"{self.max_tokens} / {self.max_seqs}")
        nd = batch.num_decodes
        if nd and batch.seq_lens[:nd].max() > batch.context_bucket:  # the plan would be too short for a row
            raise ValueError(f"decode context {batch.seq_lens[:nd].max()} exceeds the step's context bucket "
                             f"{batch.context_bucket}")
        h = self.h
        qsl = h["qsl"]
        qsl[:B + 1] = batch.query_start_loc
        qsl[B + 1:Bp + 1] = N if prefill_pad else np.arange(N + 1, Np + 1, dtype=np.int32)
        seq_lens = h["seq_lens"]
        seq_lens[:B] = batch.seq_lens
        seq_lens[B:Bp] = 0
        h["logits_rows"][:Bp] = qsl[1:Bp + 1] - 1
        for name, src, pad in (("ids", batch.input_ids, 0), ("positions", batch.positions, 0),
                               ("slots", batch.slot_mapping, -1)):
            dst = h[name]
            dst[:N] = src
            dst[N:Np] = pad
        bt = h["block_tables"][:Bp * self.max_blocks].reshape(Bp, self.max_blocks)
        M = batch.block_tables.shape[1]
        bt[:B, :M] = batch.block_tables
        bt[B:Bp] = 0
        # The block tables are the last region: one copy up to this step's last row of them.
        self._upload(self.host, self.dev, self.host.size - (self.max_seqs - Bp) * self.max_blocks)
        d = self.d
        return DeviceStep(
            input_ids=d["ids"][:Np], positions=d["positions"][:Np], slot_mapping=d["slots"][:Np],
            query_start_loc=d["qsl"][:Bp + 1], seq_lens=d["seq_lens"][:Bp],
            block_tables=d["block_tables"][:Bp * self.max_blocks].reshape(Bp, self.max_blocks),
            logits_rows=d["logits_rows"][:Bp], num_tokens=Np, num_seqs=Bp,
            num_decodes=batch.num_decodes + (0 if prefill_pad else Bp - B),
            max_query_len=Np if prefill_pad else max(batch.max_query_len, 1),
            context_bucket=batch.context_bucket, prefill_lens=batch.prefill_lens)
