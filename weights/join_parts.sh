#!/bin/sh
# Reassemble a model folder written by `train.py --export-parts DIR` (model.safetensors cut into <= 15 MB
# parts, because the GPU box returns files of at most 16 MB) and check it against the SHA-256 train.py wrote.
# usage: sh weights/join_parts.sh DIR [TARGET=weights/tiny-pd]
set -eu
src=$1
dst=${2:-$(dirname "$0")/tiny-pd}
mkdir -p "$dst"
for f in "$src"/*; do
    case "$f" in
        *.part[0-9][0-9] | *.sha256) ;;
        *) cp "$f" "$dst"/ ;;
    esac
done
cat "$src"/model.safetensors.part[0-9][0-9] > "$dst/model.safetensors"
cp "$src/model.safetensors.sha256" "$dst/.model.safetensors.sha256"
chmod u+w "$dst"/*
(cd "$dst" && sha256sum -c .model.safetensors.sha256 && rm -f .model.safetensors.sha256)
