"""The sampler: one token per logits row, from the model's logits in their own dtype.

    gate         host, per row (batch.py): a row without logits processing samples with gumbel_sample; one
                 with processing with filter_sample, unless the vocabulary is beyond that kernel's bitmap
                 (then every step takes the slow path). A long history costs only its own row: filter_sample
                 keeps it in global memory instead of shared memory.
    fast path    both kernels read the model's bf16/fp16 logits in place and upcast in registers; no FP32
                 tensor is written. filter_sample keeps a row's history (the tokens its bias, penalties and
                 bans name) as (token, adjusted logit) pairs, finds its thresholds by a radix select over
                 the logits' 16-bit keys and draws Gumbel-max among the survivors (kernels/sampler.py's
                 docstring has the rule).
    slow path    the switch is off (or a row is beyond the fast path): copy the logits to FP32 once, then
                 process that copy in place, in vLLM's order:
                    logit bias -> penalties -> bans (bad words, min_tokens) -> temperature -> min_p
                    -> top-k -> top-p
                 and sample from it.
    sample       Gumbel-max: argmax_v(x_v / T + g(seed, position, v)) with Philox noise, greedy rows
                 (T = 0) as plain argmax in the same launch. The noise depends only on the request's
                 seed, the position and the token id, never on the batch around it.
    logprobs     from the RAW model logits (never the processed copy), without a [B, V] logprob tensor.

Neither path ever writes into the model's logits buffer: the fast path only reads it, and the slow
path processes its own FP32 copy. Why the fast path is exact: bf16 -> fp32 is exact, history values
are computed by the same fp32 operations in the same order, and both paths find their thresholds by
one rule whose top-p masses are fixed-point integers, so its tokens are bit-identical to the slow
path's for the same seed.

Every launch reads its inputs from staged device buffers (batch.py), so the whole sampler can be
captured inside the CUDA-graph decode step; `stages` lets an eager step skip the processing kernels no
row needs, while a captured graph includes them all (each exits early for rows it does not touch).
"""
import numpy as np

from .batch import SamplingBatch, SamplingStager
from .params import MAX_LOGPROBS

# filter_sample's inputs, in its argument order (the staged device views, batch.py)
FILTER_INPUTS = ("temperature", "top_k", "top_p", "min_p", "rep", "freq", "pres", "sample_temp", "seeds", "positions",
                 "bias_off", "bias_tok", "bias_val", "pen_off", "pen_tok", "pen_cnt", "ban_off", "ban_tok", "ban_val")
ALL_STAGES = frozenset({"bias", "penalties", "bans", "temperature", "top_k_top_p", "filter"})


class Sampler(SamplingStager):
    """The staging of a step's inputs (SamplingStager: `prepare` on the host, then `stage`), and its kernels."""

    def __init__(self, backend, vocab_size: int, max_rows: int, max_context: int):
        super().__init__(backend, max_rows, max_context)
        self.V = vocab_size
        self.x32 = backend.empty((max_rows, vocab_size), np.float32)  # the slow path's FP32 copy
        # filter_sample's workspace for histories longer than its shared memory holds: one slot per CSR entry
        n_ws = sum(self.off[n][1] for n in ("bias_tok", "pen_tok", "ban_tok"))
        self.ws = backend.empty((n_ws,), np.int32), backend.empty((n_ws,), np.float32)
        self.sampled = backend.empty((max_rows,), np.int32)
        self._lp = None  # logprob outputs, allocated at the first request for them

    def materialised_bytes(self, batch: SamplingBatch) -> int:
        return 0 if batch.fast else batch.rows * self.V * 4

    def sample(self, logits, batch: SamplingBatch, timer, stages=None):
        """Device work of a step: writes self.sampled[:rows]. `stages=None` runs only the processing stages
        the batch needs (eager); a graph capture passes ALL_STAGES."""
        be, R = self.be, batch.rows
        d = self.device(R)
        stages = batch.stages if stages is None else stages
        if batch.fast:
            x = logits[:R]
            if "filter" in stages:
                be.filter_sample(x, *(d[n] for n in FILTER_INPUTS), *self.ws, self.sampled[:R])
                timer.lap("processing")
        else:
            x = self.x32[:R]
            be.to_fp32(logits[:R], x)
            timer.lap("fp32")
            process(be, x, d, stages)
            timer.lap("processing")
        be.gumbel_sample(x, d["sample_temp"], d["seeds"], d["positions"], self.sampled[:R])
        timer.lap("sample")

    def logprobs(self, logits, batch: SamplingBatch, timer):
        """Top-n logprobs and the sampled token's logprob and rank, from the raw logits (eager only)."""
        n, B = batch.logprobs, batch.real_rows
        if self._lp is None:  # flat buffers for the most logprobs a request may ask (params.MAX_LOGPROBS)
            be, R = self.be, self.max_rows
            self._lp = (be.empty((R * MAX_LOGPROBS,), np.int32), be.empty((R * MAX_LOGPROBS,), np.float32),
                        be.empty((R,), np.float32), be.empty((R,), np.int32))
        ids, lp, slp, rank = self._lp
        ids, lp = ids[:B * n].reshape(B, n), lp[:B * n].reshape(B, n)  # contiguous [B, n]
        self.be.logprobs(logits[:B], self.sampled[:B], n, ids, lp, slp[:B], rank[:B])
        timer.lap("logprobs")
        return ids, lp, slp[:B], rank[:B]


def process(be, x, d: dict, stages):
    """The slow path's processing of the FP32 copy x [R, V], in place, in vLLM's order."""
    if "bias" in stages:
        be.add_entries(x, d["bias_off"], d["bias_tok"], d["bias_val"])
    if "penalties" in stages:
        be.apply_penalties(x, d["pen_off"], d["pen_tok"], d["pen_cnt"], d["rep"], d["freq"], d["pres"])
    if "bans" in stages:
        be.add_entries(x, d["ban_off"], d["ban_tok"], d["ban_val"])
    if "temperature" in stages:
        be.temperature_min_p(x, d["temperature"], d["min_p"])
    if "top_k_top_p" in stages:
        be.top_k_top_p(x, d["top_k"], d["top_p"])
