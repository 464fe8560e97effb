"""The lookup of `--system NAME|FILE`: a shipped reference system (`shipped.py`) by name, or a user's file."""
from __future__ import annotations

from pathlib import Path

from meshscale.errors import TopologyError
from meshscale.topology.foreign import is_foreign, load_foreign
from meshscale.topology.model import Topology
from meshscale.topology.schema import load
from meshscale.topology.shipped import shipped_system, system_names


def load_system(name_or_path: str) -> Topology:
    """A catalog system by name, or a user file by path (anything with a / or a .yaml/.yml/.json suffix): a
    meshscale system file, an NCCL topology dump (.xml) or saved `nvidia-smi topo -m` text."""
    if name_or_path in system_names():
        return shipped_system(name_or_path)
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml", ".json", ".xml", ".txt") or "/" in name_or_path or candidate.exists():
        return load_foreign(candidate) if candidate.is_file() and is_foreign(candidate) else load(candidate)
    raise TopologyError(f"unknown system {name_or_path!r}; valid names: {', '.join(system_names())} (or a path to "
                        "a system file: .yaml, .json, an NCCL topology dump .xml or `nvidia-smi topo -m` text)")
