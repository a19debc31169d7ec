"""`python -m toolkit bench sparse`: the sparse prefill's kernels and quality, as markdown tables.

    combine    combine_topk_swa_indices at DeepSeek-V4-Flash shapes (K 512, W 128, R 4, one fresh request of T
               tokens, N = T/4, M = N + T), the engine's warp a row against vLLM's persistent layout at 128 and
               256 workers: GPU time per launch from CUDA events around a CUDA graph of REPLAYS launches (launch
               overhead excluded), and the launch-inclusive time of eager back-to-back launches from Python.
    layer      one layer's attention at Qwen2.5-0.5B's shape (14 q heads, 2 kv heads, D 64, bf16, random values,
               one fresh prompt of T tokens in the paged cache): our dense tensor-core kernel, the sparse path
               phase by phase (indexer, top-k, gather lens + combine + tile union, sparse attention) from events
               on the backend's stream, its device-synchronised wall time (a cross-check: work launched on another
               stream would show here and not in the events), its GPU time alone (replayed from a CUDA graph: no
               Python between the launches), the per-query CUDA-core kernel, the mean union
               size of a 64-query tile, and PyTorch SDPA (FlashAttention backend, and cuDNN's).
    quality    stories260K: teacher-forced prefill logits of a greedy dense story, dense vs tight sparse
               (W 32, R 4, K 16): greedy (argmax) agreement and mean KL(dense || sparse) over the positions.
    layer and quality run once per --query-tiles value (sparse_query_tile; default 64 and 1).
"""
import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from toolkit.engine.options import EngineOptions
from toolkit.engine.timings import NullTimer
from .env import environment
from .sampler import torch_us

REPLAYS = 100


def _graph_us(cp, stream, fn, replays=REPLAYS):
    """GPU microseconds per call of fn() from a captured graph of `replays` calls."""
    fn()
    stream.synchronize()
    stream.begin_capture()
    for _ in range(replays):
        fn()
    graph = stream.end_capture()
    return _timed_ms(cp, stream, lambda: graph.launch(stream), reps=1) * 1e3 / replays  # one replay, warmed up


def _eager_us(stream, fn, n=REPLAYS):
    """Launch-inclusive: wall time of n back-to-back launches from Python, synchronised at the end."""
    fn()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def _timed_ms(cp, stream, fn, reps=5):
    """GPU ms per call of fn() over `reps` calls after a warm-up one, from events on `stream`."""
    fn()
    stream.synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(stream)
    for _ in range(reps):
        fn()
    b.record(stream)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / reps


