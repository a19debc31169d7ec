#!/usr/bin/env bash
# Everything that needs the GPU, in one go (a lent H200 is paid by the minute). Run from the repo root on the GPU
# machine: `bash dev/run_h200.sh MODE`; logs go to $OUT. MODE:
#   tests          the whole GPU suite (python3 -m pytest -q -m gpu tests/)
#   tests_kernels  the same in two calls: tests/kernels (838 of its 989 tests), then tests_rest, the others (the
#   tests_rest     engine's, the model's, the sampler's: fewer but longer). On a cold machine the whole suite took
#                  579 s of the 600 a call allows (session 27, an H100)
#   speed          kernel microbenchmarks, then bench with CUDA graphs and our fused kernels on and off
#   peer           bench against the torch.compile peer, throughput, the 1.5B shape and the default model
#   sampler        bench sampler, and the decode step with the sampler's fast path on and off
#   sparse         bench sparse (combine and one layer against SDPA) and the whole sparse prefill
#   sampler_check  the sampler's GPU tests, then its kernel profile (dev/profile_sampler.py)
#   filter         the sampler's GPU tests, filter_sample's stage profile (dev/profile_filter.py), bench sampler
#   sampler_ncu    the sampling kernel under Nsight Compute
#   profile        Nsight Compute: the sampling kernel and one decode step's kernels at batch 1 and 32
#   prefill_profile  Nsight Compute: one 4,096-token prefill step's kernels, qwen2.5-0.5b and llama-3.2-1b
#   prefill        the prefill's GPU tests (rope, prefill attention, the model), each shape's 4,096-token prefill
#                  against the peer, the 0.5B's in chunks of 4,096 to 512 tokens, the projections against cuBLASLt's
#                  autotuned algorithms, then prefill_profile
#   rope           rope_qkv against the kernel it replaced, rope_qkv_warp (dev/rope.py --widths): outputs, µs, GB/s
#   mlp            a prefill's MLP block whole against in row chunks whose gate_up output fits in L2 (dev/mlp_chunks.py)
#   chunked        the 0.5B's 4,096-token prefill in chunks of 4,096 to 512 tokens (also run by prefill)
#   graphs         the GPU tests of what a prefill graph touches: rope, the engine (graphs, PDL, chunks), the model
#   splits         prefill attention with each query tile's keys split over blocks (a chunk of a long prompt): its
#                  GPU tests, the split counts' sweep (dev/prefill_attention.py --splits), then chunked prefills of
#                  each shape; with a copy of an older tree in _base/ (toolkit/ and kernels/), the same chunked
#                  prefills on it, in the same call
#   splits_close   the whole GPU suite, then the chunked prefills of splits (this tree only) and its sweep at 4,096
#                  tokens and at a 512-token chunk after 3,584, then the README's results (readme)
#   splits_short   what splits_close runs that differs at head dim 64, when device time is short: the chunked
#                  prefills of qwen2.5-0.5b and llama-3.2-1b, then the whole GPU suite
#   splits_min     less again: prefill attention's GPU tests and the engine's chunked-prefill graph test, then the
#                  chunked prefills of qwen2.5-0.5b (one step, chunks of 512) and llama-3.2-1b (chunks of 512)
#   tuned          the "tuned" projections (the cuBLAS algorithm measured per row bucket): their GPU tests and the
#                  model's, the projections at 512-8,192 rows (dev/prefill_gemms.py), then each shape's 4,096-token
#                  prefill against the peer, and with a copy of an older tree in _base/, that tree's in the same call
#   tuned_close    tuned's closing run: each shape's 4,096- and 8,192-token prefill on this tree and on _base/'s,
#                  the projections at 4,096 and 8,192 rows, then the whole GPU suite
#   table          issue 36's whole table (bench suite: 4 shapes x batch 1, 32, 128 x depth 0, 2,048, 8,192 and the
#                  prefill, against the peer) as far as 540 s (or $TABLE_BUDGET) take it; it prints the commands for
#                  the rest. A later call continues it: TABLE_FROM=an earlier call's suite.json, TABLE_ARGS=the cells
#                  to run (e.g. "--shapes qwen3-0.6b,llama-3.2-1b"); it keeps the cells of TABLE_FROM it does not run.
#                  TABLE_TREE=_base runs the copy of an older tree in _base/ instead of this one
#   readme         the README's results: its bench suite command (the table under a 370 s budget) and throughput
#   dev            a quick round while developing: kernel, sampler and engine GPU tests, then the peer
#   wg             the Hopper prefill attention (prefill_attention_wg): wgmma probes, its GPU tests, then every
#                  prefill attention kernel and the dev variants (wgp, wgpp) against SDPA at the four bench-suite
#                  shapes (dev/prefill_attention.py),
#                  the 4,096-token prefill of each shape against the peer, and the prefill projections' TFLOPS
#                  (dev/prefill_gemms.py)
#   wgt            the TMA variant of the Hopper prefill attention and its lean softmax (wgt, wgtf:
#                  dev/prefill_attention_wgt.cu): first a prompt whose last page is partial after a prefix (NaN in
#                  the slots no key owns), with splits; then each shape's 4,096 tokens against wg and SDPA; every
#                  run under a timeout (a barrier bug hangs)
#   wg_ncu         what holds the Hopper prefill attention back: Nsight Compute's warp-state (stall reasons),
#                  scheduler, throughput and instruction sections for wg, wgp, wgt and wgtf at the 0.5B's heads,
#                  4,096 tokens (each kernel's first launch: the script's correctness call), then a summary of each
#   decode_wg      gemm_wg_swiglu at decode rows (1-128) against cuBLAS + silu_mul and gemv_swiglu, weights cycled
#                  over 8 copies past the L2 (dev/gemm_wg.py --copies 8); its GPU tests and the engine's that run
#                  it; the decode step of the 0.5B and Llama at batch 1-128 on this tree and on _base/'s
#   decode_wg_ab   the branch's plan (wg at 2-32 rows) against main's in _base/: bench's decode steps at batch 1, 2,
#                  8, 16, 32 and 64 on the four shapes, both trees one shape after the other ($DWA_SHAPES: fewer)
#   decode_wg_short  decode_wg in under 5 minutes: the swapped kernels' GPU tests, the 0.5B's decode steps on this
#                  tree and _base/'s (or, where this tree's fail, which runs fail and the first traceback), the kernel
#                  alone at the 0.5B's rows
#   tune_startup   the start-up measurement of the tuned projections: its GPU tests, its seconds on the four shapes
#                  (dev/tune_startup.py), then bench throughput (whose first repeat paid for it before)
#   throughput_ab  bench throughput (the 0.5B, 3 repeats) on this tree, on _base/'s copy of an older tree, then on
#                  this tree again, in one call: session 27's 53,347 tok/s against 58-59k before had its device
#                  seconds level (2.31) and its wall not, so whether a tree or a machine moved it needs both trees
#                  on one machine
#   b1_plans       the batch-1 step (dev/decode_attribution.py, graph-replayed, context 1) on three shapes (not
#                  Qwen3's q/k norms) under this tree's plan, then with each of $B1_PLANS' replacements (default:
#                  qkv=gemv, the GEMV then rope_qkv; qkv=skinny_rope, the tensor-core qkv with RoPE and the K/V write
#                  in its epilogue, at 1 row), then this tree's again
#   pdl_trigger    the decode chain with each kernel's PDL trigger before its wait, with and without L2-only loads
#                  (dev/pdl_trigger.py, $PDL_VARIANTS): exactness against plain launches, the fp32 stories260K
#                  model's tokens, the batch-1 and batch-32 steps of three shapes; a variant "+waveB" also runs the
#                  batch-1 GEMVs on one-wave grids (e.g. PDL_VARIANTS=late,early,early+wave4,late)
#   close          a session's closing run: every GPU test, the peer, throughput, the sampler, the attribution
#   all            tests, speed, sampler, sparse and peer
# Several modes in one call: `bash dev/run_h200.sh "prefill readme"` (each block runs once, in this file's order).
# The GPU image lacks nvmath-python (the capturable cuBLAS binding): its wheel travels in .whl/ (git-ignored) and is
# installed here; stories260K lives in ../shared, which does not travel: a copy in .gpu_shared/ (git-ignored) does.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
if [ -d .gpu_shared/stories260K ] && [ ! -d ../shared/models/stories260K ]; then
  mkdir -p ../shared/models && cp -r .gpu_shared/stories260K ../shared/models/
