"""Test helper shared by the CPU-twin and GPU kernel tests: a paged KV cache with sequences in shuffled blocks."""
import numpy as np


def paged_cache(rng, lens, hkv, hd, block_size=16, spare=5, values=None, past_end="garbage"):
    """K/V caches [num_slots, hkv, hd] holding `values((L, hkv, hd))` (default: standard normal) in the slots of
    keys 0..L-1 of each sequence, NaN in every other slot, so reading one poisons the output; and the block
    tables. Table entries past a sequence's blocks are -1 (`past_end="-1"`, as the engine may leave them) or
    point at unused, all-NaN blocks ("garbage"). Returns (k_cache, v_cache, block_tables)."""
    values = values or (lambda shape: rng.standard_normal(shape, np.float32))
    need = [-(-L // block_size) for L in lens]
    n_blocks = sum(need) + spare
    order = rng.permutation(n_blocks).astype(np.int32)
    table = np.full((len(lens), max(need + [1]) + 2), -1, np.int32)
    if past_end == "garbage":
        table[:] = rng.choice(order[sum(need):], table.shape)
    kc = np.full((n_blocks * block_size, hkv, hd), np.nan, np.float32)
    vc = np.full_like(kc, np.nan)
    used = 0
    for b, L in enumerate(lens):
        table[b, :need[b]] = order[used:used + need[b]]
        used += need[b]
        keys = np.arange(L)
        slots = table[b, keys // block_size].astype(np.int64) * block_size + keys % block_size
        kc[slots], vc[slots] = values((L, hkv, hd)), values((L, hkv, hd))
    return kc, vc, table