def bench_combine(be, tokens):
    cp = be.cp
    rows = ["| T | split | GPU µs/launch (graph) | launch-inclusive µs | GB/s |", "|---:|---|---:|---:|---:|"]
    K, W, R = 512, 128, 4
    for T in tokens:
        N = T // R
        M = N + T
        rng = np.random.default_rng(T)
        topk = cp.asarray(np.sort(rng.integers(0, N, (T, K)), axis=1).astype(np.int32))
        qsl = cp.asarray(np.array([0, T], np.int32))
        seq_lens = cp.asarray(np.array([T], np.int32))
        gather = cp.asarray(np.array([T], np.int32))
        Kc = -(-(K + W) // 128) * 128
        out, lens = cp.empty((T, Kc), cp.int32), cp.empty(T, cp.int32)
        moved = T * (min(K, N) * 4 + Kc * 4 + 4)  # top-k read + combined row and length written
        for workers in (128, 256, None):
            def fn():
                be._sparse.combine(topk, qsl, seq_lens, gather, W, R, K, M, N, out, lens, workers=workers)
            g = _graph_us(cp, be.stream, fn)
            e = _eager_us(be.stream, fn)
            name = "flat_warp" if workers is None else f"persistent {workers} workers"
            rows.append(f"| {T} | {name} | {g:.2f} | {e:.2f} | {moved / g / 1e3:.0f} |")
    return rows


def bench_layer(be, tokens, K=512, W=128, R=4, query_tiles=(64, 1)):
    cp = be.cp
    from toolkit.model.plan import PREFILL_OPS, tensor_core_prefill
    from toolkit.model.sparse import SparsePrefill

    Hq, Hkv, D, bs = 14, 2, 64, 16
    scale = D ** -0.5
    rows = ["| T | Q | dense (ours) ms | indexer ms | top-k ms | combine + union ms | sparse attn ms | "
            "sparse total ms | sparse total, wall ms | sparse total, graph ms | per-query kernel ms | "
            "union blocks/tile | SDPA ms | sparse / SDPA | graph / SDPA | dense / SDPA | SDPA cuDNN ms | "
            "sparse / cuDNN | graph / cuDNN | gathered workspace: K+V rows, GB | gather ms |", "|---:|" + "---:|" * 20]
    for T in tokens:
        rng = np.random.default_rng(T)
        with be.stream:
            q, kf, vf = (cp.asarray(rng.standard_normal((T, h, D), np.float32)) for h in (Hq, Hkv, Hkv))
            bits = lambda a: (a.view(cp.uint32) >> 16).astype(cp.uint16)  # fp32 -> bf16 (truncate; random data)
            qb, kb, vb = bits(q), bits(kf), bits(vf)
            nb = -(-T // bs)
            table = cp.asarray(rng.permutation(nb).astype(np.int32)[None, :])
            # cache slot of token k = table[k // bs] * bs + k % bs: scatter the keys into their slots
            slots = (table[0, cp.arange(T) // bs] * bs + cp.arange(T) % bs)
            kc, vc = cp.empty_like(kb), cp.empty_like(vb)
            kc[slots], vc[slots] = kb, vb
            qsl = cp.asarray(np.array([0, T], np.int32))
            seq_lens = cp.asarray(np.array([T], np.int32))
            out = cp.empty_like(qb)
        be.bind_thread()  # leaving `with stream` need not leave our stream current: kernels launch on the current one
        kind = tensor_core_prefill(be)  # the dense kernel a plan runs here
        dense_op = getattr(be, PREFILL_OPS[kind])
        dense = _timed_ms(cp, be.stream, lambda: dense_op(qb, kc, vc, table, qsl, seq_lens, bs, scale, out, T))
        sparse = SparsePrefill(be)
        step = SimpleNamespace(prefill_lens=((T, T),), query_start_loc=qsl, seq_lens=seq_lens, block_tables=table,
                               max_query_len=T)
        sdpa = _sdpa_ms(q, kf, vf, Hq, Hkv)
        cudnn = _sdpa_ms(q, kf, vf, Hq, Hkv, "CUDNN_ATTENTION")

        def run_laps(opts, prefill_kind, reps=3):
            """Per-section event times over `reps` runs after a warm-up (compile, workspaces), and the wall time of
            the same runs with the whole device synchronised: it also sees work that strayed off our stream."""
            laps, tm = {}, be.section_timer()  # events on the backend's stream
            sparse.run(step, kc, vc, bs, qb, out, 0, opts, NullTimer(), scale, prefill_kind)
            be.bind_thread()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                tm.start()
                sparse.run(step, kc, vc, bs, qb, out, 0, opts, tm, scale, prefill_kind)
                if cp.cuda.get_current_stream().ptr != be.stream.ptr:
                    raise RuntimeError("bench sparse: the sparse path left another stream current")
                for name, ms in tm.laps_ms():
                    if name != "attention":
                        laps[name] = laps.get(name, 0.0) + ms / reps
            cp.cuda.Device().synchronize()
            return laps, (time.perf_counter() - t0) * 1e3 / reps

        for Q in query_tiles:
            opts = EngineOptions(sparse_topk=K, sparse_window=W, sparse_block=R, sparse_query_tile=Q,
                                 sparse_max_keep_pct=100)
            laps, wall = run_laps(opts, kind)
            total = sum(laps.values())
            graph = _graph_us(cp, be.stream, lambda: sparse.run(step, kc, vc, bs, qb, out, 0, opts, NullTimer(), scale,
                                                                kind), replays=3) / 1e3
            ws = sparse._ws.get("ucount")
            union = "-"
            if ws is not None:  # the tiled route ran: mean union size of the prompt's tiles
                counts = ws[:-(-T // 64)].get()
                counts = counts[counts > 0]  # covered tiles (the first K*R positions) have none: they run causal
                union = f"{counts.mean():.0f} of N={T // R}" if len(counts) else "covered"
            gathered, gather = _gather_ms(cp, be.stream, sparse._ws, -(-T // 64), table, bs, R, kc, vc) \
                if ws is not None else ("-", None)
            be.bind_thread()
            per_query = run_laps(opts, "cuda_cores", reps=1)[0].get("sparse_attention")
            f = lambda x: "-" if x is None else f"{x:.3f}"
            ratio = lambda a, b: "-" if b is None else f"{a / b:.2f}"
            rows.append(f"| {T} | {Q} | {dense:.3f} | {f(laps.get('indexer', 0.0))} | {f(laps.get('topk'))} | "
                        f"{f(laps.get('combine'))} | {f(laps.get('sparse_attention'))} | {total:.3f} | {wall:.3f} | "
                        f"{graph:.3f} | {f(per_query)} | {union} | {f(sdpa)} | {ratio(total, sdpa)} | "
                        f"{ratio(graph, sdpa)} | {ratio(dense, sdpa)} | {f(cudnn)} | {ratio(total, cudnn)} | "
                        f"{ratio(graph, cudnn)} | {gathered} | {f(gather)} |")
        del q, kf, vf, qb, kb, vb, kc, vc, out, sparse
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def _gather_ms(cp, stream, ws, tiles, table, bs, R, kc, vc):
    """The alternative to reading keys in place through the block table: copy each tile's keys (its union of
    selected blocks; the window adds ~2% more) into a contiguous workspace, K and V, as a gather kernel would
    before the attention. Returns ("rows, GB", ms) for that copy alone, timed on `stream` (cupy.take)."""
    counts = ws["ucount"][:tiles]
    cap, rest = divmod(ws["ublk"].size, ws["ucount"].size)  # one request: ublk is [tiles, cap], ucount [tiles]
    assert not rest and ws["ucount"].size == tiles, "bench sparse: unexpected union workspace shape"
    blocks = ws["ublk"][:tiles * cap].reshape(tiles, cap)[cp.arange(cap)[None, :] < counts[:, None]]
    tokens = (blocks[:, None] * R + cp.arange(R, dtype=cp.int32)[None, :]).ravel()
    slots = table[0, tokens // bs] * bs + tokens % bs
    wk = cp.empty((slots.size,) + kc.shape[1:], kc.dtype)
    wv = cp.empty_like(wk)

    def fn():
        cp.take(kc, slots, axis=0, out=wk)
        cp.take(vc, slots, axis=0, out=wv)
    ms = _timed_ms(cp, stream, fn)  # the current stream is `stream` (bench_layer bound it)
    return f"{slots.size / 1e6:.1f} M, {2 * wk.nbytes / 1e9:.2f}", ms


def _sdpa_ms(q, k, v, Hq, Hkv, backend="FLASH_ATTENTION"):
    """One layer's causal attention in PyTorch SDPA with one backend (K/V heads repeated for the group), or None
    when torch or that backend is not available here."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    tq, tk, tv = (torch.as_tensor(a, device="cuda").to(torch.bfloat16).transpose(0, 1)[None] for a in (q, k, v))
    tk, tv = (t.repeat_interleave(Hq // Hkv, dim=1).contiguous() for t in (tk, tv))
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            fn = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            fn()
            torch.cuda.synchronize()
            return torch_us(torch, fn, 5) / 1e3
    except RuntimeError:  # no kernel of that backend for these inputs
        return None


def bench_quality(device, stories, n_tokens=480, K=16, W=32, R=4, query_tiles=(64, 1)):
    """One row per sparse_query_tile (the effective tile, capped at W - R + 2, in brackets)."""
    from toolkit.engine.build import build_engine
    from toolkit.model.sparse import query_tile

    dense = build_engine(stories, device=device, max_context=512, options=EngineOptions(sparse_prefill=False),
                         warmup=False, **({"dtype": "float32"} if device == "cuda" else {}))
    ids = [1]  # BOS, then a greedy dense story (teacher-forced prefills: no sampler involved)
    while len(ids) < n_tokens:
        ids.append(int(np.argmax(dense.logits(ids)[-1])))
    ld = dense.logits(ids).astype(np.float64)

    def logsoftmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    approx = np.arange(len(ids)) + 1 > K * R  # positions whose query did not see every block
    rows = ["| query tile Q | positions | greedy agreement | mean KL (nats) | max KL |", "|---|---|---:|---:|---:|"]
    for Q in query_tiles:
        dense.set_options(EngineOptions(sparse_topk=K, sparse_window=W, sparse_block=R, sparse_query_tile=Q,
                                        sparse_max_keep_pct=100))
        ls = dense.logits(ids).astype(np.float64)
        pd, ps = logsoftmax(ld), logsoftmax(ls)
        kl = (np.exp(pd) * (pd - ps)).sum(-1)
        agree = (ld.argmax(-1) == ls.argmax(-1))
        q = f"{Q} ({query_tile(Q, W, R)})"
        rows += [f"| {q} | all {len(ids)} | {agree.mean():.4f} | {kl.mean():.5f} | {kl.max():.4f} |",
                 f"| {q} | approximate only ({approx.sum()}, pos+1 > K*R = {K * R}) | {agree[approx].mean():.4f} | "
                 f"{kl[approx].mean():.5f} | {kl[approx].max():.4f} |"]
    return rows


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m toolkit bench sparse", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tests", default="combine,layer,quality", help="comma list of combine, layer, quality")
    p.add_argument("--tokens", default="1024,4096,16384", help="combine sweep token counts")
    p.add_argument("--layer-tokens", default="4096,16384,32768", help="per-layer prompt lengths")
    p.add_argument("--query-tiles", default="64,1", help="sparse_query_tile values for layer and quality (1: a "
                                                         "selection per query, the issue's literal score)")
    p.add_argument("--stories", default=None, help="stories260K folder (default: ../shared/models/stories260K)")
    args = p.parse_args(argv)
    tests = args.tests.split(",")
    tiles = tuple(int(x) for x in args.query_tiles.split(","))
    print("## Environment\n")
    for k, v in environment(args.device).items():
        print(f"- {k}: {v}")
    if args.device == "cuda" and ("combine" in tests or "layer" in tests):
        from ..backends.cuda import CudaBackend

        be = CudaBackend("bfloat16")
        be.bind_thread()
        if "combine" in tests:
            print("\n## combine_topk_swa_indices (K 512, W 128, R 4, N = T/4, M = N + T)\n")
            print("\n".join(bench_combine(be, [int(x) for x in args.tokens.split(",")])), flush=True)
        if "layer" in tests:
            print("\n## One layer's prefill attention, Qwen2.5-0.5B shape (14/2 heads, D 64, bf16), K 512 W 128 R 4\n")
            rows = bench_layer(be, [int(x) for x in args.layer_tokens.split(",")], query_tiles=tiles)
            print("\n".join(rows), flush=True)
    if "quality" in tests:
        stories = args.stories or str(Path(__file__).resolve().parents[3] / "shared" / "models" / "stories260K")
        if Path(stories, "config.json").is_file():
            print("\n## Quality on stories260K: dense vs sparse W 32, R 4, K 16 (teacher-forced prefill logits)\n")
            print("\n".join(bench_quality(args.device, stories, query_tiles=tiles)))
        else:
            print(f"\n(quality skipped: no {stories})")
    return 0
