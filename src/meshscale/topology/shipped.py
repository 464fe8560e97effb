"""The reference systems shipped with meshscale (YAML files in ``systems/``): their names and topologies.

Below `catalog`, whose ``--system NAME|FILE`` lookup also reads users' files (NCCL dumps and `nvidia-smi topo -m`
text through `foreign`, which builds on NVML discovery): discovery fills in a GPU's facts from these systems
without importing the readers that build on it."""
from __future__ import annotations

from importlib import resources

from meshscale.topology.model import Topology
from meshscale.topology.schema import load

SYSTEMS = resources.files("meshscale.topology") / "systems"


def system_names() -> list[str]:
    """Names of the catalog systems, sorted."""
    return sorted(p.name[:-5] for p in SYSTEMS.iterdir() if p.name.endswith(".yaml"))


def shipped_system(name: str) -> Topology:
    """The shipped system ``name`` (one of `system_names()`)."""
    with resources.as_file(SYSTEMS / f"{name}.yaml") as path:
        return load(path)


def load_catalog() -> list[Topology]:
    return [shipped_system(n) for n in system_names()]
