"""Time every CUDA kernel at Qwen2.5-0.5B shapes and compare with PyTorch equivalents when torch is importable.

The attention kernels run on a paged KV cache (16-token blocks, shuffled block tables, as the engine lays it
out); PyTorch has no paged attention, so its column is SDPA on contiguous K/V of the same lengths.

    PYTHONPATH=. python dev/bench_kernels.py [--dtype bfloat16|float16|float32] [--reps 7]

Times are GPU microseconds per call, the median over `reps` timings (CUDA events). "graph" replays a CUDA
graph of N back-to-back calls, which removes launch overhead and shows the kernel's own time; "eager" launches
N calls from Python, whose per-call time is the larger of the GPU time and the host's launch cost -- the number
a decode step pays without graphs. "host" is the Python-side cost of one wrapper call. Torch is timed the same
way (graph when it captures, else eager).
"""
import argparse
import itertools
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402

from toolkit.backends.cuda_kernels import CudaKernels  # noqa: E402

H, HQ, HKV, D, I, V = 896, 14, 2, 64, 4864, 151936
N_CALLS = 20  # calls per timing


def cycling(f, copies):
    """A call that runs f on the next of `copies` (copies of one weight matrix, together past the 50 MB L2) each
    time, so that every call reads its weights from DRAM, as the layers of a decode step do."""
    it = itertools.cycle(copies)
    return lambda: f(next(it))


def time_calls(fn, reps, use_graph, backend="cupy", stream=None):
    """Median GPU microseconds per call of fn() over `reps` timings of N_CALLS calls, on `stream` (a new one
    unless given: cuBLAS through the backend launches on the stream its handle is bound to)."""
    if backend == "torch":
        import torch

        stream = torch.cuda.Stream()
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        with torch.cuda.stream(stream):
            fn()
            torch.cuda.synchronize()
            run = lambda: [fn() for _ in range(N_CALLS)]  # noqa: E731
            if use_graph:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    run()
                run = g.replay
            times = []
            for _ in range(reps + 1):
                a, b = ev(), ev()
                a.record(stream)
                run()
                b.record(stream)
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000 / N_CALLS)
        return statistics.median(times[1:])
    stream = stream or cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # compile, allocate workspaces
        stream.synchronize()
        run = lambda: [fn() for _ in range(N_CALLS)]  # noqa: E731
        if use_graph:
            stream.begin_capture()
            run()
            graph = stream.end_capture()
            run = lambda: graph.launch(stream)  # noqa: E731
        times = []
        for _ in range(reps + 1):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            run()
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1000 / N_CALLS)
    return statistics.median(times[1:])


