"""Public array-level ops that work on NumPy (CPU twins) and CuPy (CUDA kernels) inputs alike.

    combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens,
                             window_size, compress_ratio, topk, M, N) -> (combined_indices, combined_lens)

DeepSeek-V4's merge of each query's top-k compressed-entry indices with its sliding window into workspace row
ids (reference document A.5, bounds-checked variant, -1 tail to a multiple of 128 written by the kernel).
NumPy in -> kernels/combine.py; CuPy in -> kernels/combine.cu (flat grid, one warp per row); the result is the
same kind of array as the input, and the two are bit-identical.
"""
import numpy as np


def combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size: int,
                             compress_ratio: int, topk: int, M: int, N: int):
    if isinstance(topk_indices, np.ndarray):
        from kernels.combine import combine_topk_swa_indices as twin

        return twin(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio, topk, M, N)
    from .backends.cuda_sparse import combine

    return combine(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio, topk, M, N)
