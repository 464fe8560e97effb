#!/usr/bin/env bash
# Two "nodes" on one 2-GPU host: two torchrun agents (--nnodes 2, one GPU each) with NCCL forced onto its socket
# transport over loopback (no P2P, no shared memory, no InfiniBand), so the GPUs talk over a real network path.
# Measures all_reduce 1 MiB - 512 MiB and ResNet-50 / GPT-small weak scaling (1 GPU, then the two nodes), plus
# the one-GPU profiles a prediction needs.
#   bash benchmarks/experiments/emulated_two_node.sh OUTDIR        (MODELS="" measures the all_reduce only)
# NCCL's own socket settings pass through, e.g. NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=2 (four streams).
# STEPS=N / WARMUP=N: training steps per run (default 40, the first 10 untimed; ResNet-50 at batch 64 then times
# only one second, so STEPS=120 for it); ITERS=N: timed iterations per sweep size; CYCLES=N: cycles per sweep.
set -u
OUTDIR="${1:-/tmp/two-node}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
PORT=29517
two_nodes() {  # name, meshscale arguments...
  local name=$1; shift
  PORT=$((PORT + 1))
  for node in 0 1; do
    pin=$([ -n "${PIN:-}" ] && echo "taskset -c $((node * 8))-$((node * 8 + 7))")  # PIN=1: 8 cores per "node"
    env $NET CUDA_VISIBLE_DEVICES=$node MESHSCALE_HOSTNAME=node$node timeout 300 $pin python3 -m torch.distributed.run \
      --nnodes 2 --nproc-per-node 1 --node-rank $node --master-addr 127.0.0.1 --master-port $PORT \
      -m meshscale "$@" > "$OUTDIR/$name.node$node.txt" 2>&1 &
  done
  wait
  echo "$name: $(tail -1 "$OUTDIR/$name.node0.txt")"
}
ITERS=${ITERS:-20}  # timed iterations per sweep size (nccl-tests' 20: 11 ms in all at 4 MiB on this path)
CYCLES=${CYCLES:-1}  # CYCLES=N: each sweep N times in one launch, each size the median cycle (nccl-tests' -N)
sweep() { two_nodes "$1" bench collective all_reduce -b 1M -e 512M -f 2 -n $ITERS -N $CYCLES --iter-times --json "$OUTDIR/$1.json"; }
# training steps per run, the first WARMUP untimed; STEPS / WARMUP, when given, set the profile and `scale` too
PROFILE_STEPS=${STEPS:-20}; PROFILE_WARMUP=${WARMUP:-5}; SCALE_STEPS=${STEPS:-30}; STEPS=${STEPS:-40}; WARMUP=${WARMUP:-10}
batch_of() { [ $1 = resnet50 ] && echo "${RESNET_BATCH:-128}" || echo "${GPT_BATCH:-16}"; }  # per GPU
sweep allreduce
for i in $(seq 2 "${SWEEPS:-1}"); do  # SWEEPS=N: the sweep N times back to back, to see the path's own spread
  sweep "allreduce-s$i"
done
for model in ${MODELS-resnet50 gpt-small}; do
  batch=$(batch_of $model)
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m meshscale train --gpus 1 --model $model --precision bf16 --batch $batch \
    --steps $STEPS --timing-warmup $WARMUP --no-timing --json "$OUTDIR/$model-1gpu.json" > "$OUTDIR/$model-1gpu.txt" 2>&1
  echo "$model 1 GPU: $(grep -i 'samples/s\|throughput' "$OUTDIR/$model-1gpu.txt" | tail -1)"
  two_nodes "$model-2nodes" train --model $model --precision bf16 --batch $batch --steps $STEPS --timing-warmup $WARMUP \
    --no-timing --json "$OUTDIR/$model-2nodes.json"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m meshscale train --gpus 1 --model $model --precision bf16 \
    --profile-batches $((batch / 2)),$batch --steps $PROFILE_STEPS --timing-warmup $PROFILE_WARMUP --json "$OUTDIR/$model-profile.json" \
    > "$OUTDIR/$model-profile.txt" 2>&1
done
# OVERLAP=1: GPT-small over the two nodes three more ways, to see how much of the exchange hides behind backward:
# one bucket (nothing can overlap), and with the per-step compute / comm split (--timing); each with its one-GPU
# profile measured above.
if [ -n "${OVERLAP:-}" ]; then
  two_nodes gpt-small-2nodes-onebucket train --model gpt-small --precision bf16 --batch 16 --steps $STEPS --timing-warmup $WARMUP \
    --no-timing --bucket-cap-mb 1000 --json "$OUTDIR/gpt-small-2nodes-onebucket.json"
  two_nodes gpt-small-2nodes-timed train --model gpt-small --precision bf16 --batch 16 --steps $STEPS --timing-warmup $WARMUP \
    --json "$OUTDIR/gpt-small-2nodes-timed.json"
  two_nodes allreduce-25m bench collective all_reduce -b 25M -e 150M -f 6 --json "$OUTDIR/allreduce-25m.json"
fi
# REPEAT=N: the models of REPEAT_MODEL (GPT-small by default; a list runs each in turn) over the two nodes N more
# times with DDP's default buckets, each round followed by the all_reduce sweep again, to see how far the training
# points and the network move from run to run (every run kept).
for i in $(seq 1 "${REPEAT:-0}"); do
  for rmodel in ${REPEAT_MODEL:-gpt-small}; do
    two_nodes "$rmodel-2nodes-r$i" train --model $rmodel --precision bf16 --batch $(batch_of $rmodel) --steps $STEPS \
      --timing-warmup $WARMUP --no-timing --json "$OUTDIR/$rmodel-2nodes-r$i.json"
  done
  sweep "allreduce-r$i"
done
# SCALE=1: `meshscale scale` under the two torchrun agents: a weak-scaling sweep inside torchrun's world (1 rank,
# then both "nodes"), each row with the prediction on the joined two-host topology beside it.
# Then the all_reduce sweep again, so the run sits between two measurements of the network.
if [ -n "${SCALE:-}" ]; then
  two_nodes scale-2hosts scale --weak --batch 64 --model resnet50 --precision bf16 --steps $SCALE_STEPS --timing-warmup $WARMUP \
    --no-timing --json "$OUTDIR/scale-2hosts.json"
  cat "$OUTDIR/scale-2hosts.node0.txt" | tail -20
  sweep allreduce-after-scale
fi
