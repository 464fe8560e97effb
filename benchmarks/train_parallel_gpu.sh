#!/usr/bin/env bash
# Transformer training under a layout on one GPU, in one device call: meshscale's llama-1b step and its ResNet-50
# data-parallel step beside plain loops (benchmarks/train_vs_plain.py, rounds interleaved), the memory check
# refusing llama3-8b on one GPU (exit 2, one line), llama-1b training with --fsdp 1 and full checkpointing, and
# the ResNet-50 --no-timing command beside benchmarks/train_ddp_plain.py, ResNet-50 profiled beside its plain loop
# (benchmarks/resnet_host_profile.py) and, with 2 GPUs or more, llama-1b under fsdp 2 and tp 2 (llama-tiny under pp 2) with each
# dimension's measured communication time. Usage on the device:
#   bash benchmarks/train_parallel_gpu.sh          (writes under $OUT, default /tmp/meshscale-out)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/meshscale-out}"; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"; date -u | tee -a "$OUT/gpu.txt"
timeout 300 python3 benchmarks/train_vs_plain.py --out "$OUT/train_vs_plain.jsonl" 2>&1 | grep -v Warning | tee "$OUT/train_vs_plain.txt" | grep -v '^{'
timeout 60 python3 -m meshscale train --model llama3-8b --gpus 1 --precision bf16 --batch 1 --seq-len 2048 \
  > "$OUT/llama3-8b-refused.txt" 2>&1; echo "llama3-8b on one GPU: exit $? (2 expected)"; tail -1 "$OUT/llama3-8b-refused.txt"
timeout 180 python3 -m meshscale train --model llama-1b --gpus 1 --fsdp 1 --precision bf16 \
  --activation-checkpointing full --batch 2 --seq-len 2048 --steps 15 --json "$OUT/llama-1b.json" \
  > "$OUT/llama-1b.txt" 2>&1; echo "llama-1b: exit $?"; tail -22 "$OUT/llama-1b.txt"
timeout 120 python3 -m meshscale train --model resnet50 --gpus 1 --precision bf16 --channels-last --batch 128 \
  --no-timing --steps 60 --timing-warmup 10 --json "$OUT/resnet50-notiming.json" > "$OUT/resnet50-notiming.txt" 2>&1
grep -E "samples/s" "$OUT/resnet50-notiming.txt" | tail -1
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/train_ddp_plain.py --batch 128 \
  --channels-last --steps 50 2>&1 | grep '^{' | tee "$OUT/resnet50-plain.json"
# ResNet-50's step beside a plain loop, profiled (kernels, launches, device idle gaps, CPU operators per side)
timeout 400 python3 benchmarks/resnet_host_profile.py 2>&1 | grep -v -E "Warning|_warn_once|━" | tee "$OUT/resnet_host.txt"
# Several GPUs: each dimension's busy and exposed communication time, measured on NCCL (the table's last rows)
GPUS=$(nvidia-smi -L | wc -l)
if [ "$GPUS" -ge 2 ]; then
  # llama-1b ties its head to its embedding, which pipeline stages cannot split: the pipeline trains llama-tiny
  for job in "llama-1b --fsdp 2" "llama-1b --tp 2" "llama-tiny --pp 2"; do
    name="${job// /}"
    timeout 240 python3 -m meshscale train --model $job --gpus 2 --precision bf16 --activation-checkpointing selective \
      --batch 2 --steps 15 --json "$OUT/2gpu-$name.json" > "$OUT/2gpu-$name.txt" 2>&1
    echo "$job on 2 GPUs: exit $?"; grep -E "communication|bubble|comm ms|tokens/s " "$OUT/2gpu-$name.txt"
  done
fi
