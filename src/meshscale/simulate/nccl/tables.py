"""NCCL's constants, per version family (``nccl_tuning.yaml``: tuning.cc's tables, the search's speed ladders,
per-link bandwidths of paths.cc / topo.h), the GPU and CPU classes NCCL reads from the hardware, and the names of
its algorithms and protocols."""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

import yaml

from meshscale.errors import MeshscaleError


PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat")
P2P = "p2p"  # point-to-point collectives (all_to_all, gather, scatter, send_recv): grouped ncclSend/ncclRecv
DEFAULT_VERSION = "2.28"
PATH_TYPES = ("NVL", "PIX", "PXB", "PHB", "SYS")  # NCCL's path types inside a node, nearest first
ARCH = {70: "volta", 80: "ampere", 90: "hopper", 100: "blackwell"}
_ALGO_SPELLINGS = {"nvlstree": "nvls_tree", "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
                   "collnet": "collnet_direct"}
RING_ONLY = ("broadcast", "reduce")
TUNED_COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")  # NCCL's tuned kinds
P2P_COLLECTIVES = ("all_to_all", "gather", "scatter", "send_recv")
DFS_VISIT_LIMIT = 20_000  # ring search effort per ring (NCCL's search has a time limit too)
# GPUs of one node NCCL's search here lays rings over: the largest NVLink domain built (GB200 NVL72); the search
# grows with the square of the GPUs and more would not answer within seconds
MAX_NODE_GPUS = 72


@lru_cache(maxsize=1)
def data_file() -> dict:
    with resources.files("meshscale.simulate").joinpath("nccl_tuning.yaml").open() as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml where built: 5x faster


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def families() -> list[str]:
    """The NCCL version families the data file describes, oldest first."""
    return sorted(data_file()["families"], key=version_key)


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


@lru_cache(maxsize=None)
def constants(version: str | None = None) -> dict:
    """The constants of the family ``version`` belongs to (the newest family not newer than it; default 2.28),
    inherited entries merged in; ``family`` and ``source`` say which."""
    fams = data_file()["families"]
    text = str(version or DEFAULT_VERSION).strip().lstrip("v")
    if not re.match(r"^\d+(\.\d+)*", text):
        raise MeshscaleError(f"NCCL version {version!r} is not a version number; use e.g. 2.28, 2.18.5 or 1.6")
    want = version_key(text)
    fitting = [f for f in fams if version_key(f) <= want]
    if not fitting:
        raise MeshscaleError(f"no NCCL constants for version {version}; known families: {', '.join(families())}")
    family = max(fitting, key=version_key)

    def resolved(name: str) -> dict:
        entry = fams[name]
        return _merge(resolved(entry["inherit"]), entry) if "inherit" in entry else dict(entry)

    merged = resolved(family)
    merged["family"] = family
    return merged


def _first_match(table: list, text: str, default):
    for pattern, value in table:
        if re.search(pattern, text or "", re.IGNORECASE):
            return value
    return default


def gpu_sm(model: str) -> int:
    """Compute capability x10 of a GPU model name (H100 -> 90), as NCCL reads it from the device."""
    return int(_first_match(data_file()["gpu_sm"], model, data_file()["gpu_sm_default"]))


def cpu_class(model: str) -> str:
    """NCCL's CPU class (bdw, skl, srp, erp, amd, p9, arm) of a CPU model name."""
    return str(_first_match(data_file()["cpu_class"], model, data_file()["cpu_class_default"]))


def host_memory_of(model: str) -> float:
    """GB/s of a CPU's memory by its model name (the data file's ``host_memory`` rows: channels x MT/s x 8 B from
    the CPU's datasheet); 0 for a CPU the table does not know."""
    return float(_first_match(data_file()["host_memory"], model, 0.0))


def normalize_algo(name: str | None) -> str | None:
    """NCCL_ALGO spellings (Ring, NVLS, NVLSTree, CollNetDirect...) -> meshscale's names; None stays None."""
    if name is None:
        return None
    key = name.strip().lower().replace("-", "_")
    key = _ALGO_SPELLINGS.get(key.replace("_", ""), key)
    if key not in ALGORITHMS:
        raise MeshscaleError(f"unknown NCCL algorithm {name!r}; use one of {', '.join(ALGORITHMS)}")
    return key


def normalize_proto(name: str | None) -> str | None:
    """NCCL_PROTO spellings (ll, ll128, simple) -> LL, LL128, Simple; None stays None."""
    if name is None:
        return None
    for p in PROTOCOLS:
        if name.strip().lower() == p.lower():
            return p
    raise MeshscaleError(f"unknown NCCL protocol {name!r}; use one of {', '.join(PROTOCOLS)}")
