#!/usr/bin/env bash
# Transformer training under a layout, in one device call. On one GPU: meshscale's llama-1b step and its ResNet-50
# data-parallel step beside plain loops (benchmarks/train_vs_plain.py, rounds interleaved), the memory check
# refusing llama3-8b on one GPU (exit 2, one line), llama-1b training with --fsdp 1 and full checkpointing, the
# ResNet-50 --no-timing command beside benchmarks/train_ddp_plain.py, ResNet-50 profiled beside its plain loop
# (benchmarks/resnet_host_profile.py). With 2 GPUs or more: llama-1b under fsdp 2 and tp 2 beside plain
# torchtitan-style loops on the same 2 GPUs, and `meshscale train` under fsdp 2, tp 2 (llama-1b) and pp 2
# (llama-tiny) with each dimension's measured communication time and the pipeline's bubble. Usage on the device:
#   bash benchmarks/train_parallel_gpu.sh              (writes under $OUT, default /tmp/meshscale-out)
#   PART=two bash benchmarks/train_parallel_gpu.sh     (the 2-GPU part alone, with a short one-GPU llama reference)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/meshscale-out}"; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"; date -u | tee -a "$OUT/gpu.txt"
if [ "${PART:-all}" != two ]; then
timeout -k 5 300 python3 benchmarks/train_vs_plain.py --out "$OUT/train_vs_plain.jsonl" 2>&1 | grep -v Warning | tee "$OUT/train_vs_plain.txt" | grep -v '^{'
timeout -k 5 60 python3 -m meshscale train --model llama3-8b --gpus 1 --precision bf16 --batch 1 --seq-len 2048 \
  > "$OUT/llama3-8b-refused.txt" 2>&1; echo "llama3-8b on one GPU: exit $? (2 expected)"; tail -1 "$OUT/llama3-8b-refused.txt"
timeout -k 5 180 python3 -m meshscale train --model llama-1b --gpus 1 --fsdp 1 --precision bf16 \
  --activation-checkpointing full --batch 2 --seq-len 2048 --steps 15 --json "$OUT/llama-1b.json" \
  > "$OUT/llama-1b.txt" 2>&1; echo "llama-1b: exit $?"; tail -22 "$OUT/llama-1b.txt"
timeout -k 5 120 python3 -m meshscale train --model resnet50 --gpus 1 --precision bf16 --channels-last --batch 128 \
  --no-timing --steps 60 --timing-warmup 10 --json "$OUT/resnet50-notiming.json" > "$OUT/resnet50-notiming.txt" 2>&1
grep -E "samples/s" "$OUT/resnet50-notiming.txt" | tail -1
timeout -k 5 120 python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/train_ddp_plain.py --batch 128 \
  --channels-last --steps 50 2>&1 | grep '^{' | tee "$OUT/resnet50-plain.json"
# ResNet-50's step beside a plain loop, profiled (kernels, launches, device idle gaps, CPU operators per side)
timeout -k 5 400 python3 benchmarks/resnet_host_profile.py 2>&1 | grep -v -E "Warning|_warn_once|━" | tee "$OUT/resnet_host.txt"
fi
# Two GPUs: meshscale's llama-1b step under fsdp 2 and tp 2 beside a torchtitan-style plain loop (same model, plan
# and data per rank; rounds interleaved), each side's scaling against meshscale's one-GPU llama-1b figure at the
# same per-rank batch; then `meshscale train` under fsdp 2, tp 2 and pp 2 with each dimension's measured
# communication and the pipeline's bubble
one_gpu() {   # the median of meshscale's one-GPU llama tokens/s in train_vs_plain.jsonl (empty if none)
  python3 -c 'import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if "\"round\"" in line]
print(statistics.median(r["meshscale_tokens_per_s"] for r in rows if r["part"] == "llama" and r.get("ranks") == 1))' \
    "$OUT/train_vs_plain.jsonl" 2>/dev/null
}
GPUS=$(nvidia-smi -L | wc -l)
if [ "$GPUS" -ge 2 ]; then
  ONE=$(one_gpu)
  if [ -z "$ONE" ]; then   # PART=two: a short one-GPU llama reference
    timeout -k 5 120 python3 benchmarks/train_vs_plain.py --parts llama --warmup 3 --steps 10 --rounds 2 \
      --out "$OUT/train_vs_plain.jsonl" 2>&1 | grep -E "^llama"
    ONE=$(one_gpu)
  fi
  for layout in fsdp=2 tp=2; do
    timeout -k 5 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/train_vs_plain.py \
      --layout $layout --warmup 3 --steps 10 --rounds 4 ${ONE:+--one-gpu-tokens-per-s $ONE} \
      --out "$OUT/train_vs_plain_2gpu.jsonl" > "$OUT/train_vs_plain_2gpu-$layout.txt" 2>&1
    echo "train_vs_plain --layout $layout on 2 GPUs: exit $?"; grep -E "^(llama|train_vs_plain)" "$OUT/train_vs_plain_2gpu-$layout.txt"
  done
  # llama-1b ties its head to its embedding, which pipeline stages cannot split: the pipeline trains llama-tiny
  for job in "llama-1b --fsdp 2 --batch 2" "llama-1b --tp 2 --batch 2" "llama-tiny --pp 2 --batch 8"; do
    name="${job// /}"
    timeout -k 5 120 python3 -m meshscale train --model $job --gpus 2 --precision bf16 --activation-checkpointing selective \
      --steps 12 --timing-warmup 4 --comm-breakdown-steps 2 --json "$OUT/2gpu-$name.json" > "$OUT/2gpu-$name.txt" 2>&1
    echo "$job on 2 GPUs: exit $?"; grep -E "communication|bubble ms|comm ms|tokens/s " "$OUT/2gpu-$name.txt"
  done
fi
