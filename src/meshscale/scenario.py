"""The fabric a prediction runs on, resolved once from the options every predicting command shares: the system or
cluster (``--system``, a cluster file, ``--nodes``/``--link``/...), the calibration (``--p2p``, ``--bench``) and
NCCL's settings (``--nccl-algo``, ``--proto``, ``--nccl-version``, ``--nvls``, ``--nccl-env``). sim, plan and place
(cli/collectives), predict (predict/request) and the tour's predictions (through predict) all call
`resolve_fabric`. It sits at the simulate layer (it calls topology and simulate, nothing above), so that cli/,
predict/ and app/ can all import it; what it resolves with is imported when it resolves, so that importing it
costs a command nothing."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from meshscale.errors import MeshscaleError

if TYPE_CHECKING:
    from meshscale.results import Result
    from meshscale.simulate.link_fit import NetworkFit
    from meshscale.simulate.params import SimParams
    from meshscale.topology import Topology
    from meshscale.topology.cluster import ClusterSpec


@dataclass
class FabricScenario:
    """What the common options resolve to: the fabric as one topology (the system, or the cluster built from
    ``cluster``), its calibration, NCCL's settings and the notices a command prints on stderr."""

    topology: Topology                       # calibrated: on a cluster with --bench, its network fitted
    cluster: ClusterSpec | None              # the cluster the options describe; None for one system
    params: SimParams | None                 # the links' calibration; None where nothing was measured (defaults)
    network_fit: NetworkFit | None = None    # a measured multi-node all_reduce fitted the network
    nccl: dict = field(default_factory=dict)  # `nccl_result`'s keywords (version, algo, proto, nvls, nccl_env)
    notices: list[str] = field(default_factory=list)


def resolve_topology(system: Optional[str], workers: Optional[int] = None, **cluster) -> tuple[Topology, str]:
    """The topology a command works on and a notice (empty: none): ``--system NAME|FILE`` (a cluster file, or a
    cluster of it with the cluster options: ``nodes``, ``link``, ``nics``, ``gpudirect``, ``network``,
    ``oversubscription``), or this machine (with a notice if no GPU)."""
    topology, notice, _ = _resolve(system, workers, cluster)
    return topology, notice


def _resolve(system: Optional[str], workers: Optional[int], cluster: dict) -> tuple[Topology, str, ClusterSpec | None]:
    """`resolve_topology` and the `ClusterSpec` it built the topology from (None for one system or this machine)."""
    from meshscale.topology.cluster import cluster_spec, spec_topology
    from meshscale.topology.discover import discover
    if system:  # a file in another tool's format says what it had to assume (the GPU model, link speeds)
        spec = cluster_spec(system, **cluster)
        topology = spec_topology(system, spec)
        return topology, "; ".join(topology.attrs.get("assumed", [])), spec
    given = [f"--{k}" for k, v in cluster.items() if v is not None]
    if given:
        raise MeshscaleError(f"{', '.join(given)} describe a cluster of a node system; add --system NAME|FILE")
    found = discover(workers)
    return found.topology, found.notice, None


def nccl_settings(nccl_algo: Optional[str] = None, proto: Optional[str] = None, nccl_version: Optional[str] = None,
                  nvls: Optional[bool] = None, nccl_env: Optional[list[str]] = None) -> dict:
    """NCCL's description as given (only what was given: the model's defaults stand for the rest), as
    `nccl_result`'s keywords; ``nccl_env``: the ``--nccl-env KEY=VALUE`` strings, parsed."""
    from meshscale.simulate.nccl_env import parse_nccl_env

    given = {"nccl_algo": nccl_algo, "proto": proto, "nccl_version": nccl_version, "nvls": nvls,
             "nccl_env": parse_nccl_env(nccl_env) if nccl_env else None}
    return {k: v for k, v in given.items() if v is not None}


def _result(given: Result | Path | None) -> Result | None:
    from meshscale.results import load_result
    return load_result(given) if isinstance(given, (str, Path)) else given


def resolve_fabric(system: str | Topology | None, cluster: Optional[dict] = None, p2p: Result | Path | None = None,
                   bench: Result | Path | None = None, nccl: Optional[dict] = None,
                   workers: Optional[int] = None) -> FabricScenario:
    """The `FabricScenario` of the common options, one resolution for every predicting command: the topology
    (``system``: a name or file, this machine where None, or a `Topology` in hand such as the tour's discovered
    one; ``cluster``: the cluster options by `cluster_spec`'s names, None where not given), the calibration
    (``p2p``, ``bench``: results or their files; on a cluster ``bench``, a measured multi-node all_reduce, fits
    the network instead of the links) and NCCL's settings (``nccl``: `nccl_settings`)."""
    from meshscale.simulate.link_fit import calibrated
    from meshscale.topology import Topology
    from meshscale.topology.schema import require_devices

    options = cluster or {}
    if isinstance(system, Topology):
        if any(v is not None for v in options.values()):
            raise MeshscaleError("cluster options describe a cluster of a named system, not of a topology in hand")
        topology, notice, spec = system, "", None
    else:
        topology, notice, spec = _resolve(system, workers, options)  # a cluster file read once
    require_devices(topology)
    p2p, bench = _result(p2p), _result(bench)
    measured = calibrated(topology, p2p, bench) if p2p is not None or bench is not None else None
    fit = measured.network_fit if measured else None
    notices = [fit.source] if fit else []
    if notice:
        notices.append(notice)
    return FabricScenario(measured.topology if measured else topology, spec, measured.params if measured else None,
                          fit, dict(nccl or {}), notices)
