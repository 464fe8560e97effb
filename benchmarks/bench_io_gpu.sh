#!/bin/bash
# `meshscale bench io` with a measured GPU demand, on one GPU machine:
#   1. generate 3,000 JPEGs and a 50M-token file (benchmarks/make_io_datasets.py);
#   2. measure ResNet-50 training on one GPU (synthetic data: the GPU's own rate) -> train-resnet50.json;
#   3. bench io on the images against that measured demand, and against the predicted demand of 8 GPUs of the
#      same kind (hgx-h100 or hgx-h200), with as many reader/decoder processes as cores;
#   4. bench io on the token file against GPT-2 small's predicted demand.
# Usage:   bash benchmarks/bench_io_gpu.sh OUTDIR
# On CPU:  DRY=1 bash benchmarks/bench_io_gpu.sh OUTDIR   (small-cnn on 2 CPU workers, 300 images: the same steps)
set -euo pipefail
OUT=${1:?usage: bench_io_gpu.sh OUTDIR}
mkdir -p "$OUT"
READERS=${READERS:-$(nproc)}
if [ -n "${DRY:-}" ]; then
  python benchmarks/make_io_datasets.py "$OUT" --images 300 --tokens 2000000
  meshscale train --model small-cnn --cpus 2 --batch 32 --steps 10 --json "$OUT/train.json" > "$OUT/train.txt"
  MODEL=small-cnn SYSTEM=hgx-h100 READERS=2
else
  python benchmarks/make_io_datasets.py "$OUT"
  meshscale train --model resnet50 --gpus 1 --batch 128 --steps 60 --json "$OUT/train.json" > "$OUT/train.txt"
  MODEL=resnet50
  SYSTEM=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo hgx-h200 || echo hgx-h100)
fi
{
  echo "\$ meshscale bench io $OUT/images --model $MODEL --from $OUT/train.json --readers $READERS"
  meshscale bench io "$OUT/images" --model "$MODEL" --from "$OUT/train.json" --readers "$READERS" --json "$OUT/io-measured.json"
  echo "\$ meshscale bench io $OUT/images --model $MODEL --system $SYSTEM --gpus 8 --batch 128 --readers $READERS"
  meshscale bench io "$OUT/images" --model "$MODEL" --system "$SYSTEM" --gpus 8 --batch 128 --readers "$READERS" \
    --json "$OUT/io-predicted.json"
  echo "\$ meshscale bench io $OUT/tokens.bin --model gpt-small --system $SYSTEM --gpus 8 --batch 16 --readers $READERS"
  meshscale bench io "$OUT/tokens.bin" --model gpt-small --system "$SYSTEM" --gpus 8 --batch 16 --readers "$READERS" \
    --json "$OUT/io-tokens.json"
} | tee "$OUT/bench-io.txt"
