#!/bin/bash
# Hand a cluster to Slurm (run by an administrator, once per cluster and once on a node of each kind):
#   1. topology.conf (topology/tree) or topology.yaml (topology/block) for the network `meshscale cluster` sizes:
#      switch names, nodes per leaf, spines; blocks of the nodes one switch hop apart;
#   2. gres.conf lines for this node's GPUs from `meshscale place --slurm`: device files, the cores beside each
#      GPU (discovered on the node) and its NVLinks to every other GPU (Links=), so Slurm hands out
#      well-connected GPUs and binds tasks near them; and the srun binding options for a job on them.
# Usage:  SYSTEM=dgx1-p100 NODES=124 PREFIX=dgx KIND=tree CONF_DIR=./slurm-conf scripts/slurm/handoff.sh
# Then copy the files next to slurm.conf (TopologyPlugin=topology/tree or topology/block) and `scontrol reconfigure`.
set -euo pipefail

SYSTEM=${SYSTEM:-dgx1-p100}
NODES=${NODES:-124}
PREFIX=${PREFIX:-node}
KIND=${KIND:-tree}
CONF_DIR=${CONF_DIR:-slurm-conf}
GPUS=${GPUS:-8}
mkdir -p "$CONF_DIR"

case "$KIND" in
  tree) FILE="$CONF_DIR/topology.conf" ;;
  block) FILE="$CONF_DIR/topology.yaml" ;;
  *) echo "KIND must be tree or block" >&2; exit 2 ;;
esac
meshscale cluster --system "$SYSTEM" --nodes "$NODES" --slurm-topology "$KIND" --slurm-file "$FILE" \
  --slurm-nodes "$PREFIX"

# this node's GPUs (discovered when it has them, else the catalog system's)
if command -v nvidia-smi >/dev/null 2>&1; then PLACE=(); else PLACE=(--system "$SYSTEM"); fi
meshscale place "${PLACE[@]}" --gpus "$GPUS" --slurm > "$CONF_DIR/place.txt"
sed -n 's/^  \(Name=gpu .*\)$/\1/p' "$CONF_DIR/place.txt" > "$CONF_DIR/gres.conf"
grep '^srun ' "$CONF_DIR/place.txt" > "$CONF_DIR/srun-binding.txt" || true
echo "wrote $FILE, $CONF_DIR/gres.conf and $CONF_DIR/srun-binding.txt"
