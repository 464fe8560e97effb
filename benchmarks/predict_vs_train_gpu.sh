#!/usr/bin/env bash
# Compute predicted from the datasheet against what `meshscale train` measures, on this machine's one GPU:
# ResNet-50 bf16 channels-last at batch 128, GPT-small bf16 at batch 16 (1024 tokens) and llama-1b (FSDP2 of one
# rank, full checkpointing, batch 2 x 2048). For each: `train`
# twice (timed: per-step events and the time split, read once the next step is queued; --no-timing: the steady throughput window, what
# the prediction is held against), a single-GPU profile (`train --profile-batches`, also unsynced), and
# `predict` for the same job from the datasheet, calibrated on this GPU's own profile, and, where PROFILES names
# the output of a run on another GPU kind (this script's OUTDIR there, or a folder of profile-<model>.json),
# calibrated on that GPU. Prints the errors: steady prediction against --no-timing; a loop synced every step beside the timed run.
#
#   PYTHONPATH=src bash benchmarks/predict_vs_train_gpu.sh [OUTDIR]             (default: $OUT, else ./predict_vs_train)
#   PROFILES=tests/fixtures/profiles/h100 PYTHONPATH=src \
#     bash benchmarks/predict_vs_train_gpu.sh $OUT/pvt-h200
#   RESNET_PROFILE=128 GPT_PROFILE=16 LLAMA_PROFILE=2 STEPS=40 ...: one profile batch each, a shorter call;
#   MODELS="gpt-small llama-1b": some of the jobs; KERNELS=0: no kernel table
#   DRY_RUN=1 PYTHONPATH=src bash benchmarks/predict_vs_train_gpu.sh /tmp/x      (CPU: predictions only)
#
# Leaves seven files in OUTDIR: <model>.json for resnet50, gpt-small and llama-1b (every train, profile and predict result
# of that model in one object), summary.txt (the table of errors), log.txt, and kernels.{txt,json}
# (benchmarks/predict_kernels_gpu.py).
set -u
OUTDIR="${1:-${OUT:-predict_vs_train}}"
PY="${PYTHON:-python}"
MS="$PY -m meshscale"
STEPS="${STEPS:-60}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUTDIR"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export NCCL_NVLS_ENABLE=0

GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
case "$GPU_NAME" in
  *H200*) SYSTEM=hgx-h200 ;;
  *) SYSTEM=hgx-h100 ;;
esac
echo "GPU: ${GPU_NAME:-none (dry run)}; predicting on catalog system $SYSTEM" | tee "$OUTDIR/log.txt"

log() { tee -a "$OUTDIR/log.txt"; }

run() {  # name, batch, profile batches, options shared by train and predict, predict-only options
  local name="$1" batch="$2" profile_batches="$3" shared="$4" predict_opts="$5"
  if [ -z "${DRY_RUN:-}" ]; then
    echo "== train $name (timed)" | log
    $MS train --model "$name" --gpus 1 --batch "$batch" $shared --steps "$STEPS" --json "$WORK/train-$name.json" \
      2>&1 | tail -3 | log
    echo "== train $name --no-timing" | log
    $MS train --model "$name" --gpus 1 --batch "$batch" $shared --steps "$STEPS" --no-timing \
      --json "$WORK/untimed-$name.json" 2>&1 | tail -3 | log
    if [ -n "$profile_batches" ]; then
      echo "== profile $name" | log
      $MS train --model "$name" --gpus 1 --profile-batches "$profile_batches" $shared --steps "$STEPS" \
        --json "$WORK/profile-$name.json" 2>&1 | tail -3 | log
    fi
  fi
  echo "== predict $name (datasheet)" | log
  $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
    --json "$WORK/predict-$name.json" 2>&1 | log
  local other=""
  if [ -n "${PROFILES:-}" ]; then
    other="$WORK/other-profile-$name.json"
    $PY "$HERE/predict_vs_train.py" --profile-of "$name" "$PROFILES" "$other" || other=""
  fi
  if [ -n "$other" ]; then
    echo "== predict $name (calibrated on the other GPU's profile)" | log
    $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
      --profile "$other" --json "$WORK/predict-$name-calibrated.json" 2>&1 | log
  fi
  if [ -f "$WORK/profile-$name.json" ]; then
    echo "== predict $name (calibrated on this GPU's own profile)" | log
    $MS predict --model "$name" --system "$SYSTEM" --gpus 1 --batch "$batch" $shared $predict_opts \
      --profile "$WORK/profile-$name.json" --json "$WORK/predict-$name-self.json" 2>&1 | log
  fi
  $PY "$HERE/predict_vs_train.py" --pack "$name" "$WORK" "$OUTDIR/$name.json"
}

# MODELS: which of the three jobs (default all); llama-1b is a layout run (FSDP2 of one rank, full checkpointing)
for model in ${MODELS:-resnet50 gpt-small llama-1b}; do
  case "$model" in
    resnet50) run resnet50 128 "${RESNET_PROFILE:-64,128}" "--precision bf16 --channels-last" "" ;;
    gpt-small) run gpt-small 16 "${GPT_PROFILE:-8,16}" "--precision bf16" "--seq-len 1024" ;;
    llama-1b) run llama-1b 2 "${LLAMA_PROFILE:-1,2}" \
      "--precision bf16 --fsdp 1 --activation-checkpointing full --seq-len 2048" "" ;;
    *) echo "MODELS: resnet50, gpt-small or llama-1b, not $model" >&2; exit 2 ;;
  esac
done
$PY "$HERE/predict_vs_train.py" "$OUTDIR" | tee "$OUTDIR/summary.txt"
# the same steps per kernel category against the model (KERNELS=0 skips it)
if [ "${KERNELS:-1}" != 0 ]; then
  echo "== kernels per category" | log
  if [ -n "${DRY_RUN:-}" ]; then KOPTS="--device cpu --tiny"; else KOPTS=""; fi
  $PY "$HERE/predict_kernels_gpu.py" $KOPTS --out "$OUTDIR/kernels.json" 2>&1 | grep -v USDT > "$OUTDIR/kernels.txt"
  cat "$OUTDIR/kernels.txt" | log >/dev/null
  tail -40 "$OUTDIR/kernels.txt"
fi
