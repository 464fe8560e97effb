"""The reference systems shipped with meshscale (files in ``systems/``): their names and topologies.

Below `catalog`, whose ``--system NAME|FILE`` lookup also reads users' files (NCCL dumps and `nvidia-smi topo -m`
text through `foreign`, which builds on NVML discovery): discovery fills in a GPU's facts from these systems
without importing the readers that build on it.

Most systems are YAML with their sources in comments. The NVL72 racks (1,500 nodes and links each) are JSON
written by scripts/rack_systems.py, their sources under ``attrs.sources``: YAML takes 40 times longer to read, and
discovery reads the whole catalog.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

from meshscale.topology.model import Topology
from meshscale.topology.schema import load

SYSTEMS = resources.files("meshscale.topology") / "systems"
SUFFIXES = (".yaml", ".json")


@lru_cache(maxsize=1)
def _files() -> dict[str, str]:
    return {p.name.rsplit(".", 1)[0]: p.name for p in SYSTEMS.iterdir() if p.name.endswith(SUFFIXES)}


def system_names() -> list[str]:
    """Names of the catalog systems, sorted."""
    return sorted(_files())


def system_file_name(name: str) -> str:
    """The file of the shipped system ``name`` in ``systems/`` (gb200-nvl72.json, hgx-h100.yaml)."""
    return _files()[name]


def shipped_system(name: str) -> Topology:
    """The shipped system ``name`` (one of `system_names()`)."""
    with resources.as_file(SYSTEMS / system_file_name(name)) as path:
        return load(path)


def load_catalog() -> list[Topology]:
    return [shipped_system(n) for n in system_names()]


@lru_cache(maxsize=1)
def catalog_gpus() -> dict[str, tuple[str, dict]]:
    """Each GPU model of the catalog -> (the first system that has it, that GPU's attributes): what discovery
    adds to what NVML tells, read once per process."""
    known: dict[str, tuple[str, dict]] = {}
    for topo in load_catalog():
        for g in topo.gpus():
            attrs = topo.nodes[g].attrs
            known.setdefault(attrs.get("model"), (topo.name, dict(attrs)))
    return known
