#!/usr/bin/env bash
# Everything that needs the GPU, in one go (the H200 is lent by the minute). Run from the repo root on the
# GPU machine: `bash benchmarks/run_h200.sh MODE`; logs go to $OUT. MODE: tests | speed | peer | sampler | sparse |
# fused (gemv_fused on/off at batch 1) | pdl (programmatic dependent launch on/off, at batch 1 with fused on/off) |
# profile (Nsight Compute: the sampler kernel and one decode step's kernels) | sampler_ncu | sampler_check |
# skinny (gemm_skinny: its GPU tests, the PDL token tests with it on, its microbenchmark, the step on/off) | dev (a quick round
# of the kernel/sampler/engine GPU tests and speed) | final | close | quick_close | all. `final` and `close` are what one
# session's closing run fits in: every GPU test, then the sampler (and sparse, for `final`) benchmarks and the
# decode comparison with the PyTorch peer; `close` adds the throughput run and a decode-step kernel profile.
# The GPU image lacks nvmath-python (the capturable cuBLAS binding): its wheel travels in .whl/ (see README).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
# stories260K lives in ../shared, which does not travel: a copy in .gpu_shared/ (git-ignored) does.
if [ -d .gpu_shared/stories260K ] && [ ! -d ../shared/models/stories260K ]; then
  mkdir -p ../shared/models && cp -r .gpu_shared/stories260K ../shared/models/
fi
export NUMBA_CACHE_DIR=/tmp/numba_cache OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
B="python3 -m toolkit bench --device cuda"
if [[ $what == tests || $what == all || $what == final ]]; then
  python3 -m pytest -q -s -m gpu tests/ -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|bf16 default|FAILED" | tail -40
fi
if [[ $what == speed || $what == all ]]; then
  python3 benchmarks/bench_kernels.py 2>&1 | tee "$OUT/bench_kernels.log" | tail -30
  $B --shape qwen2.5-0.5b --batch 1,8,32,128 --depth 0,4096 --prefill 512,4096 --cuda-graphs on,off 2>&1 | tee "$OUT/bench_05b.log"
  $B --shape qwen2.5-0.5b --batch 1,2,4 --depth 0 --prefill 512 --small-batch-gemv on,off 2>&1 | tee "$OUT/bench_gemv.log" | tail -9
fi
if [[ $what == sampler || $what == all || $what == final ]]; then
  python3 -m toolkit bench sampler --device cuda 2>&1 | tee "$OUT/bench_sampler.log"
  # End to end: the decode step with the sampler's fast path on and off (greedy requests: a no-op batch).
  $B --shape qwen2.5-0.5b --batch 1,32,128 --depth 0 --prefill 512 --sampler-fast-path on,off 2>&1 | tee -a "$OUT/bench_sampler.log" | grep "^|"
fi
if [[ $what == sparse || $what == all || $what == final ]]; then
  python3 -m toolkit bench sparse --device cuda --tests combine,layer 2>&1 | tee "$OUT/bench_sparse.log"
  python3 benchmarks/sparse_sections.py 2>&1 | tee "$OUT/sparse_sections.log"
fi
if [[ $what == sampler_check ]]; then  # the sampler kernel alone: its GPU tests, then its timings
  python3 -m pytest -q -m gpu tests/test_gpu_sampler.py -p no:cacheprovider 2>&1 | tail -2
  python3 benchmarks/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log"
fi
if [[ $what == close ]]; then  # this session's closing run: every GPU test, then the numbers the notes quote
  python3 -m pytest -q -s -m gpu tests/ -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|bf16 default|FAILED" | tail -20
  python3 benchmarks/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log" | grep -v "variant NL\|ILP"
  python3 -m toolkit bench sampler --device cuda 2>&1 | tee "$OUT/bench_sampler.log" | grep "^| 128"
  $B --shape qwen2.5-0.5b --batch 1,32,128 --depth 0 --prefill 512 --sampler-fast-path on,off -r 3 2>&1 | tee -a "$OUT/bench_sampler.log" | grep "^| tg"
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch 2>&1 | tee "$OUT/bench_peer.log" | grep "^| "
  python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b --scheduler mixed 2>&1 | tee "$OUT/throughput.log" | tail -2
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 benchmarks/profile_decode.py --batch 1 > "$OUT/ncu_decode_b1.csv" 2>&1
  python3 benchmarks/profile_decode.py --summarise "$OUT/ncu_decode_b1.csv" | tee "$OUT/decode_kernels_b1.txt"
fi
if [[ $what == quick_close ]]; then  # a closing run that fits ~9 minutes: GPU tests, peer, rope A/B, throughput
  timeout 330 python3 -m pytest -q -s -m gpu tests/ -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|bf16 default|FAILED" | tail -12
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch 2>&1 | tee "$OUT/bench_peer.log" | grep "^| "
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 512 --rope-in-attention on,off -r 5 2>&1 | tee "$OUT/bench_rope_close.log" | grep "^| tg"
  python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b --scheduler mixed 2>&1 | tee "$OUT/throughput.log" | tail -2
