"""Timing for dev/ scripts: a kernel launch replayed from a CUDA graph (a Python launch costs ~10 us of host time,
more than many of our kernels take on the GPU)."""
import statistics


def graph_us(cp, fn, n=50, reps=5, stream=None):
    """µs per call of fn(i), i = 0..n-1, from one CUDA graph of the n calls: median of reps replays. fn(0) runs once
    outside the capture first (plans, workspaces, compilation). `stream`: capture there (a CudaBackend's stream, which
    its cuBLAS handle launches on), else on a new one."""
    # A non-blocking stream does not wait for the legacy default stream, where a script makes its inputs (random
    # caches, a reference): without this sync the first launches, and the replays, could run alongside that work.
    cp.cuda.Device().synchronize()
    s = stream or cp.cuda.Stream(non_blocking=True)
    with s:
        fn(0)
        s.begin_capture()
        for i in range(n):
            fn(i)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        res = []
        for _ in range(reps):
            a.record(s)
            g.launch(s)
            b.record(s)
            b.synchronize()
            res.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / n)
    return statistics.median(res)


def gemm_parser(doc, tokens):
    """The arguments of the dev/ GEMM scripts (prefill_gemms.py, gemm_wg.py): shapes, token counts, the GPU's dense
    bf16 peak, calls a graph and repeats."""
    import argparse

    from toolkit.model.shapes import NAMES

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(n for n in NAMES if n != "tiny"))
    ap.add_argument("--tokens", default=tokens)
    ap.add_argument("--peak", type=float, default=989.0, help="dense bf16 TFLOPS of the GPU (H100/H200 SXM: 989)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    return ap


def bf16_random(cp, shape, scale=1.0):
    """Standard normal values times scale, truncated to bf16 (the bits, as a uint16 array: our bf16 storage)."""
    return ((cp.random.standard_normal(shape, cp.float32) * scale).view(cp.uint32) >> 16).astype(cp.uint16)
