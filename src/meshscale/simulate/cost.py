"""One question, one interface: how long does a collective call take on a fabric?

A `Call` (collective, bytes as nccl-tests counts them, the ranks of the group, the root) is priced on a fabric (a
`Topology`: one system, or a cluster) by a `CostModel`, which says a `Prediction`. This module is the interface
only; the models live with their implementations:

- `nccl.cost_model.NcclCostModel`: NCCL's tuning model, what NCCL would pick and how long it takes;
- `auto.FlowCostModel`: meshscale's own schedules timed by the flow simulator;
- `alpha_beta.AlphaBetaCostModel`: a ring by alpha-beta on the topology, independent of both.

Commands and predictions price calls through `fabric.Fabric.cost`, which builds the model its options name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from meshscale.collectives.kinds import kind
from meshscale.topology import Topology


@dataclass(frozen=True)
class Call:
    """One collective call: ``nbytes`` as nccl-tests counts it, over ``ranks`` (device indices of the fabric)."""

    collective: str
    nbytes: int
    ranks: tuple[int, ...]
    root: int = 0

    @property
    def sized_bytes(self) -> int:
        """``nbytes`` as the call moves it (`call_bytes`)."""
        return call_bytes(self.collective, self.nbytes, len(self.ranks))


@dataclass(frozen=True)
class Prediction:
    """What a cost model says of one call: time, bandwidths as nccl-tests reports them, what ran (NCCL's
    algorithm/protocol and channels, or meshscale's schedule), the model and NCCL's settings it assumed."""

    call: Call
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    chosen: str
    model: str
    settings: tuple[str, ...] = ()
    channels: int = 0   # NCCL's channels (each holds one SM while it runs), or the schedule's; 0 where unknown

    @property
    def detail(self) -> str:
        """What ran, as one label: "nccl <algorithm/protocol, channels>" for NCCL's model, else the schedule."""
        return f"nccl {self.chosen}" if self.model == "nccl" else self.chosen


class CostModel(Protocol):
    def predict(self, call: Call, fabric: Topology) -> Prediction: ...


def call_bytes(collective: str, nbytes: int, ranks: int, elem_bytes: int = 4) -> int:
    """The bytes a call of ``nbytes`` moves, as nccl-tests sizes it (common.cu and each test's
    GetCollByteCount): whole elements, and for collectives whose buffer splits over the ranks (all_gather,
    reduce_scatter, all_to_all, ...) whole elements per rank, rounded down; at least one such step. Every
    model and sweep sizes its calls here."""
    step = elem_bytes * ranks if kind(collective).segmented else elem_bytes
    return max(step, int(nbytes) // step * step)
