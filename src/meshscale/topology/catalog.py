"""The shipped reference systems (YAML files in ``systems/``) and the lookup of `--system NAME|FILE`."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from meshscale.errors import TopologyError
from meshscale.topology.model import Topology
from meshscale.topology.schema import load

_SYSTEMS = resources.files("meshscale.topology") / "systems"


def system_names() -> list[str]:
    """Names of the catalog systems, sorted."""
    return sorted(p.name[:-5] for p in _SYSTEMS.iterdir() if p.name.endswith(".yaml"))


def load_system(name_or_path: str) -> Topology:
    """A catalog system by name, or a user file by path (anything with a / or a .yaml/.yml/.json suffix): a
    meshscale system file, an NCCL topology dump (.xml) or saved `nvidia-smi topo -m` text."""
    if name_or_path in system_names():
        with resources.as_file(_SYSTEMS / f"{name_or_path}.yaml") as path:
            return load(path)
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml", ".json", ".xml", ".txt") or "/" in name_or_path or candidate.exists():
        from meshscale.topology.foreign import is_foreign, load_foreign
        return load_foreign(candidate) if candidate.is_file() and is_foreign(candidate) else load(candidate)
    raise TopologyError(f"unknown system {name_or_path!r}; valid names: {', '.join(system_names())} (or a path to "
                        "a system file: .yaml, .json, an NCCL topology dump .xml or `nvidia-smi topo -m` text)")


def load_catalog() -> list[Topology]:
    return [load_system(n) for n in system_names()]
