"""The fabric a prediction runs on, resolved once from the options every predicting command shares: the system or
cluster (``--system``, a cluster file, ``--nodes``/``--link``/...), the calibration (``--p2p``, ``--bench``),
NCCL's settings (``--nccl-algo``, ``--proto``, ``--nccl-version``, ``--nvls``, ``--nccl-env``) and the model
(``--algo``). sim, plan and place (cli/collectives), predict, the tour and bench's prediction column all
`resolve_fabric` and price every call through `Fabric.cost`. It sits at the simulate layer (it calls topology and
simulate, nothing above), so that cli/, predict/, bench/, report/ and app/ can all import it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from meshscale.errors import MeshscaleError
from meshscale.results import Result, load_result
from meshscale.simulate.cost import Call, CostModel, Prediction
from meshscale.simulate.link_fit import NetworkFit, calibrated
from meshscale.simulate.models import check_algo, cost_model
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology
from meshscale.topology.cluster import ClusterSpec, cluster_spec, cluster_topology, spec_topology
from meshscale.topology.discover import discover
from meshscale.topology.schema import require_devices


@dataclass(frozen=True, eq=False)
class Fabric:
    """What the common options resolve to: the fabric as one topology (the system, or the cluster built from
    ``cluster``), its calibration, NCCL's settings, the model ``algo`` names and the notices a command prints on
    stderr. `cost` prices a `Call` on it; `at_nodes` is the same fabric at another cluster size."""

    topology: Topology                       # calibrated: on a cluster with --bench, its network fitted
    cluster: ClusterSpec | None = None       # the cluster the options describe; None for one system
    params: SimParams | None = None          # the links' calibration; None where nothing was measured (defaults)
    network_fit: NetworkFit | None = None    # a measured multi-node all_reduce fitted the network
    nccl: NcclSettings = NcclSettings()
    algo: str = "nccl"                       # the --algo vocabulary (`models.ALGOS`)
    notices: tuple[str, ...] = ()
    _built: dict = field(default_factory=dict, init=False, repr=False)  # the model, and `at_nodes`' fabrics

    @property
    def model(self) -> CostModel:
        """The cost model ``algo`` names, with NCCL's settings and the calibration; built once."""
        if "model" not in self._built:
            self._built["model"] = cost_model(self.topology, self.algo, self.nccl, self.params)
        return self._built["model"]

    def cost(self, call: Call) -> Prediction:
        """The one way to price a collective call on this fabric."""
        return self.model.predict(call, self.topology)

    @property
    def nodes(self) -> int:
        return self.topology.cluster.nodes if self.topology.cluster is not None else 1

    @property
    def world_size(self) -> int:
        return len(self.topology.devices())

    @property
    def gpus_per_node(self) -> int:
        return self.world_size // self.nodes

    def at_nodes(self, nodes: int) -> Fabric:
        """The same node system, network (as fitted, where it was), calibration and settings, as a cluster of
        ``nodes`` nodes (1: the node alone); built once per count (the NCCL model keeps its search on each)."""
        if nodes == self.nodes:
            return self
        if self.cluster is None:
            raise MeshscaleError(f"{self.topology.name} is one system; describe its network (--nodes N --link RATE, "
                                 f"or a cluster file) to price {nodes} nodes")
        if nodes not in self._built:
            link = self.network_fit.link if self.network_fit else self.cluster.link
            spec = replace(self.cluster, nodes=nodes, link=link)
            self._built[nodes] = Fabric(cluster_topology(spec), spec, self.params, self.network_fit, self.nccl,
                                        self.algo)
        return self._built[nodes]

    def network_latency_s(self) -> float:
        """One message node to node (`network_latency_s`); 0 on one node."""
        return network_latency_s(self.topology, self.params)


