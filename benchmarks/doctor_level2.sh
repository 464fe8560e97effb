#!/usr/bin/env bash
# `meshscale doctor --level 2` on a GPU machine: every configuration check and error/health counter with its
# verdict, then each GPU's device copy and pinned host<->device copies against the datasheet memory bandwidth
# and the PCIe link rate. Also `bench pairs` and `doctor --level 3` where the machine has 2+ GPUs, and a real
# NCCL hang (one rank skips an all_reduce) read back by `why-hung` from Flight Recorder's dump-on-timeout files.
#   bash benchmarks/doctor_level2.sh OUTDIR        (DRY_RUN=1: print the commands only; runs on CPU too)
set -u
OUTDIR="${1:-/tmp/doctor-level2}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
run() {  # name, command...
  local name=$1; shift
  echo "== $name: $*"
  [ -n "${DRY_RUN:-}" ] && return 0
  timeout 900 "$@" > "$OUTDIR/$name.txt" 2>&1
  echo "exit $? ($OUTDIR/$name.txt)"
  cat "$OUTDIR/$name.txt"
}
run nvidia-smi nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE
run doctor-level1 python3 -m meshscale doctor --json "$OUTDIR/doctor-level1.json"
run doctor-level2 python3 -m meshscale doctor --level 2 --json "$OUTDIR/doctor-level2.json"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${GPUS:-0}" -ge 2 ]; then
  run doctor-level3 python3 -m meshscale doctor --level 3 --json "$OUTDIR/doctor-level3.json"
  run bench-pairs python3 -m meshscale bench pairs --json "$OUTDIR/pairs.json" --bisect
  # a real NCCL hang: rank 1 skips the third collective; NCCL's watchdog dumps every rank's trace on the timeout
  mkdir -p "$OUTDIR/hang"
  run nccl-hang env TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
    TORCH_FR_DUMP_TEMP_FILE="$OUTDIR/hang/nccl_trace_rank_" NCCL_DEBUG=INFO \
    python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/nccl_hang.py
  cp "$OUTDIR/nccl-hang.txt" "$OUTDIR/hang/nccl.log" 2>/dev/null
  run why-hung python3 -m meshscale why-hung "$OUTDIR/hang"
fi