fi
export NUMBA_CACHE_DIR=/tmp/numba_cache OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
B="python3 -m toolkit bench --device cuda"
GPU_SUITE="python3 -m pytest -q -m gpu tests/"
PEER="$B --shape qwen2.5-0.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch -r 5"
# run MODE...: is one of this call's modes among these? (the blocks run in this file's order, whatever $1's)
run() { local m; for m in $what; do [[ " $* " == *" $m "* ]] && return 0; done; return 1; }

if run splits_min; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_kernels.py tests/engine/test_gpu_engine.py \
    -k "prefill_attention or chunked_prefill" 2>&1 | tee "$OUT/gpu_tests_splits.log" | tail -3
  for sc in qwen2.5-0.5b:4096 qwen2.5-0.5b:512 llama-3.2-1b:512; do
    $B --shape ${sc%%:*} --batch 1 --depth 0 --decode 8 --prefill 4096 --max-num-batched-tokens ${sc##*:} -r 3 2>&1 \
      | grep "^| pp" | sed "s/^/${sc%%:*} chunks ${sc##*:} /"
  done 2>&1 | tee "$OUT/bench_prefill_chunked_splits.log"
fi
if run splits_short; then
  for sc in qwen2.5-0.5b:4096 qwen2.5-0.5b:2048 qwen2.5-0.5b:1024 qwen2.5-0.5b:512 llama-3.2-1b:512; do
    $B --shape ${sc%%:*} --batch 1 --depth 0 --decode 8 --prefill 4096 --max-num-batched-tokens ${sc##*:} -r 3 2>&1 \
      | grep "^| pp" | sed "s/^/${sc%%:*} chunks ${sc##*:} /"
  done 2>&1 | tee "$OUT/bench_prefill_chunked_splits.log"
fi
if run tests all close splits_close splits_short; then
  $GPU_SUITE 2>&1 | tee "$OUT/gpu_tests.log" | tail -20
fi
if run tests_kernels; then
  python3 -m pytest -q -m gpu tests/kernels 2>&1 | tee "$OUT/gpu_tests_kernels.log" | tail -5
fi
if run tests_rest; then
  python3 -m pytest -q -m gpu tests/ --ignore=tests/kernels 2>&1 | tee "$OUT/gpu_tests_rest.log" | tail -5
fi
if run dev; then
  python3 -m pytest -q -m gpu tests/kernels tests/sampler tests/engine -x 2>&1 | tail -4
fi
if run wg; then
  python3 dev/prefill_attention.py --probe --shapes llama-3.2-1b 2>&1 | tee "$OUT/prefill_attention_probe.log"
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_kernels.py -k prefill_attention 2>&1 \
    | tee "$OUT/gpu_tests_prefill.log" | tail -15
  # The dev variants too; timeouts, since a synchronisation bug in one shows as a hang. First a partial last block
  # (300 tokens after 1,500 cached: the last block's second warpgroup has no rows).
  { timeout 60 python3 dev/prefill_attention.py --keys 64,128 --variants wgp,wgpp --prefix 1500 --tokens 300 \
      --shapes llama-3.2-1b,qwen2.5-1.5b --repeats 2
    timeout 240 python3 dev/prefill_attention.py --keys 64,128 --variants wgp,wgpp; } 2>&1 \
    | tee "$OUT/prefill_attention.log"
  # The plan's prefill (wg on Hopper) against the peer. A few decode steps first: without them the peer's eager
  # prefill measured 2-3x slower (experiments/NOTEBOOK.md, "It runs").
  for s in llama-3.2-1b qwen3-0.6b qwen2.5-1.5b qwen2.5-0.5b; do
    $B --shape $s --batch 1 --depth 0 --decode 32 --prefill 4096 --peer torch -r 5 2>&1 | grep "^| "
  done | tee "$OUT/bench_prefill.log"
  python3 dev/prefill_gemms.py --tokens 4096 2>&1 | tee "$OUT/prefill_gemms.log"
fi
if run wgt; then
  { timeout 150 python3 dev/prefill_attention.py --keys 64,128 --variants wgt,wgtf --prefix 37 --tokens 1000 \
      --splits 2,4 --repeats 2
    timeout 240 python3 dev/prefill_attention.py --keys 64,128 --variants wgt,wgtf; } 2>&1 \
    | tee "$OUT/prefill_attention_wgt.log"
fi
if run wg_ncu; then
  # v:regex:keys -- the script's first launch that the regex matches is that variant's (wgtf alone: wgt shares its name)
  # NCU_VARIANTS="wg wgtf" runs a subset
  for v in wg:prefill_attention_wg:0 wgp:prefill_attention_wgp:64 wgt:prefill_attention_wgt:64 \
           wgtf:prefill_attention_wgt:64; do
    IFS=: read -r name rx keys <<< "$v"
    [[ " ${NCU_VARIANTS:-wg wgp wgt wgtf} " == *" $name "* ]] || continue
    vars=$name; [ "$name" = wg ] && vars=''
    timeout 150 ncu --clock-control none -k "regex:^${rx}\b" --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
      --section Occupancy --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
      python3 dev/prefill_attention.py --shapes qwen2.5-0.5b --keys $keys --variants "$vars" \
      --repeats 1 > "$OUT/ncu_wg_$name.txt" 2>&1
    echo "== $name"
    grep -E "prefill_attention_w|Duration|Executed Ipc|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Stall|stalled|Registers Per|Achieved Occupancy|Tensor|SM Busy" \
      "$OUT/ncu_wg_$name.txt" | cut -c1-200 | head -70
  done 2>&1 | tee "$OUT/wg_ncu_summary.txt"
fi
if run tune_startup; then
  python3 -m pytest -q -m gpu tests/engine/test_gpu_engine.py tests/backends/test_gpu_tuned.py 2>&1 \
    | tee "$OUT/gpu_tests_tune_startup.log" | tail -3
  python3 dev/tune_startup.py 2>&1 | tee "$OUT/tune_startup.log"
  python3 -m toolkit bench throughput --shape qwen2.5-0.5b --repeats 3 2>&1 | tee "$OUT/throughput_tune_startup.log" \
    | tail -8
fi
if run throughput_ab; then
  for tree in . _base .; do
    [ -d "$tree/toolkit" ] || continue
    echo "== tree $tree"
    (cd "$tree" && timeout 100 python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b --repeats 3 2>&1 \
      | tail -1)
  done 2>&1 | tee "$OUT/throughput_ab.log"
fi
if run speed all; then
  python3 dev/bench_kernels.py 2>&1 | tee "$OUT/bench_kernels.log" | tail -30
  python3 dev/bench_gemm_skinny.py --rows 2,8,32 2>&1 | tee "$OUT/bench_gemm_skinny.log" | grep -v torch
  $B --shape qwen2.5-0.5b --batch 1,8,32,128 --depth 0,4096 --prefill 512,4096 --cuda-graphs on,off 2>&1 \
    | tee "$OUT/bench_graphs.log"
  $B --shape qwen2.5-0.5b --batch 1,8,32 --depth 0 --prefill 512 --fused-kernels on,off --pdl on,off 2>&1 \
    | tee "$OUT/bench_fused_kernels.log" | grep "^| tg"
fi
if run peer all dev close; then
  $PEER 2>&1 | tee "$OUT/bench_peer.log" | grep "^| "
fi
if run peer all close; then
  python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b 2>&1 | tee "$OUT/throughput.log" | tail -3
fi
if run peer all; then
  { $B --shape qwen2.5-1.5b --batch 1,32 --depth 0 --prefill 4096 --peer torch -r 3
    $B --batch 1,32 --depth 0 --prefill 512 --cuda-graphs on,off; } 2>&1 | tee "$OUT/bench_other.log" | grep "^|"
fi
if run sampler all close; then
  python3 -m toolkit bench sampler --device cuda 2>&1 | tee "$OUT/bench_sampler.log" | grep "^| 128"
  # End to end: the decode step with the sampler's fast path on and off (greedy requests: a no-op batch).
  $B --shape qwen2.5-0.5b --batch 1,32,128 --depth 0 --prefill 512 --sampler-fast-path on,off -r 3 2>&1 \
    | tee -a "$OUT/bench_sampler.log" | grep "^| tg"
fi
if run sparse all; then
  python3 -m toolkit bench sparse --device cuda --tests combine,layer 2>&1 | tee "$OUT/bench_sparse.log"
  python3 experiments/sparse_sections.py 2>&1 | tee "$OUT/sparse_sections.log"
fi
if run b1_plans; then
  for s in ${B1_SHAPES:-qwen2.5-0.5b llama-3.2-1b qwen2.5-1.5b}; do
    for p in "" ${B1_PLANS:-qkv=gemv qkv=skinny_rope} ""; do
      echo "== $s plan ${p:-own}"
      SHAPE=$s timeout 120 python3 dev/decode_attribution.py 1 zzz 1 "" "$p" 2>&1 | grep "^| \|rror"
    done
  done 2>&1 | tee "$OUT/b1_plans.log"
fi
if run pdl_trigger; then
  timeout 560 python3 dev/pdl_trigger.py --variants ${PDL_VARIANTS:-late,early_l2,early,late} 2>&1 \
    | tee "$OUT/pdl_trigger.log"
fi
if run close; then
  python3 dev/decode_attribution.py 1,32 all 1,65 2>&1 | tee "$OUT/decode_attribution.log"
fi
if run sampler_check; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_sampler.py tests/sampler/test_gpu_sampler_engine.py 2>&1 | tail -2
  python3 dev/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log"
fi
if run filter; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_sampler.py tests/sampler/test_gpu_fast_path.py -x 2>&1 \
    | tee "$OUT/filter_tests.log" | tail -3
  python3 dev/profile_filter.py --batch 1,128 2>&1 | tee "$OUT/profile_filter.log"
  python3 -m toolkit bench sampler --device cuda 2>&1 | tee "$OUT/bench_sampler.log" | grep "^| 128"
fi
if run sampler_ncu profile; then
  python3 dev/profile_sampler.py 2>&1 | tee "$OUT/profile_sampler.log"
  ncu --clock-control none -k regex:gumbel --set full python3 dev/profile_sampler.py --once > "$OUT/ncu_sampler.txt" 2>&1
  grep -E "Duration|Issue Slots|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|Executed Ipc|Stall" \
    "$OUT/ncu_sampler.txt" | cut -c1-400 | head -60
fi
if run profile; then  # one eager decode step's kernels, serialised (Nsight Compute's counters)
  for b in 1 32; do
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python3 dev/profile_decode.py --batch $b > "$OUT/ncu_decode_b$b.csv" 2>&1
    python3 dev/profile_decode.py --summarise "$OUT/ncu_decode_b$b.csv" | tee "$OUT/decode_kernels_b$b.txt" | head -30
  done
fi
if run graphs; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_kernels.py tests/engine/test_gpu_engine.py \
    tests/model/test_gpu_model.py tests/sampler/test_gpu_sampler_engine.py -k "rope or engine or model or sampler" \
    2>&1 | tee "$OUT/gpu_tests_graphs.log" | tail -4
fi
if run prefill; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_kernels.py tests/model/test_gpu_model.py \
    -k "rope or prefill_attention or model" 2>&1 | tee "$OUT/gpu_tests_prefill.log" | tail -3
fi
if run rope; then
  python3 dev/rope.py --widths 2>&1 | tee "$OUT/rope.log"
fi
if run mlp; then
  python3 dev/mlp_chunks.py 2>&1 | tee "$OUT/mlp_chunks.log"
fi
if run splits_close; then
  for sc in qwen2.5-0.5b:4096 qwen2.5-0.5b:2048 qwen2.5-0.5b:1024 qwen2.5-0.5b:512 llama-3.2-1b:512 qwen3-0.6b:512 \
            qwen2.5-1.5b:512; do
    $B --shape ${sc%%:*} --batch 1 --depth 0 --decode 8 --prefill 4096 --max-num-batched-tokens ${sc##*:} -r 3 2>&1 \
      | grep "^| pp" | sed "s/^/${sc%%:*} chunks ${sc##*:} /"
  done 2>&1 | tee "$OUT/bench_prefill_chunked_splits.log"
  for t in 4096:0 512:3584; do
    timeout 100 python3 dev/prefill_attention.py --tokens ${t%%:*} --prefix ${t##*:} --keys 0 --variants '' \
      --splits 1,2,4,8 --repeats 3
  done 2>&1 | tee "$OUT/prefill_splits.log"
fi
if run readme splits_close; then  # the README's results: its bench suite row and throughput
  python3 -m toolkit bench suite --device cuda --peer torch --budget 370 --out "$OUT/suite" 2>&1 \
    | tee "$OUT/bench_suite_readme.log" | tail -12
  python3 -m toolkit bench throughput --device cuda --shape qwen2.5-0.5b --repeats 3 2>&1 | tee "$OUT/throughput.log" \
    | tail -3
fi
if run prefill; then
  for s in qwen2.5-0.5b llama-3.2-1b qwen3-0.6b qwen2.5-1.5b; do
    $B --shape $s --batch 1 --depth 0 --decode 32 --prefill 4096 --peer torch -r 5 2>&1 | grep "^| pp"
  done | tee "$OUT/bench_prefill.log"
fi
if run decode_wg; then
  # tests first, then the decode step A/B (the verdict), then the kernels alone
  timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_gpu_gemm_wg.py tests/kernels/test_cuda_compile.py \
    tests/engine/test_gpu_engine.py -k "gemm_wg or wg_changes or wg_at_a_bench_shape or pdl_changes" 2>&1 \
    | tee "$OUT/gpu_tests_decode_wg.log" | tail -5
  for tree in . _base; do  # the decode step, this tree against an older one in _base/ (main's), same call
    [ -d "$tree/toolkit" ] || continue
    echo "== tree $tree"
    shapes="qwen2.5-0.5b llama-3.2-1b"
    [ "$tree" = _base ] && shapes=${DWG_BASE_SHAPES:-$shapes}  # (a short call: fewer shapes on the older tree)
    for s in $shapes; do
      (cd "$tree" && timeout 90 $B --shape $s --batch 1,8,32,64,128 --depth 0 --decode 64 --prefill 0 -r 3 2>&1) \
        | grep "^| tg\|rror" | sed "s/^/$s /"
    done
  done 2>&1 | tee "$OUT/bench_decode_wg_ab.log"
  if grep -q "rror" "$OUT/bench_decode_wg_ab.log"; then  # where it failed: one bucket, and the first traceback
    for a in "--batch 8" "--batch 8 --pdl off" "--batch 8 --cuda-graphs off" "--batch 1,8"; do
      echo "== $a"
      timeout 60 $B --shape qwen2.5-0.5b $a --depth 0 --decode 16 --prefill 0 -r 1 --debug 2>&1 \
        | grep -m1 -B3 -A30 "Traceback\|^| tg"
    done 2>&1 | head -250 | tee "$OUT/decode_wg_crash.log"
  fi
  timeout 120 python3 dev/gemm_wg.py --tokens 1,8,32,64,128 --copies 8 --repeats 5 \
    ${DWG_DEV_SHAPES:+--shapes $DWG_DEV_SHAPES} 2>&1 | tee "$OUT/gemm_wg_decode.log"
fi
if run decode_wg_ab; then
  for s in ${DWA_SHAPES:-qwen2.5-0.5b llama-3.2-1b qwen3-0.6b qwen2.5-1.5b}; do
    for tree in . _base; do
      [ -d "$tree/toolkit" ] || continue
      (cd "$tree" && timeout 90 $B --shape $s --batch 1,2,8,16,32,64 --depth 0 --decode 64 --prefill 0 -r 3 2>&1) \
        | grep "^| tg\|rror" | grep -v cupy_backends | sed "s/^/$s $tree /"
    done
  done 2>&1 | tee "$OUT/bench_decode_wg_ab.log"
fi
if run decode_wg_short; then
  # decode_wg when device time is short: the swapped kernels' tests only, the 0.5B's decode steps, where it fails
  [ "${DWS_TESTS:-1}" = 1 ] && timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_gpu_gemm_wg.py \
    tests/engine/test_gpu_engine.py -k "(gemm_wg and not x) or wg_changes or wg_at_a_bench_shape" 2>&1 \
    | tee "$OUT/gpu_tests_decode_wg.log" | tail -4
  for tree in . ${DWS_TREES:-_base}; do
    echo "== tree $tree"
    (cd "$tree" && timeout 60 $B --shape qwen2.5-0.5b --batch 8,32,128 --depth 0 --decode 32 --prefill 0 -r 3 2>&1) \
      | grep "^| tg\|rror" | grep -v cupy_backends
    rc=${PIPESTATUS[0]}
    if [ "$tree" = . ] && [ "$rc" != 0 ]; then
      for a in "--batch 8" "--batch 8 --pdl off" "--batch 8 --cuda-graphs off"; do
        echo "== $a"
        timeout ${DWS_DIAG_S:-40} $B --shape qwen2.5-0.5b $a --depth 0 --decode 16 --prefill 0 -r 1 --debug 2>&1 \
          | grep -m1 -B3 -A30 "Traceback\|^| tg"
      done
      break
    fi
  done 2>&1 | head -300 | tee "$OUT/bench_decode_wg_short.log"
  timeout 60 python3 dev/gemm_wg.py --tokens 1,8,32,128 --copies 8 --repeats 5 --shapes qwen2.5-0.5b 2>&1 \
    | tee "$OUT/gemm_wg_decode.log"
fi
if run table; then
  # the rest of a table: TABLE_FROM names an earlier call's suite.json (kept, e.g. in experiments/logs/), whose cells
  # this call keeps; TABLE_ARGS picks the cells still to run (the commands the earlier call printed)
  if [ -n "${TABLE_FROM:-}" ]; then mkdir -p "$OUT/table" && cp "$TABLE_FROM" "$OUT/table/suite.json"; fi
  (cd "${TABLE_TREE:-.}" && python3 -m toolkit bench suite --device cuda --peer torch --budget ${TABLE_BUDGET:-540} \
    ${TABLE_ARGS:-} --out "$OUT/table") 2>&1 \
    | tee "$OUT/bench_suite_table.log" | tail -30
fi
if run tuned; then
  python3 -m pytest -q -m gpu tests/backends/test_gpu_tuned.py tests/model/test_gpu_model.py 2>&1 \
    | tee "$OUT/gpu_tests_tuned.log" | tail -3
  timeout 200 python3 dev/prefill_gemms.py --tokens 512,2048,4096,8192 --repeats 3 2>&1 | tee "$OUT/prefill_gemms.log"
  for tree in . _base; do
    [ -d "$tree/toolkit" ] || continue
    peer=""; [ "$tree" = . ] && peer="--peer torch"
    echo "== tree $tree"
    for s in qwen2.5-0.5b llama-3.2-1b qwen3-0.6b qwen2.5-1.5b; do
      (cd "$tree" && timeout 120 $B --shape $s --batch 1 --depth 0 --decode 32 --prefill 4096 $peer -r 5 2>&1) \
        | grep "^| pp" | sed "s/^/$s /"
    done
  done 2>&1 | tee "$OUT/bench_prefill_tuned.log"
fi
if run tuned_close; then
  for tree in . _base; do
    [ -d "$tree/toolkit" ] || continue
    echo "== tree $tree"
    for s in qwen2.5-0.5b llama-3.2-1b qwen3-0.6b qwen2.5-1.5b; do
      (cd "$tree" && timeout 60 $B --shape $s --batch 1 --depth 0 --decode 8 --prefill 4096,8192 -r 5 2>&1) \
        | grep "^| pp" | sed "s/^/$s /"
    done
  done 2>&1 | tee "$OUT/bench_prefill_tuned_ab.log"
  timeout 120 python3 dev/prefill_gemms.py --tokens 4096,8192 --repeats 3 2>&1 | tee "$OUT/prefill_gemms_close.log" \
    | grep layer
  $GPU_SUITE 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
fi
if run splits; then
  python3 -m pytest -q -m gpu tests/kernels/test_gpu_kernels.py -k "prefill_attention" 2>&1 \
    | tee "$OUT/gpu_tests_splits.log" | tail -3
  for t in 4096:0 512:3584 1024:3072 2048:2048 256:7936; do
    timeout 150 python3 dev/prefill_attention.py --tokens ${t%%:*} --prefix ${t##*:} --keys 0 --variants '' \
      --splits 1,2,3,4,6,8 --repeats 3
  done 2>&1 | tee "$OUT/prefill_splits.log"
  for tree in . _base; do
    [ -d "$tree/toolkit" ] || continue
    echo "== tree $tree"
    for sc in qwen2.5-0.5b:2048 qwen2.5-0.5b:1024 qwen2.5-0.5b:512 llama-3.2-1b:512 qwen3-0.6b:512 qwen2.5-1.5b:512; do
      # python -m puts the working directory first on the path: run from inside the tree
      (cd "$tree" && $B --shape ${sc%%:*} --batch 1 --depth 0 --decode 8 --prefill 4096 \
        --max-num-batched-tokens ${sc##*:} -r 3 2>&1) | grep "^| pp" | sed "s/^/${sc%%:*} chunks ${sc##*:} /"
    done
  done 2>&1 | tee "$OUT/bench_prefill_chunked_splits.log"
fi
if run prefill chunked; then  # the same prefill chunked (issue 36: a chunked prefill should keep the one-step rate)
  for c in 4096 2048 1024 512; do
    $B --shape qwen2.5-0.5b --batch 1 --depth 0 --decode 32 --prefill 4096 --max-num-batched-tokens $c -r 5 2>&1 \
      | grep "^| pp"
  done | tee "$OUT/bench_prefill_chunked.log"
fi
if run prefill; then
  python3 dev/prefill_gemms.py --tokens 4096 2>&1 | tee "$OUT/prefill_gemms.log"
fi
if run prefill_profile prefill; then  # where a 4,096-token prefill's device time goes, kernel by kernel
  for s in qwen2.5-0.5b llama-3.2-1b; do
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python3 dev/profile_decode.py --shape $s --prefill 4096 > "$OUT/ncu_prefill_$s.csv" 2>&1
    python3 dev/profile_decode.py --summarise "$OUT/ncu_prefill_$s.csv" | tee "$OUT/prefill_kernels_$s.txt" | head -20
  done
fi
