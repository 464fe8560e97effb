#!/usr/bin/env bash
# Compute predicted from the datasheet against what `meshscale train` measures, on this machine's one GPU:
# ResNet-50 bf16 channels-last at batch 128 and GPT-small bf16 at batch 16 (1024 tokens). For each: `train`
# (synthetic data), a single-GPU profile (`train --profile-batches`), and `predict` for the same job without a
# profile (datasheet roofline) and, where PROFILES names a folder of profiles made on another GPU kind (this
# script's OUTDIR from a run there), calibrated on that GPU. Prints the errors.
#
#   PYTHONPATH=src bash benchmarks/predict_vs_train_gpu.sh [OUTDIR]             (default: $OUT, else ./predict_vs_train)
#   PROFILES=/path/to/h200-run PYTHONPATH=src bash benchmarks/predict_vs_train_gpu.sh /tmp/h100-run
#   RESNET_PROFILE=128 GPT_PROFILE=16 STEPS=40 ...: one profile batch each, a shorter call
#   DRY_RUN=1 PYTHONPATH=src bash benchmarks/predict_vs_train_gpu.sh /tmp/x      (CPU: predictions only)
#
# Writes OUTDIR/train-<model>.json, OUTDIR/profile-<model>.json, OUTDIR/predict-<model>[-calibrated].json,
# OUTDIR/summary.txt (the table of errors), and OUTDIR/kernels.{txt,json} (benchmarks/predict_kernels_gpu.py).
set -u
OUTDIR="${1:-${OUT:-predict_vs_train}}"
PY="${PYTHON:-python}"
MS="$PY -m meshscale"
STEPS="${STEPS:-60}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0

GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
case "$GPU_NAME" in
  *H200*) SYSTEM=hgx-h200 ;;
  *) SYSTEM=hgx-h100 ;;
esac
echo "GPU: ${GPU_NAME:-none (dry run)}; predicting on catalog system $SYSTEM" | tee "$OUTDIR/log.txt"

run() {  # name, batch, profile batches, options shared by train and predict, predict-only options
  local name="$1" batch="$2" profile_batches="$3" shared="$4" predict_opts="$5"
  if [ -z "${DRY_RUN:-}" ]; then
    echo "== train $name" | tee -a "$OUTDIR/log.txt"
    $MS train --model "$name" --gpus 1 --batch "$batch" $shared --steps "$STEPS" --json "$OUTDIR/train-$name.json" \
      2>&1 | tail -3 | tee -a "$OUTDIR/log.txt"
    echo "== profile $name" | tee -a "$OUTDIR/log.txt"
    $MS train --model "$name" --gpus 1 --profile-batches "$profile_batches" $shared --steps "$STEPS" \
      --json "$OUTDIR/profile-$name.json" 2>&1 | tail -3 | tee -a "$OUTDIR/log.txt"
  fi
  echo "== predict $name (datasheet)" | tee -a "$OUTDIR/log.txt"
  $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
    --json "$OUTDIR/predict-$name.json" 2>&1 | tee -a "$OUTDIR/log.txt"
  if [ -n "${PROFILES:-}" ] && [ -f "$PROFILES/profile-$name.json" ]; then
    echo "== predict $name (calibrated on the other GPU's profile)" | tee -a "$OUTDIR/log.txt"
    $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
      --profile "$PROFILES/profile-$name.json" --json "$OUTDIR/predict-$name-calibrated.json" 2>&1 | tee -a "$OUTDIR/log.txt"
  fi
  if [ -z "${DRY_RUN:-}" ] && [ -f "$OUTDIR/profile-$name.json" ]; then
    echo "== predict $name (calibrated on this GPU's own profile)" | tee -a "$OUTDIR/log.txt"
    $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
      --profile "$OUTDIR/profile-$name.json" --json "$OUTDIR/predict-$name-self.json" 2>&1 | tee -a "$OUTDIR/log.txt"
  fi
}

run resnet50 128 "${RESNET_PROFILE:-64,128}" "--precision bf16 --channels-last" ""
run gpt-small 16 "${GPT_PROFILE:-8,16}" "--precision bf16" "--seq-len 1024"
$PY benchmarks/predict_vs_train.py "$OUTDIR" | tee "$OUTDIR/summary.txt"
# the same steps per kernel category against the model (KERNELS=0 skips it)
if [ "${KERNELS:-1}" != 0 ]; then
  echo "== kernels per category" | tee -a "$OUTDIR/log.txt"
  if [ -n "${DRY_RUN:-}" ]; then KOPTS="--device cpu --tiny"; else KOPTS=""; fi
  $PY benchmarks/predict_kernels_gpu.py $KOPTS --out "$OUTDIR/kernels.json" 2>&1 | grep -v USDT | tee "$OUTDIR/kernels.txt"
fi
