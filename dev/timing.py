"""Timing for dev/ scripts: a kernel launch replayed from a CUDA graph (a Python launch costs ~10 us of host time,
more than many of our kernels take on the GPU)."""
import statistics


def graph_us(cp, fn, n=50, reps=5, stream=None):
    """µs per call of fn(i), i = 0..n-1, from one CUDA graph of the n calls: median of reps replays. fn(0) runs once
    outside the capture first (plans, workspaces, compilation). `stream`: capture there (a CudaBackend's stream, which
    its cuBLAS handle launches on), else on a new one."""
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
