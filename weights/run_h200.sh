#!/bin/sh
# The training run of the default model on one H200 (torch, numpy, safetensors; no network needed).
#
# Run from the repository root on the GPU box, with the tokenized data carried along:
#   carry:   weights/data/train.bin weights/data/val.bin weights/data/tokens.json weights/data/tokenizer.json
#   command: sh weights/run_h200.sh                 (writes $OUT/tiny-pd/ and $OUT/train.log)
# then here:  sh weights/join_parts.sh <fetched OUT>/tiny-pd      (-> weights/tiny-pd/model.safetensors)
#
# STEPS x 64 x 1024 tokens; the run stops by itself after --max-minutes (checkpoint in weights/data/ckpt.pt):
# if that happens, run `sh weights/run_h200.sh --resume` on the same (still warm) machine to finish.
set -eu
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-1500}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 train.py --steps "$STEPS" --batch 64 --eval-every 100 --ckpt-every 500 --max-minutes 6.5 --compile \
    --export-parts "$OUT/tiny-pd" "$@" 2>&1 | tee "$OUT/train.log"