def network_latency_s(topo: Topology, params: SimParams | None = None) -> float:
    """One message node to node on the cluster ``topo``: its wire and switches, the software's per message, and
    without GPUDirect RDMA two more crossings of the host's PCIe; 0 on one system (no network)."""
    cluster, params = topo.cluster, params or SimParams()
    if cluster is None:
        return 0.0
    latency = cluster.latency_s + params.message_latency_of(cluster.net.kind)
    if not cluster.gpudirect:
        latency += 2 * params.message_latency_of("pcie")
    return latency


def resolve_topology(system: Optional[str], workers: Optional[int] = None, **cluster) -> tuple[Topology, str]:
    """The topology a command works on and a notice (empty: none): ``--system NAME|FILE`` (a cluster file, or a
    cluster of it with the cluster options: ``nodes``, ``link``, ``nics``, ``gpudirect``, ``network``,
    ``oversubscription``), or this machine (with a notice if no GPU)."""
    topology, notice, _ = _resolve(system, workers, cluster)
    return topology, notice


def _resolve(system: Optional[str], workers: Optional[int], cluster: dict,
             algo: Optional[str] = None) -> tuple[Topology, str, ClusterSpec | None]:
    """`resolve_topology` and the `ClusterSpec` it built the topology from (None for one system or this machine);
    ``algo``, the model of a predicting command, adds the CPU host's hint to this machine's notice."""
    if system:  # a file in another tool's format says what it had to assume (the GPU model, link speeds)
        spec = cluster_spec(system, **cluster)
        topology = spec_topology(system, spec)
        return topology, "; ".join(topology.attrs.get("assumed", [])), spec
    given = [f"--{k}" for k, v in cluster.items() if v is not None]
    if given:
        raise MeshscaleError(f"{', '.join(given)} describe a cluster of a node system; add --system NAME|FILE")
    found = discover(workers)
    hint = found.cpu_only and algo is not None
    return found.topology, _cpu_host_hint(found.notice, algo) if hint else found.notice, None


def _cpu_host_hint(notice: str, algo: str) -> str:
    """Without --system on a machine without GPUs the prediction is of its CPU workers, which someone asking about
    GPUs does not expect: the discovery notice names the two ways to what they may want, in the same one line."""
    schedules = "" if algo == "auto" else "--algo auto models meshscale's schedules on them, "
    return f"{notice}; {schedules}--system NAME (e.g. hgx-h200) predicts a GPU system"


def _result(given: Result | Path | None) -> Result | None:
    return load_result(given) if isinstance(given, (str, Path)) else given


def resolve_fabric(system: str | Topology | None, cluster: Optional[dict] = None, p2p: Result | Path | None = None,
                   bench: Result | Path | None = None, nccl: NcclSettings | None = None, algo: str = "nccl",
                   workers: Optional[int] = None) -> Fabric:
    """The `Fabric` of the common options, one resolution for every predicting command: the topology
    (``system``: a name or file, this machine where None, or a `Topology` in hand such as the tour's discovered
    one; ``cluster``: the cluster options by `cluster_spec`'s names, None where not given), the calibration
    (``p2p``, ``bench``: results or their files; on a cluster ``bench``, a measured multi-node all_reduce, fits
    the network instead of the links), NCCL's settings (``nccl``: `nccl_env.nccl_settings`) and the model
    (``algo``: `models.ALGOS`)."""
    check_algo(algo)
    options = cluster or {}
    if isinstance(system, Topology):
        if any(v is not None for v in options.values()):
            raise MeshscaleError("cluster options describe a cluster of a named system, not of a topology in hand")
        topology, notice, spec = system, "", None
    else:
        topology, notice, spec = _resolve(system, workers, options, algo)  # a cluster file read once
    require_devices(topology)
    p2p, bench = _result(p2p), _result(bench)
    measured = calibrated(topology, p2p, bench) if p2p is not None or bench is not None else None
    fit = measured.network_fit if measured else None
    notices = ([fit.source] if fit else []) + ([notice] if notice else [])
    return Fabric(measured.topology if measured else topology, spec, measured.params if measured else None,
                  fit, nccl or NcclSettings(), algo, tuple(notices))
