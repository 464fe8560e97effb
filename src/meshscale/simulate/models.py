"""The one ``--algo`` vocabulary and the cost model each value names: "nccl" (NCCL's model, its own pick; a
fabric without GPUs has no NCCL, so meshscale's fastest schedule stands in, as Gloo would), "auto" (meshscale's
fastest schedule by flow simulation) or the name of one meshscale schedule."""
from __future__ import annotations

from meshscale.collectives.algorithms import ALGORITHMS
from meshscale.errors import check_choice
from meshscale.simulate.auto import FlowCostModel
from meshscale.simulate.cost import CostModel
from meshscale.simulate.nccl.cost_model import NcclCostModel
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology

ALGOS = ("nccl", "auto", *ALGORITHMS)  # what --algo takes, in every command


def check_algo(algo: str, choices: tuple[str, ...] = ALGOS) -> str:
    """``algo`` if the vocabulary (or a command's part of it, ``choices``) has it; a one-line error listing the
    choices otherwise."""
    check_choice(algo, choices, "--algo")
    return algo


def cost_model(topology: Topology, algo: str = "nccl", nccl: NcclSettings | None = None,
               params: SimParams | None = None) -> CostModel:
    """The model ``algo`` names on ``topology``, with NCCL's settings ``nccl`` and the links' calibration."""
    if algo == "nccl" and topology.device_kind == "gpu":
        return NcclCostModel.of(nccl or NcclSettings(), params)
    return FlowCostModel("auto" if algo == "nccl" else check_algo(algo), params)
