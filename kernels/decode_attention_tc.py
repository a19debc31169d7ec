"""Decode attention the way decode_attention_tc.cu cuts it up: CPU twin of the tensor-core kernel (NumPy, for tests).

The function is kernels/decode_attention.py's (each sequence's new query per head over keys 0..seq_lens[b]-1 of the
paged cache); what this twin adds is the kernel's route to it, so a test can check that the pieces cover every key
once and merge to the same softmax:
  - a sequence's keys are cut into splits (split_chunk: one split up to ONE_SPLIT_TILES tiles of KT keys, else
    equal runs of whole tiles over n_splits);
  - a split is swept in tiles of KT = 64 keys; warp w of the block takes keys 16w..16w+15 of each tile, for every
    head of the GQA group at once (the mma's 16 rows), with its own running max m, sum l and output acc; except
    a split of exactly 2 tiles, swept in one pass where warp w takes keys 32w..32w+31;
  - at the end the 4 warps are merged, each rescaled from its own max to the block's, and then the splits, each
    from the block's max to the sequence's (decode_split.cuh's finish_decode_block).
decode_attention_tc_stream is the long-context kernel's route: the same, but a 2-tile split is swept tile after
tile like any other (the ring of tiles has no 2-tile pass).
Everything is fp32 (the GPU rounds P to 16 bits for the P V product: the GPU tests allow for that).
"""
import numpy as np

KT = 64               # keys a tile (DT_KT)
WARPS = 4             # warps a block, each a 16-key slice of every tile (32 keys in a 2-tile pass)
ONE_SPLIT_TILES = 4   # decode_attention_tc.cu: a sequence of up to this many tiles is one split


def split_chunk(length: int, n_splits: int) -> int:
    """Keys per split (decode_split.cuh): one split up to ONE_SPLIT_TILES tiles, else the length spread evenly
    over the splits in whole tiles."""
    if length <= ONE_SPLIT_TILES * KT:
        return ONE_SPLIT_TILES * KT
    c = -(-length // n_splits)
    return max(KT, -(-c // KT) * KT)


def _online(m, l, acc, s, v):
    """One warp slice: scores s [G, n] (log2 units), values v [n, D] into the running (m [G], l [G], acc [G, D])."""
    m_new = np.maximum(m, s.max(axis=1))
    base = np.where(m_new == -np.inf, 0.0, m_new)  # a slice that has seen no key: exp2(-inf) = 0, never NaN
    alpha = np.exp2(m - base)
    p = np.exp2(s - base[:, None])
    return m_new, l * alpha + p.sum(axis=1), acc * alpha[:, None] + p @ v


def _merge(parts):
    """(m, l, acc) triples -> one, each rescaled from its max to the largest."""
    mx = np.max([m for m, _, _ in parts], axis=0)
    f = [np.exp2(m - mx) for m, _, _ in parts]  # a part without keys has m = -inf: weight 0
    return mx, sum(fi * l for fi, (_, l, _) in zip(f, parts)), sum(fi[:, None] * a for fi, (_, _, a) in zip(f, parts))


def decode_attention_tc(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, n_splits,
                        pair_pass=True):
    """q [B, Hq, D], k_cache / v_cache [slots, Hkv, D], block_tables int [B, M], seq_lens int [B] -> out [B, Hq, D]
    (float32 throughout; zeros where seq_lens[b] == 0). n_splits: the plan's split count (cuda_kernels.py).
    pair_pass: a split of exactly 2 tiles is one pass of 32-key warp slices (decode_attention_tc, not _stream)."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    sl2 = np.float32(scale * np.log2(np.e))
    for b in range(B):
        L = int(seq_lens[b])
        if L == 0:
            out[b] = 0.0
            continue
        keys = np.arange(L)
        slots = block_tables[b, keys // block_size] * block_size + keys % block_size
        chunk = split_chunk(L, n_splits)
        for kvh in range(Hkv):
            qg = q[b, kvh * G:(kvh + 1) * G].astype(np.float32)
            K, V = k_cache[slots, kvh].astype(np.float32), v_cache[slots, kvh].astype(np.float32)
            splits = []
            for k_begin in range(0, L, chunk):
                k_end = min(k_begin + chunk, L)
                warps = [(np.full(G, -np.inf, np.float32), np.zeros(G, np.float32), np.zeros((G, D), np.float32))
                         for _ in range(WARPS)]
                pair = pair_pass and -(-(k_end - k_begin) // KT) == 2
                kt, slice_ = (2 * KT, 32) if pair else (KT, 16)  # keys a pass, keys a warp's slice
                for k0 in range(k_begin, k_end, kt):
                    for w in range(WARPS):
                        lo, hi = k0 + slice_ * w, min(k0 + slice_ * w + slice_, k_end)
                        if lo < hi:
                            warps[w] = _online(*warps[w], (qg @ K[lo:hi].T) * sl2, V[lo:hi])
                splits.append(_merge(warps))
            _, l, acc = _merge(splits)
            out[b, kvh * G:(kvh + 1) * G] = acc / l[:, None]


def decode_attention_tc_stream(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, n_splits):
    """decode_attention_tc_stream's route (decode_attention_tc.cu): every split tile after tile."""
    decode_attention_tc(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, out, n_splits, False)
