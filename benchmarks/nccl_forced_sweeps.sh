#!/usr/bin/env bash
# all_reduce and all_gather, 1 KiB - 1 GiB (factor 4, as the reference tables), with NCCL's algorithm and protocol
# forced (NCCL_ALGO x NCCL_PROTO) and once at NCCL's own choice with NCCL's tuning and graph log, on every GPU of
# this machine, NCCL called directly (--impl nccl). The JSON results feed the validation corpus
# (scripts/corpus_from_nccl_tests.py reads nccl-tests text; these are meshscale results of the same columns).
#   bash benchmarks/nccl_forced_sweeps.sh OUTDIR
set -u
OUTDIR="${1:-/tmp/nccl-forced}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' | tee "$OUTDIR/versions.txt"
sweep() {  # name collective env...  (MIN_BYTES / FACTOR: the sweep's start and step, 1K and 4 by default)
  local name=$1 coll=$2; shift 2
  env "$@" timeout 150 python3 -m meshscale bench collective "$coll" --impl nccl -g "$GPUS" -b "${MIN_BYTES:-1K}" -e 1G -f "${FACTOR:-4}" \
    --json "$OUTDIR/$name.json" > "$OUTDIR/$name.txt" 2>&1
  echo "$name: exit $? $(grep -c '^│ ' "$OUTDIR/$name.txt") rows"
}
# HOLDOUT=1: instead, every collective at NCCL's own choice, 1 MiB - 1 GiB by factors of 2 (half the sizes are not
# in the reference tables): new corpus rows, first used as a held-out check of the cost model. With TUNING=1 NCCL
# also logs its choice per call (rank 0: "<Func>: <bytes> Bytes -> Algo <a> proto <p> channel{Lo..Hi}={lo..hi}").
if [ -n "${HOLDOUT:-}" ]; then
  log=$([ -n "${TUNING:-}" ] && echo "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING")
  for coll in ${COLLECTIVES:-all_reduce all_gather reduce_scatter broadcast reduce all_to_all send_recv}; do
    MIN_BYTES=${MIN_BYTES:-1M} FACTOR=2 sweep "$coll" "$coll" $log
    [ -n "$log" ] && grep -o '[A-Za-z]*: [0-9]* Bytes -> Algo .*' "$OUTDIR/$coll.txt" | sed 's/ comm .*//' | sort | uniq -c > "$OUTDIR/$coll-choices.txt"
  done
  exit 0
fi
if [ -z "${NO_DEFAULT:-}" ]; then
  sweep all_reduce-default all_reduce NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING
  sweep all_gather-default all_gather NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING
fi
# Forced per function (NCCL >= 2.24 syntax): the harness's own all-gather of per-rank times must stay free to run,
# and AllGather has no Tree.
for algo in ${ALGOS:-Ring Tree}; do
  for proto in LL LL128 Simple; do
    sweep "all_reduce-$algo-$proto" all_reduce "NCCL_ALGO=allreduce:$algo" "NCCL_PROTO=allreduce:$proto"
  done
done
for proto in ${AG_PROTOS:-LL LL128 Simple}; do
  sweep "all_gather-Ring-$proto" all_gather "NCCL_ALGO=allgather:Ring" "NCCL_PROTO=allgather:$proto"
done
