"""What healthy hardware reaches: the expected busbw of a collective at one size on one system, and where that
figure comes from. A measured healthy machine of the same GPU model and count (the corpus of nccl-tests runs)
is the better reference; otherwise NCCL's cost model, whose known error per size class (its geomean |error|
over the corpus) widens the tolerance."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from functools import lru_cache

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.predict.validate import SIZE_CLASSES, SMALL_BYTES, Measurement, load_corpus, validate_corpus
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology.catalog import load_system
from meshscale.topology.model import Topology

# Run-to-run spread of one healthy machine: repeated nccl-tests and bench runs on the same 2 H200 moved about
# 10 % from 1 MiB up and up to 50 % below, where a message takes tens of microseconds of launch and sync.
SPREAD = {"below 1 MiB": 0.50, "1 MiB and up": 0.15}
MODEL_MARGIN = 0.10  # beyond the model's geomean |error|: a row may sit somewhat further off than the typical one


@dataclass(frozen=True)
class Expected:
    """Expected busbw and the lowest share of it a healthy run reaches (``floor``); ``source`` says where the
    figure came from, ``basis`` is "corpus" or "model"."""

    busbw_bytes_per_s: float
    floor: float
    source: str
    basis: str
    error: float | None = None  # the model's known geomean |error| here (model figures only)


def size_class(size_bytes: int) -> str:
    return SIZE_CLASSES[size_bytes >= SMALL_BYTES]


def _family(model: str) -> str | None:
    """The GPU family a model name belongs to (H200, A100 PCIe, ...): NVML and the catalog spell names
    differently ("NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB"), the family is what both share."""
    upper = model.upper()
    found = re.search(r"\b[A-Z]{1,2}\d{2,3}[A-Z]?\b", upper.replace("-", " "))
    if not found:
        return None
    return found.group(0) + (" PCIE" if "PCIE" in upper else "")


@lru_cache(maxsize=None)
def _corpus() -> tuple[tuple[Measurement, str | None], ...]:
    """The corpus rows that ran NCCL's own choice (nothing forced), each with its system's GPU family."""
    rows = [m for m in load_corpus() if not m.algo and not m.proto]
    families = {s: _family(load_system(s).gpu_model) for s in {m.system for m in rows}}
    return tuple((m, families[m.system]) for m in rows)


@lru_cache(maxsize=None)
def model_error(family: str | None, size_class_name: str) -> tuple[float, str]:
    """The model's geomean |error| for a size class over the corpus rows of this GPU family (all rows when
    the corpus has none of it), and what it was measured over."""
    systems = sorted({m.system for m, f in _corpus() if f is not None and f == family})
    summary = validate_corpus().meta["summary"]
    for entry in summary["breakdown"]:
        if systems and entry["system"] == systems[0] and entry["size_class"] == size_class_name:
            return entry["geomean_abs_error"], f"{entry['rows']} corpus rows of {systems[0]}"
    whole = summary["groups"][size_class_name]
    return whole["geomean_abs_error"], f"{whole['rows']} corpus rows"


def corpus_expected(gpu_model: str, gpus: int, collective: str, size_bytes: int, inplace: bool) -> Expected | None:
    """The corpus figure of a healthy machine with the same GPU family and count, this collective and size:
    the median busbw of its rows, in-place or out-of-place as measured (either when only one was), NVLS off
    preferred (meshscale runs NCCL with NVLS off)."""
    family = _family(gpu_model)
    if family is None:
        return None
    rows = [m for m, f in _corpus() if f == family and m.gpus == gpus and m.nodes == 1
            and m.collective == collective and m.size_bytes == size_bytes]
    for prefer in (lambda m: m.nvls != "on", lambda m: m.inplace == inplace):
        rows = [m for m in rows if prefer(m)] or rows
    if not rows:
        return None
    factor = kind(collective).busbw_factor(gpus)
    busbw = {m: size_bytes * factor / m.time_s for m in rows}
    median = statistics.median(busbw.values())
    nearest = min(rows, key=lambda m: abs(busbw[m] - median))
    sources = len({m.source for m in rows})
    also = f" and {sources - 1} more" if sources > 1 else ""
    return Expected(median, 1 - SPREAD[size_class(size_bytes)],
                    f"nccl-tests, {gpus}x {family.title()}, {nearest.source}{also}", "corpus")


def model_expected(topology: Topology, gpus: int, collective: str, size_bytes: int) -> Expected | None:
    """NCCL's cost model on this topology (NVLS off), with the floor its known error for the size class allows."""
    ranks = [topology.nodes[d].index for d in topology.gpus()[:gpus]]
    if topology.device_kind != "gpu" or len(ranks) < gpus or gpus < 2:
        return None
    try:
        predicted = Fabric(topology, nccl=NcclSettings(nvls=False)).cost(Call(collective, size_bytes, tuple(ranks)))
    except MeshscaleError:
        return None
    if not (predicted.busbw_bytes_per_s and math.isfinite(predicted.busbw_bytes_per_s)):
        return None
    name = size_class(size_bytes)
    error, over = model_error(_family(topology.gpu_model), name)
    floor = min(1 - SPREAD[name], 1 / (1 + error + MODEL_MARGIN))
    return Expected(predicted.busbw_bytes_per_s, floor,
                    f"NCCL cost model on {topology.name} (known error {error:.0%} {name}, over {over})", "model",
                    error)


def references(topology: Topology | None, gpu_model: str, gpus: int, collective: str, size_bytes: int,
               inplace: bool) -> tuple[Expected | None, Expected | None]:
    """(the corpus figure, the model's prediction) for one measured row; either may be None."""
    model = model_expected(topology, gpus, collective, size_bytes) if topology is not None else None
    return corpus_expected(gpu_model, gpus, collective, size_bytes, inplace), model
