"""The ranges of a cluster's sizing fields, one table for the command-line options and cluster files. Kept apart
from topology/cluster.py so that parsing options imports nothing heavy."""
from meshscale.validation import Range

# One bound on nodes, here only: the entries of a system file (schema.py) and the machines of a cluster. 100k
# machines is several times the largest GPU clusters, and it keeps a system file's graph quick to route.
MAX_NODES = 100_000
CLUSTER_RANGES = {"nodes": Range(1, MAX_NODES, integer=True), "nics": Range(1, 64, integer=True),
                  "levels": Range(1, 3, integer=True), "nodes_per_leaf": Range(1, 1 << 16, integer=True),
                  "radix": Range(2, 1 << 16, integer=True), "oversubscription": Range(1, 1024)}
