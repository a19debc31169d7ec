"""The tensor-core decode attention kernel alone at batch 32 (Qwen2.5-0.5B heads: 14 q, 2 KV, dim 64; the plan of
a 512-token context bucket), at contexts of 1, 65 and 129 keys (one, two and three 64-key tiles), three launches
each between cudaProfilerStart/Stop, for Nsight Compute: why does each extra tile cost 1.4-1.6 us a layer in the
step (experiments/logs/decode_attention_ctx_b32.log)?

    ncu --profile-from-start off --clock-control none -k regex:decode_attention_tc --set full \
        python3 dev/profile_decode_attention.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from bench_gemm_skinny import _to_bf16  # noqa: E402
from toolkit.engine.build import BLOCK_SIZE as BS  # noqa: E402
from toolkit.backends.cuda_kernels import CudaKernels  # noqa: E402
from toolkit.engine.runner import MIN_CONTEXT_BUCKET  # noqa: E402

B, HQ, HKV, D = 32, 14, 2, 64
CONTEXTS = (1, 65, 129)


def main():
    k = CudaKernels("bfloat16")
    nb = MIN_CONTEXT_BUCKET // BS
    slots = B * nb * BS
    kc = _to_bf16(cp.random.standard_normal((slots, HKV, D), cp.float32))
    vc = _to_bf16(cp.random.standard_normal((slots, HKV, D), cp.float32))
    q = _to_bf16(cp.random.standard_normal((B, HQ, D), cp.float32))
    out = cp.empty((B, HQ, D), cp.uint16)
    # each sequence its own blocks, in a scattered order (as a long-running cache's would be)
    tables = cp.asarray(np.random.default_rng(0).permutation(B * nb).astype(np.int32).reshape(B, nb))
    lens = {n: cp.full(B, n, cp.int32) for n in CONTEXTS}

    def launch(n):
        k.decode_attention_tc(q, kc, vc, tables, lens[n], BS, D ** -0.5, out, MIN_CONTEXT_BUCKET)

    for n in CONTEXTS:  # compile, plan and warm outside the profiled range
        launch(n)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    for n in CONTEXTS:
        for _ in range(3):
            launch(n)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()
    print("profiled: " + ", ".join(f"{n} keys x3" for n in CONTEXTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
