"""The ranges of a cluster's sizing fields, one table for the command-line options and cluster files. Kept apart
from topology/cluster.py so that parsing options imports nothing heavy."""
from meshscale.validation import Range

# One bound on nodes, here only: the entries of a system file (schema.py) and the machines of a cluster. 100k
# machines is 8x the largest GPU cluster announced (xAI's Colossus: 100,000 Hopper GPUs, 12,500 nodes of 8;
# docs/references.md); a cluster is priced from one node's graph (cluster.ClusterTopology), and a system file's
# graph of that many entries stays quick to route.
MAX_NODES = 100_000
# Network ports of one machine: the densest servers have 8 to 16; 64 leaves room.
MAX_NICS = 64
CLUSTER_RANGES = {"nodes": Range(1, MAX_NODES, integer=True), "nics": Range(1, MAX_NICS, integer=True),
                  "levels": Range(1, 3, integer=True), "nodes_per_leaf": Range(1, 1 << 16, integer=True),
                  "radix": Range(2, 1 << 16, integer=True), "oversubscription": Range(1, 1024)}

# One machine as a file from another tool describes it (an NCCL topology dump, `nvidia-smi topo -m` text;
# topology/foreign.py). The largest single hosts hold 16 GPUs (larger NVLink domains span hosts: an NVL72 is
# 18 hosts of 4), and a GPU has at most 18 NVLinks (H100, B200), so 64 of each is ample and keeps the
# reader's pairwise work (GPUs^3 at worst) well under a second.
MAX_MACHINE_GPUS = 64
MAX_NVLINKS_PER_GPU = 64
MAX_CPU_MASK_DIGITS = 1 << 14                      # hex digits of a CPU mask: 65,536 CPUs
# An NCCL dump nests system > cpu > pci (a bridge per PCIe switch level) > gpu > nvlink: about ten deep and a
# few hundred elements for 8 GPUs; these bounds are ample and stop a hostile file before it grows a tree.
MAX_XML_DEPTH = 64
MAX_XML_ELEMENTS = 100_000
