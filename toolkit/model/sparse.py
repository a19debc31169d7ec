"""Sparse prefill attention for one layer: indexer -> top-k -> combine -> sparse attention, over the paged cache.

    prefill rows of the step (requests nd..B-1: query_start_loc, seq_lens, block_tables; q post-RoPE, keys of
    this step already written to the cache by rope_qkv)
      compress_keys    kbar [B, N, Hkv, D]  block means of every complete key block      } "indexer"
      query_means      qbar [tiles, Hkv, D]  per query tile (pos // Q) the mean query    }
      scores           [tiles, N] fp32 per chunk of tile rows (never all of [T, N])     }
      topk             [T, K] int32: each row's K best blocks, ascending, -1 padded      "topk"
      gather_lens, combine_topk_swa_indices -> [T, Kc] workspace row ids + lens       "combine"
      tensor cores (16-bit, head dim 64/128): kernels/sparse_attention_tc
        sparse_tile_union -> per 64-query tile the union of its rows' blocks + masks   "combine"
        sparse_attention_tiled -> out rows (mma.sync over union + window span)         "sparse_attention"
      otherwise sparse_attention -> out rows (one CUDA-core block per query)           "sparse_attention"

Parameters come from EngineOptions: K = sparse_topk, W = sparse_window, R = sparse_block, Q = sparse_query_tile
(capped at W - R + 2: kernels/sparse_prefill.py says why). Queries of a tile share one score and one selection,
which keeps the tensor-core kernel's 64-query unions at about K blocks on any data. A row at position pos
has n = (pos+1)//R complete blocks; when n <= K it takes all of them and, W >= R, its key set is 0..pos: the
result is exactly dense causal attention. When every row of the step is that short the indexer is skipped and
(DENSE_WHEN_EXACT) the dense prefill kernel runs instead of the sparse one: same math, and the dense kernel
shares each K/V tile among 64 queries where the sparse one gathers per query. The step is then reported as
"sparse-exact" (experiments/NOTEBOOK.md, "Where does the sparse path pay over the dense kernel?"). Decode rows
never come here: decode stays dense.

Sparse attention pays only where the selection leaves out most keys. A row keeps at most K*R + W of its pos + 1
causal keys, so in a 4,096-token prompt (K*R + W = 2,176) the selection still holds 78% of the causal keys, and the
sparse path (indexer, top-k, unions, masked tiles) was slower than the dense kernel there. kept_keys counts both
over the step's rows; above sparse_max_keep_pct of the causal keys the dense kernel runs (exact, and faster: the
crossover was measured: experiments/NOTEBOOK.md, "Where does the sparse path pay over the dense kernel?") and
the step is reported as "sparse-skipped".

N = max over the requests of seq_len // R and M = N + max gather_len, the reference document's workspace
pitch; these and the chunking are host ints from the step's host-side lengths (DeviceStep.prefill_lens), so
nothing here synchronises with the device. Workspaces grow to the largest step seen and are then reused. That host
work is the same for every layer of a step: the first layer makes it into a plan, the others only launch.
"""
from types import SimpleNamespace

import numpy as np

from toolkit.model.plan import PREFILL_OPS

DENSE_WHEN_EXACT = True  # tests set False to run the sparse kernels on fully covered steps
SCORE_BYTES = 256 << 20  # at most this much fp32 scores at once: queries are scored in chunks of rows
UNION_BYTES = 512 << 20  # tile-union lists above this (B * tiles * min(N, 64K) * 12 bytes): per-query kernel


def query_tile(Q: int, W: int, R: int) -> int:
    """The query tile the indexer runs with: sparse_query_tile capped at W - R + 2, so that the blocks a row has
    beyond its tile's first position all lie in its window (kernels/sparse_prefill.py: the exactness argument)."""
    return max(1, min(int(Q), int(W) - int(R) + 2))


def kept_keys(lens, options) -> tuple:
    """(keys the sparse selection keeps at most, causal keys), summed over the rows of the prefill requests
    `lens` = ((q_len, seq_len), ...). The rows of a request see a+1 .. b causal keys (a = seq_len - q_len,
    b = seq_len); a row keeps all of them up to C = K*R + W, then C (K blocks of R tokens and the window)."""
    C = options.sparse_topk * options.sparse_block + options.sparse_window
    kept = causal = 0
    for n, L in lens:
        a, b = L - n, L
        m = min(max(a, C), b)  # rows with m or fewer keys keep them all
        causal += _sum_to(b) - _sum_to(a)
        kept += _sum_to(m) - _sum_to(a) + (b - m) * C
    return kept, causal


def _sum_to(x: int) -> int:
    return x * (x + 1) // 2


