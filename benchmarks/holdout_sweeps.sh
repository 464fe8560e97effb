#!/usr/bin/env bash
# Every collective, 1 MiB - 1 GiB by factors of 2 (half the sizes are not in the reference tables), NCCL called
# directly (--impl nccl) at its own choice, on every GPU of this machine: new corpus rows, first used as a
# held-out check of the cost model (predicted before they are added).
#   bash benchmarks/holdout_sweeps.sh OUTDIR
set -u
OUTDIR="${1:-/tmp/holdout}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' | tee "$OUTDIR/versions.txt"
for coll in ${COLLECTIVES:-all_reduce all_gather reduce_scatter broadcast reduce all_to_all send_recv}; do
  timeout 150 python3 -m meshscale bench collective "$coll" --impl nccl -g "$GPUS" -b 1M -e 1G -f 2 \
    --json "$OUTDIR/$coll.json" > "$OUTDIR/$coll.txt" 2>&1
  echo "$coll: exit $? $(grep -c '^│ ' "$OUTDIR/$coll.txt") rows"
done
