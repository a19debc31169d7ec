"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, reference counts, prefix hashes.

The cache is `num_blocks` blocks of `block_size` token slots (16: vLLM's default. A request wastes
at most 15 slots, a prefix is reused in steps of 16 tokens, and a 64-key attention tile spans 4
blocks, so the block-table lookups cost little next to the K/V reads).

Prefix caching (after vLLM and nano-vllm): once a block is full and its K/V are written, it is
keyed by a hash chained over every token up to its end, h_i = hash((h_{i-1}, tokens of block i)),
so equal hashes mean equal whole prefixes. A new request walks its full prompt blocks from the
start; each hit is shared (ref_count + 1) instead of recomputed. A freed block keeps its hash and
contents in the free list, oldest first, until it is handed out again: that is the eviction.
At least the last prompt token is always recomputed, because its logits pick the first new token.
"""
from collections import OrderedDict

import numpy as np


class Block:
    __slots__ = ("id", "ref_count", "hash", "tokens")

    def __init__(self, block_id: int):
        self.id, self.ref_count, self.hash, self.tokens = block_id, 0, None, None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free = OrderedDict.fromkeys(range(num_blocks))  # ids with ref_count 0, least recently freed first
        self.cached = {}  # hash -> block id, for full blocks whose K/V are in the cache

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- admission -------------------------------------------------------------------------------------
    def match_prefix(self, seq) -> list:
        """Block ids holding the longest cached prefix of seq's tokens (full blocks, last token excluded)."""
        if not self.prefix_caching:
            return []
        bs, toks, hits, h = self.block_size, seq.token_ids, [], None
        for i in range((len(toks) - 1) // bs):
            chunk = tuple(toks[i * bs:(i + 1) * bs])
            h = hash((h, chunk))
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].tokens != chunk:  # a miss (or a hash collision)
                break
            hits.append(bid)
        return hits

    def admit(self, seq, hits: list):
        """Give seq the cached blocks `hits`."""
        for bid in hits:
            b = self.blocks[bid]
            if b.ref_count == 0:
                del self.free[bid]
            b.ref_count += 1
            seq.block_table.append(bid)
            seq.block_hashes.append(b.hash)

    # -- growth ------------------------------------------------------------------------------------------
    def needed(self, seq, n: int) -> int:
        """New blocks seq needs to hold its computed tokens plus n more."""
        return max(0, self.blocks_for(seq.num_computed + n) - len(seq.block_table))

    def append_slots(self, seq, n: int):
        """Allocate blocks so that n more tokens of seq fit (check `needed` against `num_free` first)."""
        for _ in range(self.needed(seq, n)):
            bid, _ = self.free.popitem(last=False)  # the least recently freed block
            b = self.blocks[bid]
            if b.hash is not None:  # evict its cached prefix
                if self.cached.get(b.hash) == bid:
                    del self.cached[b.hash]
                b.hash = b.tokens = None
            b.ref_count = 1
            seq.block_table.append(bid)

    def commit(self, seq, num_tokens: int):
        """Key every block of seq that is full within its first num_tokens tokens (K/V written by then)."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // bs):
            prev = seq.block_hashes[-1] if seq.block_hashes else None
            chunk = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = hash((prev, chunk))
            b = self.blocks[seq.block_table[i]]
            b.hash, b.tokens = h, chunk
            self.cached.setdefault(h, b.id)  # an identical block computed twice: keep the first
            seq.block_hashes.append(h)

    def release(self, seq):
        """Drop seq's references; blocks nobody uses go to the free list, tail first (evicted first)."""
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free[bid] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.table_array = None  # the next table is a new one, not this one grown


def slot_mapping(block_table: list, start: int, n: int, block_size: int) -> list:
    """KV-cache slots of positions start .. start+n-1 of a request holding these blocks."""
    bs = block_size
    return [block_table[p // bs] * bs + p % bs for p in range(start, start + n)]


def table_array(seq) -> np.ndarray:
    """seq's block table as an int32 array (a view). Between releases a table only grows, so its array is kept on the
    request and extended in place: a step copies these rows array to array, where converting 256 lists took ~0.2 ms
    of host time a step (dev/host_overhead.py)."""
    table, arr, n = seq.block_table, seq.table_array, len(seq.block_table)
    if arr is None or len(arr) < n:
        arr = seq.table_array = np.zeros(max(16, 2 * n), np.int32)
        seq.table_filled = 0
    if seq.table_filled < n:
        arr[seq.table_filled:n] = table[seq.table_filled:]
        seq.table_filled = n
    return arr[:n]
