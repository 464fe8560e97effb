#!/usr/bin/env bash
# Weak (256 images per GPU) and strong (global batch 256) scaling of ResNet-50, bf16, synthetic data, on 1 and 2
# GPUs (GPUS=1,2,4 for more): the plain DDP script and meshscale's ddp and allreduce modes, plus the knobs that
# matter for strong scaling at small per-GPU batches (channels-last, torch.compile, CUDA graphs via
# reduce-overhead, fusion size, bucket view, static graph, bf16 compression) and a GPT where communication
# dominates. Every configuration runs in fresh processes, 10 warm-up + 20 timed steps.
#
#   bash benchmarks/experiments/train_scaling.sh [OUTDIR]        (default: $OUT, else ./train_scaling_results)
#   SECTIONS="plain ddp allreduce fast knobs compile graph gpt" GPUS=1,2 bash benchmarks/experiments/train_scaling.sh /tmp/x
#
# Writes OUTDIR/plain.jsonl (plain DDP rows) and one meshscale Result per sweep (OUTDIR/<name>.json, kind
# "scale") with a plot (OUTDIR/<name>.png); OUTDIR/summary.txt lists throughput, speedup and efficiency.
set -u
OUTDIR="${1:-${OUT:-train_scaling_results}}"
GPUS="${GPUS:-1,2}"
SECTIONS="${SECTIONS:-plain ddp allreduce fast knobs compile gpt}"
MS="${MESHSCALE:-meshscale}"
PY="${PYTHON:-python}"
HERE="$(cd "$(dirname "$0")" && pwd)"
STEPS="--steps 30 --timing-warmup 10"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUTDIR"

sweep() {  # name, then meshscale scale options
  local name="$1"; shift
  echo "== $name: $MS scale $*" | tee -a "$OUTDIR/log.txt"
  $MS scale --gpus "$GPUS" "$@" $STEPS --json "$OUTDIR/$name.json" --plot "$OUTDIR/$name.png" 2>&1 | tee -a "$OUTDIR/log.txt"
}

