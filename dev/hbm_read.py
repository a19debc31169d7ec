"""The read bandwidth a plain streaming kernel reaches on this GPU: the practical roofline for a weight-bound GEMM.

    PYTHONPATH=. python3 dev/hbm_read.py [MB,MB,...]

Each size is a buffer read once by a grid-stride loop of 16-byte loads (a CUDA graph of back-to-back reads of
distinct buffers, at least 1 GB in all, so nothing is served from the 50 MB L2); prints µs a read and TB/s. The
lm_head of Qwen2.5-0.5B is 272 MB, its gate_up 17.4 MB, its down 8.7 MB."""
import statistics
import sys

import cupy as cp

from toolkit.bench.env import environment

SRC = r"""
extern "C" __global__ void read16(const uint4* __restrict__ p, unsigned long long n, unsigned* sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[0] = 1;  // keeps the loads; almost never stores
}
"""


def main():
    sizes = [float(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "8.7,17.4,272").split(",")]
    print("  ".join(f"{k}: {v}" for k, v in environment("cuda").items()))
    fn = cp.RawModule(code=SRC).get_function("read16")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    sink = cp.zeros(1, cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    print("| MB | blocks | µs a read | TB/s |")
    print("|---:|---:|---:|---:|")
    for mb in sizes:
        n = int(mb * 1e6) // 16
        bufs = [cp.ones(n * 4, cp.uint32) for _ in range(max(1, int(1e9 // (n * 16))))]
        for per_sm in (4, 8, 16):
            blocks = sms * per_sm
            with stream:
                stream.begin_capture()
                for b in bufs:
                    fn((blocks,), (256,), (b, cp.uint64(n), sink))
                g = stream.end_capture()
                g.launch(stream)
                stream.synchronize()
                times = []
                start, end = cp.cuda.Event(), cp.cuda.Event()
                for _ in range(7):
                    start.record(stream)
                    g.launch(stream)
                    end.record(stream)
                    end.synchronize()
                    times.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / len(bufs))
            us = statistics.median(times)
            print(f"| {mb:g} | {blocks} | {us:.2f} | {n * 16 / us / 1e6:.2f} |", flush=True)
        del bufs
    return 0


if __name__ == "__main__":
    sys.exit(main())
