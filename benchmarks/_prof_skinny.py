"""ncu target: gemm_skinny and cuBLAS at the 0.5B MLP shapes, 32 and 2 rows, weights cold (fresh copies)."""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import cupy as cp
from bench_gemm_skinny import _to_bf16
from toolkit.backends.cuda import CudaBackend
be = CudaBackend("bfloat16"); be.bind_thread(); k = be.kernels
for name, N, K, sw in (("gate_up", 9728, 896, True), ("down", 896, 4864, False)):
    ws = [_to_bf16(cp.random.standard_normal((N, K), cp.float32) * 0.02) for _ in range(24)]
    for M in (2, 32):
        x = _to_bf16(cp.random.standard_normal((M, K), cp.float32))
        y = cp.empty((M, N // 2 if sw else N), cp.uint16); gu = cp.empty((M, N), cp.uint16)
        for i in range(3):
            k.gemm_skinny(x, ws[i], y, sw)
            if M == 32:
                be.linear(x, ws[3 + i], gu if sw else y)
        be.stream.synchronize()