plain() {  # weak or strong, extra options
  local how="$1"; shift
  for n in ${GPUS//,/ }; do
    local b=256; [ "$how" = strong ] && b=$((256 / n))
    echo "== plain DDP $how n=$n batch/GPU=$b $*" | tee -a "$OUTDIR/log.txt"
    $PY -m torch.distributed.run --standalone --nproc-per-node "$n" "$HERE/train_ddp_plain.py" --batch "$b" \
      --warmup 10 --steps 20 --tag "plain-ddp-$how" --out "$OUTDIR/plain.jsonl" "$@" 2>&1 | tail -1 | tee -a "$OUTDIR/log.txt"
  done
}

R50="--model resnet50 --precision bf16"
for s in $SECTIONS; do
  case "$s" in
    plain)     plain weak; plain strong ;;
    ddp)       sweep ddp-weak $R50 --mode ddp --weak --batch 256
               sweep ddp-strong $R50 --mode ddp --strong --global-batch 256 ;;
    allreduce) sweep allreduce-weak $R50 --mode allreduce --weak --batch 256
               sweep allreduce-strong $R50 --mode allreduce --strong --global-batch 256 ;;
    fast)      # the same without the per-step device sync that the compute/comm split needs (throughput only)
               sweep ddp-weak-notiming $R50 --mode ddp --weak --batch 256 --no-timing
               sweep allreduce-weak-notiming $R50 --mode allreduce --weak --batch 256 --no-timing
               sweep ddp-strong-notiming $R50 --mode ddp --strong --global-batch 256 --no-timing
               sweep allreduce-strong-notiming $R50 --mode allreduce --strong --global-batch 256 --no-timing ;;
    knobs)     # strong scaling at small per-GPU batch: what each knob buys
               plain strong --channels-last
               sweep ddp-strong-cl $R50 --mode ddp --strong --global-batch 256 --channels-last
               sweep ddp-strong-cl-view-static $R50 --mode ddp --strong --global-batch 256 --channels-last --bucket-view --static-graph
               sweep ddp-strong-cl-bucket100 $R50 --mode ddp --strong --global-batch 256 --channels-last --bucket-cap-mb 100
               sweep allreduce-strong-cl $R50 --mode allreduce --strong --global-batch 256 --channels-last
               sweep allreduce-strong-cl-fusion16 $R50 --mode allreduce --strong --global-batch 256 --channels-last --fusion-mb 16
               sweep allreduce-strong-cl-bf16wire $R50 --mode allreduce --strong --global-batch 256 --channels-last --compression bf16 ;;
    compile)   # torch.compile (and CUDA graphs through reduce-overhead): slow to start, so more warm-up
               plain strong --channels-last --compile
               sweep ddp-strong-cl-compile $R50 --mode ddp --strong --global-batch 256 --channels-last --compile default
               sweep ddp-weak-cl-compile $R50 --mode ddp --weak --batch 256 --channels-last --compile default
               sweep ddp-strong-cl-cudagraphs $R50 --mode ddp --strong --global-batch 256 --channels-last --compile reduce-overhead ;;
    graph)     # the whole step captured in one CUDA graph (--cuda-graph), beside the eager runs of the same call
               plain strong --channels-last
               sweep allreduce-strong-cl-notiming $R50 --mode allreduce --strong --global-batch 256 --channels-last --no-timing
               sweep allreduce-strong-cl-graph $R50 --mode allreduce --strong --global-batch 256 --channels-last --cuda-graph --no-timing
               sweep ddp-strong-cl-graph $R50 --mode ddp --strong --global-batch 256 --channels-last --cuda-graph --no-timing
               sweep allreduce-weak-cl-graph $R50 --mode allreduce --weak --batch 256 --channels-last --cuda-graph --no-timing
               [ -n "${NCHW_GRAPH:-}" ] && sweep allreduce-strong-graph $R50 --mode allreduce --strong --global-batch 256 --cuda-graph --no-timing ;;
    gpt)       # a transformer: 124M parameters of gradients per step, communication heavier per FLOP
               sweep gpt-small-ddp-weak --model gpt-small --precision bf16 --mode ddp --weak --batch 8
               sweep gpt-small-allreduce-weak --model gpt-small --precision bf16 --mode allreduce --weak --batch 8
               sweep gpt-small-ddp-strong --model gpt-small --precision bf16 --mode ddp --strong --global-batch 16 ;;
    *) echo "unknown section $s" >&2 ;;
  esac
done

$PY - "$OUTDIR" <<'PYEOF' | tee "$OUTDIR/summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"{'configuration':44} {'GPUs':>4} {'batch/GPU':>9} {'samples/s':>10} {'speedup':>7} {'eff':>5} {'comm%':>6}")
plain = [json.loads(l) for l in (out / "plain.jsonl").read_text().splitlines()] if (out / "plain.jsonl").exists() else []
for r in plain:
    tag = r["script"] + ("-cl" if r["channels_last"] else "") + ("-compile" if r["compile"] else "")
    base = next((p for p in plain if p["world_size"] == 1 and p["script"] == r["script"]
                 and p["channels_last"] == r["channels_last"] and p["compile"] == r["compile"]), None)
    sp = r["throughput_samples_per_s"] / base["throughput_samples_per_s"] if base else float("nan")
    print(f"{tag:44} {r['world_size']:>4} {r['batch_per_rank']:>9} {r['throughput_samples_per_s']:>10.1f} {sp:>7.2f} {sp / r['world_size']:>5.0%} {'':>6}")
for f in sorted(out.glob("*.json")):
    res = json.loads(f.read_text())
    if res.get("kind") != "scale":
        continue
    for r in res["rows"]:
        print(f"{f.stem:44} {r['world_size']:>4} {r['batch_per_rank']:>9} {r['throughput_samples_per_s']:>10.1f} "
              f"{r['speedup']:>7.2f} {r['efficiency']:>5.0%} {(r['comm_share'] or 0):>6.1%}")
PYEOF