fi
if [[ $what == skinny ]]; then  # README, "A tensor-core GEMM for 2-32 rows, second attempt"
  python3 -m pytest -q -m gpu tests/test_gpu_gemm_skinny.py tests/test_gpu_pdl.py -p no:cacheprovider 2>&1 | tail -3
  # The open question: test_pdl_changes_no_token[5-False] with skinny_gemm on (it is off by default).
  python3 benchmarks/skinny_pdl_check.py 2,5,8,17,32 2>&1 | tee "$OUT/skinny_pdl_check.log"
  python3 benchmarks/bench_gemm_skinny.py --sweep --rows 2,8,16,32 2>&1 | tee "$OUT/bench_gemm_skinny.log" | grep -v torch
  $B --shape qwen2.5-0.5b --batch 2,8,16,32 --depth 0 --prefill 512 --skinny-gemm on,off -r 3 2>&1 | tee "$OUT/decode_skinny_ab.log" | grep "^| tg"
fi
if [[ $what == dev ]]; then  # a quick round while developing: kernel, sampler and engine GPU tests, then speed
  python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_sampler.py tests/test_gpu_engine.py -x -p no:cacheprovider 2>&1 | tail -4
  python3 benchmarks/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log" | grep -v "variant NL\|ILP"
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --peer torch 2>&1 | tee "$OUT/bench_peer.log" | grep "^| tg"
fi
if [[ $what == sampler_ncu ]]; then
  python3 benchmarks/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log"
  ncu --clock-control none -k regex:gumbel --set full python3 benchmarks/profile_sampler.py --once > "$OUT/ncu_sampler.txt" 2>&1
  grep -E "Duration|Issue Slots|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|Executed Ipc|stall|Stall" "$OUT/ncu_sampler.txt" | cut -c1-400 | head -60
fi
if [[ $what == profile ]]; then
  # Where the time goes, with Nsight Compute's counters (Firecracker machines; see the device notes).
  NCU="ncu --clock-control none"
  python3 benchmarks/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log"
  $NCU -k regex:gumbel --set full python3 benchmarks/profile_sampler.py --once > "$OUT/ncu_sampler.txt" 2>&1
  grep -E "gumbel_sample|Duration|Throughput|Issue Slots|Registers|Achieved Occupancy|Theoretical Occupancy|Stall|Block Limit|Warp Cycles" "$OUT/ncu_sampler.txt" | head -80
  for b in 1 32; do
    $NCU --profile-from-start off --metrics gpu__time_duration.sum --csv python3 benchmarks/profile_decode.py --batch $b > "$OUT/ncu_decode_b$b.csv" 2>&1
    python3 benchmarks/profile_decode.py --summarise "$OUT/ncu_decode_b$b.csv" | tee "$OUT/decode_kernels_b$b.txt" | head -30
  done
fi
if [[ $what == fused ]]; then  # what gemv_fused buys a batch-1 step: the switch on/off, then the step's kernels
  $B --shape qwen2.5-0.5b --batch 1 --depth 0,4096 --prefill 512 --fused-gemv on,off -r 3 2>&1 | tee "$OUT/bench_fused.log" | grep "^|"
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 benchmarks/profile_decode.py --batch 1 --fused-gemv > "$OUT/ncu_decode_b1_fused.csv" 2>&1
  python3 benchmarks/profile_decode.py --summarise "$OUT/ncu_decode_b1_fused.csv" | tee "$OUT/decode_kernels_b1_fused.txt"
fi
if [[ $what == pdl ]]; then  # what programmatic dependent launch buys a decode step (README, "Programmatic dependent launch")
  { $B --shape qwen2.5-0.5b --batch 1 --depth 0,4096 --prefill 512 --pdl on,off --fused-gemv on,off -r 5
    $B --shape qwen2.5-0.5b --batch 32 --depth 0 --prefill 512 --pdl on,off -r 5; } 2>&1 | tee "$OUT/bench_pdl.log" | grep "^| tg"
fi
if [[ $what == final ]]; then
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch 2>&1 | tee "$OUT/bench_peer.log"
fi
if [[ $what == peer || $what == all ]]; then
  $B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch 2>&1 | tee "$OUT/bench_peer.log"
  python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b --scheduler mixed,alternate 2>&1 | tee "$OUT/throughput.log" | tail -6
  # The 1.5B shape and the default model (weights/tiny-pd), graphs on and off, into one log.
  { $B --shape qwen2.5-1.5b --batch 1,32 --depth 0 --prefill 4096 --cuda-graphs on,off
    $B --batch 1,32 --depth 0 --prefill 512 --cuda-graphs on,off; } 2>&1 | tee "$OUT/bench_other.log" | grep "^|"
fi
