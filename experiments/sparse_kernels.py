"""GPU time of each kernel of the sparse path for one layer (Qwen2.5-0.5B shape, one fresh prompt, K 512 W 128
R 4), each replayed from a CUDA graph (toolkit/bench/sparse.py's _graph_us: no Python between launches), after
one eager run of the whole path that fills the workspaces. With Q = 1 at 32K the indexer runs in chunks of rows:
query_means, scores and topk are then timed for the first chunk only (the whole path includes every chunk). Run from the repo root on the GPU:
`PYTHONPATH=. python3 experiments/sparse_kernels.py [T ...]`."""
import sys

import numpy as np

from toolkit.backends.cuda import CudaBackend
from toolkit.bench.sparse import _graph_us
from toolkit.engine.options import EngineOptions
from toolkit.model.sparse import SparsePrefill, query_tile
from toolkit.engine.timings import NullTimer

be = CudaBackend("bfloat16")
be.bind_thread()
cp = be.cp
Hq, Hkv, D, bs, K, W, R = 14, 2, 64, 16, 512, 128, 4
for T in [int(x) for x in sys.argv[1:]] or [16384, 32768]:
    rng = np.random.default_rng(T)
    with be.stream:
        bf16 = lambda a: (cp.asarray(a).view(cp.uint32) >> 16).astype(cp.uint16)  # fp32 -> bf16 bits (truncate)
        q = bf16(rng.standard_normal((T, Hq, D), np.float32))
        kc = bf16(rng.standard_normal((T, Hkv, D), np.float32))  # token k in slot k (identity block table)
        vc = bf16(rng.standard_normal((T, Hkv, D), np.float32))
        table = cp.arange(-(-T // bs), dtype=cp.int32)[None, :]
        qsl, seq_lens = cp.asarray(np.array([0, T], np.int32)), cp.asarray(np.array([T], np.int32))
        out = cp.empty_like(q)
    be.bind_thread()

    class Step:
        prefill_lens, max_query_len = ((T, T),), T
        query_start_loc, seq_lens, block_tables = qsl, seq_lens, table

    for Qopt in (64, 1):
        opts = EngineOptions(sparse_topk=K, sparse_window=W, sparse_block=R, sparse_query_tile=Qopt,
                             sparse_max_keep_pct=100)
        sp = SparsePrefill(be)
        sp.run(Step, kc, vc, bs, q, out, 0, opts, NullTimer(), D ** -0.5, True)
        ws, Q, N = sp._ws, query_tile(Qopt, W, R), T // R
        tiles = -(-T // Q)
        rows = min(tiles, ws["scores"].size // N)  # the first chunk of tile rows (scores are chunked at 256 MB)
        M = N + T
        kbar = ws["kbar"][:N * Hkv * D].reshape(1, N, Hkv, D)
        qbar = ws["qbar"][:rows * Hkv * D].reshape(rows, Hkv, D)
        scores = ws["scores"][:rows * N].reshape(rows, N)
        topk = ws["topk"][:T * K].reshape(T, K)
        Kc = -(-(K + W) // 128) * 128
        comb, clens, gather = ws["combined"][:T * Kc].reshape(T, Kc), ws["clens"][:T], ws["gather"][:1]
        ops = {
            "compress_keys": lambda: be.sparse_compress_keys(kc, table, seq_lens, bs, R, kbar),
            "query_means": lambda: be.sparse_query_means(q, qsl, seq_lens, Q, 0, qbar, tiles),
            "scores": lambda: be.sparse_scores(qbar, kbar, qsl, seq_lens, R, Q, 0, scores, tiles),
            "topk": lambda: be.sparse_topk(scores, qsl, seq_lens, R, K, Q, 0, topk, rows),
            "combine": lambda: be.combine_topk_swa_indices(topk, qsl, seq_lens, gather, W, R, K, M, N, comb, clens),
        }
        if "ublk" in ws:
            tl = -(-T // 64)
            ub, um, uc = ws["ublk"], ws["umask"], ws["ucount"][:tl]
            cap = ub.size // ws["ucount"].size
            ub, um = ub[:tl * cap].reshape(tl, cap), um[:tl * cap].reshape(tl, cap)
            ops["tile_union"] = lambda: be.sparse_tile_union(qsl, seq_lens, comb, clens, M, N, W, R, K, Q, ub, um, uc)
            ops["attention_tc"] = lambda: be.sparse_attention_tiled(q, kc, vc, table, qsl, seq_lens, ub, um, uc, W,
                                                                    R, K, bs, D ** -0.5, out)
        ops["whole path"] = lambda: sp.run(Step, kc, vc, bs, q, out, 0, opts, NullTimer(), D ** -0.5, True)
        for name, fn in ops.items():
            print(f"T={T} Q={Qopt} {name:14s} {_graph_us(cp, be.stream, fn, replays=5):9.1f} us", flush=True)
