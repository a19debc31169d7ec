"""StepStager: one host->device copy carries the whole staged step, padding rows included."""
import numpy as np
import pytest

from toolkit.engine.step import StepBatch, StepStager


class CopyingBackend:
    """Host and device buffers apart, as on the GPU (the CPU backend shares one): only what upload copies arrives."""

    def int_buffer(self, n):
        return np.zeros(n, np.int32), np.full(n, -7, np.int32)

    def upload(self, host, dev, n, offset=0):
        dev[offset:offset + n] = host[offset:offset + n]


def test_one_upload_carries_the_padded_step():
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    stager = StepStager(CopyingBackend(), max_tokens=8, max_seqs=4, max_blocks=3)
    # Two decodes (contexts 5 and 21, blocks of 16), padded to a batch of 3.
    batch = StepBatch(i32(11, 12), i32(4, 20), i32(20, 52), i32(0, 1, 2), i32(5, 21), np.array([[1, 0], [3, 2]],
                      np.int32), 2, 32)
    step = stager.stage(batch, pad_to=3)
    assert (step.num_tokens, step.num_seqs, step.num_decodes) == (3, 3, 3)
    assert step.input_ids.tolist() == [11, 12, 0] and step.positions.tolist() == [4, 20, 0]
    assert step.slot_mapping.tolist() == [20, 52, -1]  # a padding row writes nothing
    assert step.query_start_loc.tolist() == [0, 1, 2, 3] and step.logits_rows.tolist() == [0, 1, 2]
    assert step.seq_lens.tolist() == [5, 21, 0]
    assert step.block_tables.tolist() == [[1, 0, 0], [3, 2, 0], [0, 0, 0]]  # the last row came over too


def test_a_prefill_step_pads_with_rows_of_no_request_and_empty_requests():
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    stager = StepStager(CopyingBackend(), max_tokens=8, max_seqs=4, max_blocks=3)
    # Two prompts of 3 and 2 tokens (the second after 16 cached ones), padded to 8 tokens and 4 requests.
    batch = StepBatch(i32(5, 6, 7, 8, 9), i32(0, 1, 2, 16, 17), i32(32, 33, 34, 16, 17), i32(0, 3, 5), i32(3, 18),
                      np.array([[2, 0], [4, 1]], np.int32), 0, 256)
    step = stager.stage(batch, pad_to=4, pad_tokens_to=8)
    assert (step.num_tokens, step.num_seqs, step.num_decodes, step.max_query_len) == (8, 4, 0, 8)
    assert step.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert step.slot_mapping.tolist() == [32, 33, 34, 16, 17, -1, -1, -1]  # padding rows write no K/V
    assert step.query_start_loc.tolist() == [0, 3, 5, 5, 5]  # the padding requests own no rows
    assert step.seq_lens.tolist() == [3, 18, 0, 0] and step.logits_rows.tolist() == [2, 4, 4, 4]
    assert step.prefill_lens == ((3, 3), (2, 18))  # the real requests'


def test_a_step_with_decodes_is_not_padded_as_a_prefill():
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    stager = StepStager(CopyingBackend(), max_tokens=8, max_seqs=4, max_blocks=3)
    batch = StepBatch(i32(5, 6, 7), i32(4, 0, 1), i32(4, 32, 33), i32(0, 1, 3), i32(5, 2), np.zeros((2, 1), np.int32),
                      1, 256)
    with pytest.raises(ValueError, match="cannot be padded"):
        stager.stage(batch, pad_to=2, pad_tokens_to=8)