def host_us(fn, n=200):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t) / n * 1e6
        stream.synchronize()
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    dt, k = args.dtype, CudaKernels(args.dtype)
    rt = cp.cuda.runtime
    print(f"GPU: {rt.getDeviceProperties(0)['name'].decode()}  driver API {rt.driverGetVersion()}  "
          f"CuPy {cp.__version__}  CUDA runtime {rt.runtimeGetVersion()}  NVRTC {cp.cuda.nvrtc.getVersion()}")
    try:
        import torch
        import torch.nn.functional as F

        has_torch = torch.cuda.is_available()
        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dt]
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda})" if has_torch else "torch: no CUDA")
    except ImportError:
        has_torch = False
        print("torch not importable: no comparison column")

    st = {"bfloat16": cp.uint16, "float16": cp.float16, "float32": cp.float32}[dt]
    rng = cp.random.default_rng(0)

    def rand(*shape, scale=1.0):  # random values in the storage dtype (bf16 bits from an fp32 draw)
        x = (rng.standard_normal(shape, dtype=cp.float32) * scale)
        if dt == "bfloat16":
            return ((x.view(cp.uint32) + 0x7FFF + ((x.view(cp.uint32) >> 16) & 1)) >> 16).astype(cp.uint16)
        return x.astype(st)

    def trand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=tdt) * scale

    rows = []  # (op, shape, ours_graph, ours_eager, host, torch, flops)

    def add(op, shape, fn, tfn=None, flops=None, stream=None):
        g = time_calls(fn, args.reps, True, stream=stream)
        e = time_calls(fn, args.reps, False, stream=stream)
        h = host_us(fn)
        t = None
        if has_torch and tfn is not None:
            try:
                t = time_calls(tfn, args.reps, True, "torch")
            except Exception:  # some torch ops refuse graph capture: time them eagerly
                t = time_calls(tfn, args.reps, False, "torch")
        rows.append((op, shape, g, e, h, t, flops))
        print(f"  {op:22s} {shape:34s} {g:9.1f} us", flush=True)

    S, BS = 4096, 16  # cache slots for the elementwise ops; KV block size
    host_rng = np.random.default_rng(0)

    def paged(lens, hd):
        """Paged caches holding sequences of these lengths in shuffled blocks: (k, v, block_tables, seq_lens)."""
        need = [-(-L // BS) for L in lens]
        order = host_rng.permutation(sum(need)).astype(np.int32)
        table = np.zeros((len(lens), max(need)), np.int32)
        for b, n in enumerate(need):
            table[b, :n], order = order[:n], order[n:]
        n_slots = sum(need) * BS
        return (rand(n_slots, HKV, hd), rand(n_slots, HKV, hd), cp.asarray(table),
                cp.asarray(np.array(lens, np.int32)))

    cos = cp.cos(cp.outer(cp.arange(S, dtype=cp.float32), cp.ones(D // 2, cp.float32)))
    sin = cp.sin(cp.outer(cp.arange(S, dtype=cp.float32), cp.ones(D // 2, cp.float32)))
    kc, vc = rand(S, HKV, D), rand(S, HKV, D)
    table = rand(V, H)
    for T in (1, 4096):
        pos = cp.asarray(np.arange(T, dtype=np.int32) if T > 1 else np.array([S - 1], np.int32))
        slots = cp.asarray(host_rng.permutation(S)[:T].astype(np.int32))
        ids = cp.asarray(host_rng.integers(0, V, T).astype(np.int32))
        x, res, w, out = rand(T, H), rand(T, H), rand(H), rand(T, H)
        qkv, bias, q = rand(T, (HQ + 2 * HKV) * D), rand((HQ + 2 * HKV) * D), rand(T, HQ, D)
        gu, act = rand(T, 2 * I), rand(T, I)
        tt = {}
        if has_torch:
            tt = dict(ids=torch.randint(0, V, (T,), device="cuda"), table=trand(V, H), x=trand(T, H), r=trand(T, H),
                      w=trand(H), qkv=trand(T, (HQ + 2 * HKV) * D), cos=trand(T, D), sin=trand(T, D),
                      kc=trand(S, HKV, D), gu=trand(T, 2 * I),
                      slots=torch.as_tensor(cp.asnumpy(slots), device="cuda", dtype=torch.long))

        def t_rms(tt=tt):
            h = (tt["x"] + tt["r"]).float()
            return tt["w"] * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(tdt)

        def t_rope(tt=tt, T=T):
            qkv = tt["qkv"].view(T, HQ + 2 * HKV, D)
            qk = qkv[:, : HQ + HKV]
            rot = torch.cat((-qk[..., D // 2:], qk[..., : D // 2]), -1)
            out = qk * tt["cos"][:, None] + rot * tt["sin"][:, None]
            tt["kc"][tt["slots"]] = out[:, HQ:]
            return out

        add("embedding", f"T={T} H={H}", lambda: k.embedding(ids, table, out),
            lambda tt=tt: F.embedding(tt["ids"], tt["table"]))
        add("add_rmsnorm", f"T={T} H={H}", lambda: k.add_rmsnorm(x, res, w, 1e-6, out), t_rms)
        add("rope_qkv", f"T={T} Hq={HQ} Hkv={HKV} D={D}",
            lambda: k.rope_qkv(qkv, bias, None, None, 1e-6, cos, sin, pos, slots, HQ, HKV, q, kc, vc), t_rope)
        add("silu_mul", f"T={T} I={I}", lambda: k.silu_mul(gu, act),
            lambda tt=tt: F.silu(tt["gu"][:, :I]) * tt["gu"][:, I:])

    # Prefill attention: one 4096-token prompt from position 0, causal, through the paged cache.
    for hd in (64, 128):
        T = 4096
        q, o = rand(T, HQ, hd), rand(T, HQ, hd)
        kc2, vc2, bt, lens = paged([T], hd)
        qsl = cp.asarray(np.array([0, T], np.int32))
        flops = 4 * HQ * hd * T * (T + 1) / 2
        sdpa = None
        if has_torch:
            tq, tk, tv = trand(1, HQ, T, hd), trand(1, HKV, T, hd), trand(1, HKV, T, hd)
            def sdpa(tq=tq, tk=tk, tv=tv):
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
        def pre(tc, q=q, o=o, kc2=kc2, vc2=vc2, bt=bt, qsl=qsl, lens=lens, hd=hd, T=T):
            f = k.prefill_attention_tc if tc else k.prefill_attention
            f(q, kc2, vc2, bt, qsl, lens, BS, hd ** -0.5, o, T)

        if dt != "float32":
            add("prefill_attn (tc)", f"T={T} Hq={HQ} Hkv={HKV} D={hd}", lambda: pre(True), sdpa, flops)
        add("prefill_attn (generic)", f"T={T} Hq={HQ} Hkv={HKV} D={hd}", lambda: pre(False), sdpa, flops)

    # Decode attention: B sequences, one query each over `length` keys; max_seq_len = the plan's context.
    for B, length, max_len in ((1, 100, 4096), (1, 4096, 4096), (32, 4096, 4096), (1, 32768, 32768)):
        q, o = rand(B, HQ, D), rand(B, HQ, D)
        kc2, vc2, bt, lens = paged([length] * B, D)
        sdpa = None
        if has_torch:
            tq, tk, tv = trand(B, HQ, 1, D), trand(B, HKV, length, D), trand(B, HKV, length, D)
            sdpa = lambda tq=tq, tk=tk, tv=tv: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)  # noqa: E731
        add("decode_attn", f"B={B} len={length} max={max_len} Hq={HQ} D={D}",
            lambda q=q, o=o, kc2=kc2, vc2=vc2, bt=bt, lens=lens, max_len=max_len:
            k.decode_attention(q, kc2, vc2, bt, lens, BS, D ** -0.5, o, max_len), sdpa)
        if dt != "float32":  # the tensor-core kernel (16-bit only), which the plan takes at a large batch
            add("decode_attn (tc)", f"B={B} len={length} max={max_len} Hq={HQ} D={D}",
                lambda q=q, o=o, kc2=kc2, vc2=vc2, bt=bt, lens=lens, max_len=max_len:
                k.decode_attention_tc(q, kc2, vc2, bt, lens, BS, D ** -0.5, o, max_len), sdpa)

    # Decode projections (Qwen2.5-0.5B) at M = 1 and 4 rows: our GEMV against cuBLAS (the backend's linear,
    # nvmath-python when installed) and torch. Weight bytes / time = achieved bandwidth.
    from toolkit.backends.cuda import CudaBackend

    be = CudaBackend(dt)
    be.bind_thread()
    for name, n_out, k_in in (("qkv", 1152, 896), ("o_proj", 896, 896), ("gate_up", 9728, 896),
                              ("down", 896, 4864), ("lm_head", V, 896)):
        for M in (1, 4):
            x, w = rand(M, k_in), rand(n_out, k_in, scale=0.02)
            y = cp.empty((M, n_out), cp.float32 if name == "lm_head" else st)
            tx, tw = (trand(M, k_in), trand(n_out, k_in)) if has_torch else (None, None)
            tfn = (lambda tx=tx, tw=tw: tx @ tw.T) if has_torch else None
            shape = f"M={M} N={n_out} K={k_in}"
            add(f"gemv {name}", shape, lambda x=x, w=w, y=y: k.gemv(x, w, y), tfn)
            if be.graphs_supported:
                add(f"cublas {name}", shape, lambda x=x, w=w, y=y: be.linear(x, w, y), tfn, stream=be.stream)

    print(f"\n{'op':22s} {'shape':34s} {'graph us':>9s} {'eager us':>9s} {'host us':>8s} {'torch us':>9s} "
          f"{'torch/ours':>10s} {'TFLOP/s':>8s}   [{dt}]")
    for op, shape, g, e, h, t, flops in rows:
        ts = f"{t:9.1f}" if t is not None else f"{'-':>9s}"
        ratio = f"{t / g:10.2f}" if t is not None else f"{'-':>10s}"
        tf = f"{flops / g / 1e6:8.1f}" if flops else f"{'':8s}"
        print(f"{op:22s} {shape:34s} {g:9.1f} {e:9.1f} {h:8.1f} {ts} {ratio} {tf}")
    per_layer = sum(g for op, shape, g, *_ in rows
                    if shape.startswith("T=1 ") and op in ("add_rmsnorm", "rope_qkv", "silu_mul"))
    dec = [g for op, shape, g, *_ in rows if op == "decode_attn" and shape.startswith("B=1 len=4096")]
    if dec:
        per_layer += dec[0] + [g for op, shape, g, *_ in rows if op == "add_rmsnorm" and shape.startswith("T=1 ")][0]
        print(f"\ndecode, non-GEMM kernels per layer at 4096 context (2x rmsnorm, rope, attn, silu): {per_layer:.1f} us"
              f" -> x24 layers = {24 * per_layer / 1000:.2f} ms per token (graph timing)")
    pre = [g for op, shape, g, *_ in rows if op.startswith("prefill_attn") and "D=64" in shape]
    if pre:
        print(f"prefill attention, 4096 tokens, 24 layers: {24 * min(pre) / 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
