"""meshscale from Python: the few entry points a notebook needs.

    import meshscale
    system = meshscale.load_system("hgx-h200")             # or meshscale.discover() for this machine
    chosen = meshscale.plan(system, "all_reduce", 1 << 30)  # the schedule the model picks, and why
    sweep = meshscale.predict_collective(system, "all_reduce", [1 << 30])
    scaling = meshscale.predict_scaling(model="resnet50", system="hgx-h200", gpus=(1, 8))
    meshscale.write_report([sweep, scaling], "out")              # out/index.html

The names avoid the subpackages' (``meshscale.predict``, ``meshscale.report``, ``meshscale.simulate``), which
importing a submodule would rebind. Each function imports its layer when called, so ``import meshscale`` stays light (no torch, no matplotlib).
Bad input raises `meshscale.errors.MeshscaleError` with a one-line message.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshscale.results import Result
    from meshscale.simulate.plan import Plan
    from meshscale.topology.discover import Discovery
    from meshscale.topology.model import Topology

__version__ = "0.1.0"
__all__ = ["load_system", "discover", "plan", "predict_collective", "predict_scaling", "load_result", "write_report"]


def load_system(name_or_path: str | Path) -> "Topology":
    """A system of the catalog by name (``meshscale systems`` lists them, e.g. "hgx-h200", "dgx1-p100") or a
    topology YAML/JSON file."""
    from meshscale.topology.catalog import load_system as load
    return load(str(name_or_path))


def discover(workers: int | None = None) -> "Discovery":
    """This machine's topology (``.topology``) from NVML when NVIDIA GPUs are present, else ``workers`` CPU
    workers; ``.notice`` says what was assumed."""
    from meshscale.topology.discover import discover as find
    return find(workers)


def _topology(system: "str | Path | Topology") -> "Topology":
    return load_system(system) if isinstance(system, (str, Path)) else system


def _ranks(topo: "Topology", gpus: int | None) -> list[int]:
    """The first ``gpus`` devices of ``topo`` by index (all when None)."""
    from meshscale.errors import MeshscaleError
    indices = sorted(topo.nodes[d].index for d in topo.devices())
    if gpus is not None and not 1 <= gpus <= len(indices):
        raise MeshscaleError(f"{topo.name} has {len(indices)} devices; ask for 1 to {len(indices)}, not {gpus}")
    return indices[:gpus] if gpus else indices


def plan(system: "str | Path | Topology", collective: str, size_bytes: int, gpus: int | None = None,
         algorithm: str = "auto") -> "Plan":
    """The schedule of one collective of ``size_bytes`` on the first ``gpus`` devices of ``system`` (a name, a
    file or a `Topology`): the model's choice with ``algorithm`` "auto", its predicted time (``.result``), the
    link bound and the candidates it weighed. ``meshscale.simulate.plan.plan_result(p)`` makes it a Result."""
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.plan import plan as make_plan
    topo = _topology(system)
    return make_plan(Fabric(topo, algo=algorithm), collective, _ranks(topo, gpus), int(size_bytes))


def predict_collective(system: "str | Path | Topology", collective: str, sizes_bytes: list[int],
                       gpus: int | None = None, algorithm: str = "nccl") -> "Result":
    """Predicted time, algbw and busbw of a collective at each of ``sizes_bytes`` (a Result of kind "sim", one
    row per size), as NCCL would run it ("nccl") unless ``algorithm`` names meshscale's schedule ("auto", "ring",
    ...: the --algo vocabulary)."""
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.plan import sim_sweep
    topo = _topology(system)
    return sim_sweep(Fabric(topo, algo=algorithm), collective, _ranks(topo, gpus), [int(s) for s in sizes_bytes])


def predict_scaling(**request: Any) -> "Result":
    """Predicted training throughput, speedup and efficiency (a Result of kind "predict"). The keywords are
    `meshscale.predict.PredictRequest`'s fields: model, system, gpus (a tuple of GPU counts) or nodes, link,
    batch (per data-parallel rank) or global_batch, mode, framework, nccl_algo, compare, measured, ..."""
    from meshscale.predict import PredictRequest, predict_rows, prediction_result
    for key in ("gpus", "nodes"):
        if isinstance(request.get(key), int):
            request[key] = (request[key],)
    req = PredictRequest(**request)
    rows, info, _ = predict_rows(req)
    return prediction_result(rows, info, system=req.system)


def load_result(path: str | Path) -> "Result":
    """A result JSON file written by any meshscale command (``--json``), checked against its schema."""
    from meshscale.results import load_result as load
    return load(path)


def write_report(results: "list[Result | str | Path]", output_dir: str | Path, title: str = "meshscale report") -> Path:
    """Write ``output_dir/index.html`` from Results and/or result files and folders; returns the page's path."""
    from meshscale.report.parts import Source
    from meshscale.report.html import load_sources, write_report
    from meshscale.results import Result
    sources = []
    for k, item in enumerate(results):
        if isinstance(item, Result):
            label = str(item.meta.get("label") or item.meta.get("system") or item.kind)
            sources.append(Source(f"{label} #{k + 1}", item))
        else:
            sources += load_sources([item])
    return write_report(sources, output_dir, title)
