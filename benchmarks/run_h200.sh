#!/usr/bin/env bash
# Everything that needs the GPU, in one go (the H200 is lent by the minute):
# GPU tests, per-kernel benchmarks, the model benchmark, and the PyTorch reference.
# Run from the repo root on the GPU machine: bash benchmarks/run_h200.sh  (logs go to $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. NUMBA_CACHE_DIR=/tmp/numba_cache OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -m pytest -q -s -m gpu tests/ 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
python3 benchmarks/bench_kernels.py 2>&1 | tee "$OUT/bench_kernels.log" | tail -30
python3 -m toolkit bench --shape qwen2.5-0.5b --device cuda --repeats 5 2>&1 | tee "$OUT/bench_model.log"
for attn in sdpa eager; do
  timeout 150 python3 benchmarks/bench_torch.py --shape qwen2.5-0.5b --attn $attn --decode 32 2>&1 | tail -1 | tee -a "$OUT/bench_torch.log"
done