def covered(seq_len: int, options) -> bool:
    """Whether a query at the end of seq_len tokens keeps every complete block (its result is dense attention)."""
    return seq_len // options.sparse_block <= options.sparse_topk


def approximates(lens, options) -> bool:
    """Whether the step's sparse prefill runs the sparse kernels on approximate rows: some row has more complete
    blocks than K, and the selection keeps at most sparse_max_keep_pct of the step's causal keys."""
    if not options.sparse_prefill or all(covered(L, options) for _, L in lens):
        return False
    kept, causal = kept_keys(lens, options)
    return 100 * kept <= options.sparse_max_keep_pct * causal


def step_path(lens, options) -> str:
    """StepTiming.prefill_path of a step whose prefill requests are `lens`: "" for a pure decode step, else
    dense (sparse prefill off) / sparse-exact (every row saw every block) / sparse-approx / sparse-skipped (rows
    beyond K blocks, but the selection would keep so many keys that the dense kernel ran: exact)."""
    if not lens:
        return ""
    if not options.sparse_prefill:
        return "dense"
    if all(covered(L, options) for _, L in lens):
        return "sparse-exact"
    return "sparse-approx" if approximates(lens, options) else "sparse-skipped"


def runs_dense(lens, options) -> bool:
    """Whether a step whose prefill requests have these (q_len, seq_len) runs the dense prefill kernel, and nothing
    else, for its attention: every row sees every block (DENSE_WHEN_EXACT), or the selection keeps too many keys.
    Such a step's kernels do not depend on its lengths, so the runner may replay it from a graph."""
    if max(L // options.sparse_block for _, L in lens) <= options.sparse_topk:
        return DENSE_WHEN_EXACT
    return not approximates(lens, options)


def request_path(seq_len: int, options, path: str) -> str:
    """The prefill path of one request in a step whose path is `path`: exact when its last query sees every
    complete block, else the step's."""
    return "sparse-exact" if path != "dense" and covered(seq_len, options) else path


def merge_paths(old: str, new: str) -> str:
    """A request prefilled over several steps: approximate if any step was (then skipped, then exact)."""
    order = ("", "dense", "sparse-exact", "sparse-skipped", "sparse-approx")
    return max(old, new, key=order.index)


class SparsePrefill:
    """Workspaces and the per-layer driver; one per Model.

    The host work of a layer (lengths, tile counts, slicing the step's arrays and the workspaces) is the same for
    all layers of a step, so it is done once, into a plan, and the other layers only launch kernels: an eager
    4,096-token prefill is bound by the host's launches (experiments/NOTEBOOK.md, "How fast is a whole sparse
    prefill, and where does its host time go?")."""

    def __init__(self, backend):
        self.be = backend
        self._ws = {}  # name -> flat buffer, grown on demand
        self._plan = None  # the last step's plan

    def _buf(self, name: str, shape, dtype):
        n = int(np.prod(shape))
        buf = self._ws.get(name)
        if buf is None or buf.size < n:
            buf = self._ws[name] = self.be.empty((max(n, 1),), dtype)
            # Launches go to CuPy's current stream: make sure an allocation mid-step has not changed it (with
            # CuPy 14.2 a plain `with stream:` did, and the sparse kernels then ran unsynchronised with the step;
            # CudaBackend._on_stream now rebinds too).
            self.be.bind_thread()
        return buf[:n].reshape(shape)

    def plan(self, step, k_cache, nd: int, options, tensor_cores: bool) -> SimpleNamespace:
        """What every layer of the step shares: host ints, device slices and workspace views."""
        K, W, R = options.sparse_topk, options.sparse_window, options.sparse_block
        lens = step.prefill_lens  # host (q_len, seq_len) of each prefill request
        Hkv, D = k_cache.shape[1:]
        key = (tuple(lens), nd, K, W, R, options.sparse_query_tile, options.sparse_max_keep_pct, Hkv, D, tensor_cores,
               DENSE_WHEN_EXACT)
        p = self._plan
        if p is not None and p.step is step and p.key == key:
            return p
        N = max(L // R for _, L in lens)
        qsl, seq_lens, tables = step.query_start_loc[nd:], step.seq_lens[nd:], step.block_tables[nd:]
        dense = runs_dense(lens, options)
        # The plan holds the step object, so its id cannot be reused while the plan is cached.
        p = self._plan = SimpleNamespace(step=step, key=key, N=N, qsl=qsl, seq_lens=seq_lens, tables=tables,
                                         dense=dense, gathered=False, chunks=(), ublk=None)
        if p.dense:
            return p
        T = sum(n for n, _ in lens)
        p.M = N + max(n + min(L - n, W - 1) for n, L in lens)
        p.Q = Q = query_tile(options.sparse_query_tile, W, R)
        tiles = [(L - 1) // Q - (L - n) // Q + 1 for n, L in lens if n > 0]  # tile rows of each request
        p.max_tiles, p.rows = max(tiles), sum(tiles)
        p.topk = self._buf("topk", (T, K), np.int32)
        if N > K:  # some row has more blocks than it keeps: score them, in chunks of tile rows
            p.kbar = self._buf("kbar", (len(lens), N, Hkv, D), np.float32)
            chunk = max(1, min(p.rows, SCORE_BYTES // (4 * N)))
            p.chunks = tuple((r0, min(chunk, p.rows - r0),
                              self._buf("qbar", (min(chunk, p.rows - r0), Hkv, D), np.float32),
                              self._buf("scores", (min(chunk, p.rows - r0), N), np.float32))
                             for r0 in range(0, p.rows, chunk))
        p.gather = self._buf("gather", (len(lens),), np.int32)
        Kc = -(-(K + W) // 128) * 128
        p.combined, p.clens = self._buf("combined", (T, Kc), np.int32), self._buf("clens", (T,), np.int32)
        if tensor_cores:  # the plan's prefill attention is on tensor cores: 16-bit, D 64 or 128
            from kernels.sparse_attention_tc import n_tiles, union_cap

            tc_tiles, cap = n_tiles(max(n for n, _ in lens)), union_cap(N, K)
            if len(lens) * tc_tiles * cap * 12 <= UNION_BYTES:
                p.ublk = self._buf("ublk", (len(lens) * tc_tiles, cap), np.int32)
                p.umask = self._buf("umask", (len(lens) * tc_tiles, cap), np.uint64)
                p.ucount = self._buf("ucount", (len(lens) * tc_tiles,), np.int32)
        return p

    def run(self, step, k_cache, v_cache, bs: int, q, out, nd: int, options, timer, scale: float,
            prefill_kind: str):
        """prefill_kind: the plan's prefill attention (plan.PREFILL_OPS), the kernel of a dense step; the sparse
        tiles go to tensor cores wherever it does."""
        be = self.be
        tensor_cores = prefill_kind != "cuda_cores"
        K, W, R = options.sparse_topk, options.sparse_window, options.sparse_block
        p = self.plan(step, k_cache, nd, options, tensor_cores)
        qsl, seq_lens, tables = p.qsl, p.seq_lens, p.tables
        timer.lap("attention")  # qkv, RoPE and the decode rows so far
        if p.dense:
            dense = getattr(be, PREFILL_OPS[prefill_kind])
            dense(q, k_cache, v_cache, tables, qsl, seq_lens, bs, scale, out, step.max_query_len)
            timer.lap("sparse_attention")
            return
        N, M, Q = p.N, p.M, p.Q
        if p.chunks:
            be.sparse_compress_keys(k_cache, tables, seq_lens, bs, R, p.kbar)
            for r0, rows, qbar, scores in p.chunks:
                be.sparse_query_means(q, qsl, seq_lens, Q, r0, qbar, p.max_tiles)
                be.sparse_scores(qbar, p.kbar, qsl, seq_lens, R, Q, r0, scores, p.max_tiles)
                timer.lap("indexer")
                be.sparse_topk(scores, qsl, seq_lens, R, K, Q, r0, p.topk, rows)
                timer.lap("topk")
        else:  # every row short: all blocks in order, no indexer
            be.sparse_topk(None, qsl, seq_lens, R, K, Q, 0, p.topk, p.rows)
            timer.lap("topk")
        if not p.gathered:  # the same for every layer: launched by the first one
            be.sparse_gather_lens(qsl, seq_lens, W, p.gather)
            p.gathered = True
        be.combine_topk_swa_indices(p.topk, qsl, seq_lens, p.gather, W, R, K, M, N, p.combined, p.clens)
        if p.ublk is not None:
            be.sparse_tile_union(qsl, seq_lens, p.combined, p.clens, M, N, W, R, K, Q, p.ublk, p.umask, p.ucount)
            timer.lap("combine")
            be.sparse_attention_tiled(q, k_cache, v_cache, tables, qsl, seq_lens, p.ublk, p.umask, p.ucount, W, R,
                                      K, bs, scale, out)
            timer.lap("sparse_attention")
            return
        timer.lap("combine")
        be.sparse_attention(q, k_cache, v_cache, tables, qsl, seq_lens, p.combined, p.clens, M, N, W, R, bs, scale,
                            out)
        timer.lap("sparse_attention")
