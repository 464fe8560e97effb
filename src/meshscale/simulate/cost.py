"""One question, one interface: how long does a collective call take on a fabric?

A `Call` (collective, bytes as nccl-tests counts them, the ranks of the group, the root) is priced on a fabric (a
`Topology`: one system, or a cluster as `topology.cluster.system_or_cluster` builds it) by a `CostModel`:

- `NcclCostModel`: NCCL's tuning model, what NCCL would pick and how long it takes (`simulate.nccl`), in NCCL's
  environment (`nccl_env.NcclEnv`);
- `FlowCostModel`: meshscale's own schedules timed by the flow simulator (`auto.choose_and_simulate`);
- `alpha_beta.AlphaBetaCostModel`: a ring by alpha-beta on the topology, independent of both.

`collective_time_s` is the entry for callers that price many collectives (a training step's FSDP, TP, PP and
CP groups): NCCL's model, the group given by its device indices on the fabric.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from meshscale.collectives.kinds import kind
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv, parse_nccl_env
from meshscale.simulate.params import SimParams
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


class CostModel(Protocol):
    def predict(self, call: Call, fabric: Topology) -> Prediction: ...


@dataclass(frozen=True)
class NcclCostModel:
    """NCCL's model of the NCCL ``version`` (default 2.28) in ``env``, bandwidths scaled by ``params``' calibration,
    NCCL's own pick or the algorithm ``algo`` forced."""

    env: NcclEnv = DEFAULT_ENV
    version: str | None = None
    params: SimParams | None = None
    algo: str | None = None       # NCCL's algorithm forced (as --nccl-algo), None: NCCL's pick

    def predict(self, call: Call, fabric: Topology) -> Prediction:
        from meshscale.simulate.auto import nccl_result

        r = nccl_result(fabric, call.collective, list(call.ranks), call.sized_bytes, self.params, call.root,
                        nccl_version=self.version, nccl_env=self.env, nccl_algo=self.algo)
        return Prediction(call, r.time_s, r.algbw_bytes_per_s, r.busbw_bytes_per_s, r.detail.removeprefix("nccl "),
                          "nccl", self.env.settings, r.channels or 0)


@dataclass(frozen=True)
class FlowCostModel:
    """meshscale's schedule (``algorithm``: "auto" for the fastest) timed by the flow simulator."""

    algorithm: str = "auto"
    params: SimParams | None = None

    def predict(self, call: Call, fabric: Topology) -> Prediction:
        from meshscale.simulate.auto import choose_and_simulate

        r = choose_and_simulate(fabric, call.collective, list(call.ranks), call.sized_bytes, self.algorithm,
                                self.params, call.root).result
        return Prediction(call, r.time_s, r.algbw_bytes_per_s, r.busbw_bytes_per_s, r.detail or r.algorithm, "flow")


def call_bytes(collective: str, nbytes: int, ranks: int, elem_bytes: int = 4) -> int:
    """The bytes a call of ``nbytes`` moves, as nccl-tests sizes it (common.cu and each test's
    GetCollByteCount): whole elements, and for collectives whose buffer splits over the ranks (all_gather,
    reduce_scatter, all_to_all, ...) whole elements per rank, rounded down; at least one such step. Every
    model and sweep sizes its calls here."""
    step = elem_bytes * ranks if kind(collective).segmented else elem_bytes
    return max(step, int(nbytes) // step * step)


def collective_time_s(collective: str, nbytes: int, group: Sequence[int] | None, fabric: Topology | str,
                      nccl_env: NcclEnv | Sequence[str] | None = None, *, nccl_version: str | None = None,
                      root: int = 0) -> Prediction:
    """NCCL's prediction of ``collective`` (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
    all_to_all, send_recv, ...) of ``nbytes`` (nccl-tests' size: the whole gathered / scattered buffer) over the
    device indices ``group`` of ``fabric`` (None: every device). ``fabric``: a catalog name or file, or a
    `Topology` (a cluster from `topology.cluster.system_or_cluster`: ranks numbered node * GPUs + local GPU; build
    it once and reuse it, NCCL's search inside a node is kept per node type). ``nccl_env``: `NcclEnv` or
    KEY=VALUE strings. Raises `MeshscaleError` (one line) on bad input."""
    from meshscale.topology.cluster import system_or_cluster
    from meshscale.topology.schema import require_devices

    topo = require_devices(system_or_cluster(fabric)) if isinstance(fabric, str) else fabric
    ranks = tuple(group) if group is not None else tuple(topo.nodes[d].index for d in topo.devices())
    env = nccl_env if isinstance(nccl_env, NcclEnv) else parse_nccl_env(list(nccl_env or ()))
    return NcclCostModel(env, nccl_version).predict(Call(kind(collective).name, int(nbytes), ranks, root), topo)
