"""NCCL's own cost model, applied to a meshscale topology: what NCCL would pick for a collective and how long a
run takes.

NCCL (src/graph/tuning.cc) predicts ``time = latency + nBytes / bandwidth`` for every algorithm (ring, tree,
NVLS, ...) and protocol (LL, LL128, Simple) and runs the fastest. Its inputs come from the topology search
(src/graph/search.cc): per-channel bandwidth and the number of channels it could lay over the links.

- `tables`: NCCL's constants per version family (``nccl_tuning.yaml``), GPU and CPU classes, names;
- `search`: the paths inside a node, the ring and tree graphs NCCL's search finds, `analyse` -> `System`;
- `network`: the NICs and the network between nodes;
- `tuning`: NCCL's formula only (latency, bandwidth, its estimate per size), its table filled once per `System`;
- `runtime`: meshscale's corrections to NCCL's estimate (channels a call runs, loop rates, fills, launches);
- `p2p`: send/recv and all_to_all;
- `model`: `predict`, NCCL's choice and the predicted time of one call.
"""
from meshscale.simulate.nccl.tables import (ALGORITHMS, DEFAULT_VERSION, MAX_NODE_GPUS, PROTOCOLS, constants,
                                               families, gpu_sm, normalize_algo, normalize_proto)
from meshscale.simulate.nccl.model import Estimate, NcclPrediction, predict
from meshscale.simulate.nccl.network import REFERENCE_NET_LATENCY_S
from meshscale.simulate.nccl.search import Graph, System, analyse

__all__ = ["ALGORITHMS", "DEFAULT_VERSION", "MAX_NODE_GPUS", "PROTOCOLS", "REFERENCE_NET_LATENCY_S", "Estimate",
           "Graph", "NcclPrediction", "System", "analyse", "constants", "families", "gpu_sm", "normalize_algo",
           "normalize_proto", "predict"]
