"""`meshscale tour`: characterise this machine end to end and write a report directory.

Stages run in order (discover, bench p2p, bench collective, scale, simulate, predict), each saving its JSON
into the directory as soon as it finishes; the report is written at the end from whatever exists, so Ctrl-C or
a failing stage still leaves a page. A stage that cannot run on this machine says why in one line and is skipped.
On one GPU there is nothing to exchange: the tour measures host<->device copies and the single-GPU training
profile instead, and predicts from that profile the systems built from this GPU (marked predicted).
"""
from __future__ import annotations

import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from meshscale.bench.collective import CollectiveSpec, bench_collectives
from meshscale.bench.host_copy import host_copy
from meshscale.bench.p2p import P2PSpec, bench_p2p
from meshscale.collectives.kinds import KINDS
from meshscale.errors import MeshscaleError
from meshscale.execute.launcher import NCCL_SAFETY_ENV
from meshscale.safe_io import atomic_write
from meshscale.execute.world import resolve_world
from meshscale.predict.question import PredictRequest
from meshscale.predict.sweep import prediction_result, predict_rows, scale_beside
from meshscale.predict.validate import validate_run
from meshscale.predict.whitepaper import reproduce
from meshscale.app.doctor import run_doctor
from meshscale.report.parts import Source
from meshscale.report.html import render, write_report
from meshscale.results import Result, measured
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import resolve_fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology import subset, to_dict
from meshscale.topology.shipped import load_catalog
from meshscale.topology.discover import discover
from meshscale.train.config import SpeedOptions, TrainConfig
from meshscale.train.runner import profile as train_profile
from meshscale.train.scale import scale
from meshscale.units import parse_bytes, sweep_sizes

COLLECTIVES = [k.name for k in KINDS if k.headline]


# How long the default tour takes in all: a minute on one to eight GPUs, half a minute on CPU workers; its scale
# stage runs the configurations that fit in what is left (--full runs them all, --fast is the tests' smoke run)
TOUR_BUDGET_S = {"gpu": 60.0, "cpu": 30.0}
# What the stages after the scale stage and the page take: sim and predict, then the report's figures (measured
# on the 2-core CPU host, under load: 4-6 s; a GPU host's page has fewer of them and a faster host)
AFTER_SCALE_S = 6.0


@dataclass
class TourSettings:
    """How long a tour runs: default (within `TOUR_BUDGET_S`), ``full`` (nccl-tests-length sweeps, every scale
    run) or ``fast`` (tests: the smallest sizes)."""

    full: bool = False
    fast: bool = False
    cpus: int | None = None  # CPU worker ranks when there is no GPU
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.full and self.fast:
            raise MeshscaleError("--fast and --full ask for opposite lengths of tour; give one of them")


@dataclass
class TourState:
    """What the stages share: settings, the ranks chosen, the results so far (by file stem) and notes."""

    settings: TourSettings
    out_dir: Path
    world: Any = None
    topology: Any = None
    results: dict[str, Result] = field(default_factory=dict)
    sim_params: Any = None  # simulator parameters calibrated from bench p2p (sim stage)
    notes: list[str] = field(default_factory=list)
    started_s: float = field(default_factory=time.monotonic)

    @property
    def budget_s(self) -> float | None:
        """The whole tour's time (`TOUR_BUDGET_S`), or None: --full and --fast run every stage to its end."""
        s = self.settings
        return None if s.full or s.fast else TOUR_BUDGET_S["gpu" if self.gpu else "cpu"]

    def time_left_s(self) -> float | None:
        """What the budget leaves now for the scale stage (the stages after it and the page kept aside)."""
        budget = self.budget_s
        return None if budget is None else budget - (time.monotonic() - self.started_s) - AFTER_SCALE_S

    @property
    def gpu(self) -> bool:
        return self.world is not None and self.world.backend == "nccl"

    @property
    def one_gpu(self) -> bool:
        return self.gpu and self.world.size == 1


class Skipped(Exception):
    """This stage cannot run on this machine; the message says why (e.g. "needs two ranks")."""


@dataclass
class Stage:
    name: str
    title: str
    estimate_s: Callable[[TourState], float]
    run: Callable[[TourState], dict[str, Result]]
    applies: Callable[[TourState], bool] = lambda state: True  # a stage for other machines is left out silently


@dataclass
class StageOutcome:
    name: str
    status: str  # done, skipped, failed, interrupted, not run
    seconds: float
    note: str = ""


@dataclass
class TourOutcome:
    index: Path
    stages: list[StageOutcome]
    interrupted: bool = False


# ---- stages ------------------------------------------------------------------------------------------------
def discover_stage(state: TourState) -> dict[str, Result]:
    state.world = resolve_world(None, state.settings.cpus)  # all GPUs over NCCL, else CPU workers over Gloo
    found = discover(state.world.size if state.world.backend == "gloo" else None)
    topo = found.topology
    if len(topo.devices()) > state.world.size:
        topo = subset(topo, [topo.nodes[d].index for d in topo.devices()[: state.world.size]])
    state.topology = topo
    if found.notice:
        state.notes.insert(0, found.notice)
    return {"topology": measured("topology", [], topology=to_dict(topo), notice=found.notice)}


def doctor_stage(state: TourState) -> dict[str, Result]:
    """`meshscale doctor`'s checks, so the shared page carries the driver, links, knobs and versions."""
    return {"doctor": measured("doctor", [vars(c) for c in run_doctor()])}


def _needs_two_ranks(state: TourState, what: str) -> None:
    if state.world.size < 2:
        raise Skipped(f"one GPU, {what}" if state.gpu else "needs two ranks")


def p2p_stage(state: TourState) -> dict[str, Result]:
    _needs_two_ranks(state, "no peer to copy to (host<->device copies are measured on their own)")
    s = state.settings
    size = "64M" if s.full else ("256K" if s.fast else ("4M" if not state.gpu else "256M"))
    spec = P2PSpec(size_bytes=parse_bytes(size), iters=3, warmup_iters=1, latency_iters=10) if s.fast else \
        P2PSpec(size_bytes=parse_bytes(size), iters=20 if s.full else 10) if s.full or state.gpu else \
        P2PSpec(size_bytes=parse_bytes(size), iters=5, warmup_iters=1, latency_iters=20)  # CPU workers: seconds
    return {"p2p": bench_p2p(spec, state.world, s.timeout_s)}


def collective_stage(state: TourState) -> dict[str, Result]:
    _needs_two_ranks(state, "nothing to exchange")
    s, n = state.settings, state.world.size
    collectives = COLLECTIVES[:2] if s.fast else COLLECTIVES
    if s.fast:
        sizes, iters = sweep_sizes("4K", "256K", 64), 3
    elif s.full:
        sizes, iters = (sweep_sizes("8K", "4G", 2), 20) if state.gpu else (sweep_sizes("1K", "64M", 2), 10)
    else:
        # a size per factor of 8 (nccl-tests' range from the latency-bound to the bandwidth-bound end); --full: 2
        sizes, iters = (sweep_sizes("256K", "1G", 8), 20) if state.gpu else (sweep_sizes("4K", "1M", 4), 5)
    unit = 4 * n * 8  # every size must split into n float32 chunks
    sizes = sorted({max(unit, size // unit * unit) for size in sizes})
    spec = CollectiveSpec(collectives=list(collectives), sizes_bytes=sizes, places=("out", "in"), warmup_iters=2 if s.fast else 5,
                          iters=iters)
    return {"collective": bench_collectives(spec, state.world, s.timeout_s)}


def scale_stage(state: TourState) -> dict[str, Result]:
    """Weak and strong scaling of a model sized to the hardware (small CNN on CPU workers, ResNet-50 on
    GPUs) over 1, 2, 4 ... ranks, as one "scale" result with mode weak / strong. Each configuration is a fresh set
    of processes; the default tour runs those that fit in the time left (`_scale_plan`'s order: the one-rank
    baseline and the most ranks first), the rest are named in a note. Each row's samples/s is its global batch over
    its median step, so that its throughput, speedup and efficiency agree with the step time beside them."""
    _needs_two_ranks(state, "no scaling to measure (the single-GPU profile times it)")
    cfg, batch = _train_config(state)
    worlds = _world_sizes(state.world.size)
    step = math.lcm(*worlds)
    global_batch = -(-batch * max(worlds) // step) * step  # every world size must divide it
    plan = _scale_plan(worlds, weak_only=state.settings.fast)
    rows, runs_s, left_out, dropped = [], [], [], set()
    for k, (weak, world) in enumerate(plan):
        left = state.time_left_s()
        # weak scaling's one rank and most ranks always run (the least that measures scaling); a later mode's
        # baseline only with room for its most ranks too, since one world size alone scales nothing
        need = [world] + ([worlds[-1]] if world == worlds[0] else [])
        if weak in dropped or k >= 2 and left is not None and \
                sum(_run_estimate_s(runs_s, w, state.gpu) for w in need) > left:
            left_out.append(f"{'weak' if weak else 'strong'} on {world}")
            if world == worlds[0]:
                dropped.add(weak)
            continue
        started = time.monotonic()
        part = scale(cfg, [world], weak, batch if weak else global_batch)
        runs_s.append((world, time.monotonic() - started))
        # the sweep's rows name the exchange (ddp) in "mode"; the report keys scaling rows by weak/strong
        rows += [dict(r, mode="weak" if weak else "strong", exchange_mode=r.get("mode")) for r in part.rows]
    if left_out:
        state.notes.append(f"scale: {len(left_out)} of {len(plan)} runs left out to keep the tour within "
                           f"{state.budget_s:.0f} s ({', '.join(left_out)}); `meshscale tour --full` runs them all")
    return {"scale": measured("scale", consistent_rows(rows), model=cfg.model, device=cfg.device,
                              batch_per_rank=batch, global_batch=global_batch, steps=cfg.steps,
                              backend=state.world.backend, throughput="global batch / median step")}


def _scale_plan(worlds: list[int], weak_only: bool = False) -> list[tuple[bool, int]]:
    """(weak, world size) of each run, in the order a short tour keeps them: per mode (weak first) the one-rank
    baseline, then the most ranks, then those between."""
    order = [worlds[0], worlds[-1], *worlds[1:-1]] if len(worlds) > 1 else worlds
    return [(weak, w) for weak in ((True,) if weak_only else (True, False)) for w in order]


def _run_estimate_s(runs_s: list[tuple[int, float]], world: int, gpu: bool) -> float:
    """A run's time, from the runs so far: the slowest of them; on CPU workers, which share the host's cores,
    scaled up by the ranks it adds over that run's."""
    ranks, seconds = max(runs_s, key=lambda r: r[1])
    return seconds if gpu else seconds * max(1.0, world / ranks)


def consistent_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scale rows whose samples/s is their global batch over their median step (the window's figure kept as
    ``window_samples_per_s``), with each mode's speedup over its one-rank row (else its smallest) and the
    efficiency recomputed from it: a run whose window held a stall the median step does not no longer reads as
    a super-linear speedup of the others."""
    out = []
    for r in rows:
        r = dict(r, window_samples_per_s=r.get("throughput_samples_per_s"))
        if r.get("step_time_s") and r.get("global_batch"):
            r["throughput_samples_per_s"] = r["global_batch"] / r["step_time_s"]
        out.append(r)
    for mode in {r["mode"] for r in out}:
        part = [r for r in out if r["mode"] == mode and r.get("throughput_samples_per_s")]
        if not part:
            continue
        base = min(part, key=lambda r: r["world_size"])
        for r in part:
            r["speedup"] = r["throughput_samples_per_s"] / base["throughput_samples_per_s"] * base["world_size"]
            r["efficiency"] = r["speedup"] / r["world_size"]
    return out


def _train_config(state: TourState) -> tuple[TrainConfig, int]:
    """The training run the tour times, sized to the hardware, and its batch per rank."""
    s = state.settings
    # CPU workers: a short run (a step of the small CNN takes milliseconds; the run is mostly its processes' start)
    steps, warmup = (4, 2) if s.fast else ((40, 10) if s.full else ((12, 4) if state.gpu else (8, 3)))
    # bf16 where the GPU has bf16 rates: how a GPU of that generation trains (fp32 would time a run nobody does)
    bf16 = state.gpu and bool(_gpu_attrs(state).get("bf16_flops"))
    cfg = TrainConfig(model="resnet50" if state.gpu else "small-cnn", device="cuda" if state.gpu else "cpu",
                      steps=steps, timing_warmup=warmup, timeout_s=s.timeout_s,
                      speed=SpeedOptions(precision="bf16" if bf16 else "fp32"))
    return cfg, 64 if state.gpu else 16


def _gpu_attrs(state: TourState) -> dict[str, Any]:
    """The first GPU's attributes (model, peak rates, CPU affinity), or {} without one."""
    gpus = state.topology.gpus() if state.topology is not None else []
    return state.topology.nodes[gpus[0]].attrs if gpus else {}


def host_copy_stage(state: TourState) -> dict[str, Result]:
    """Host<->device copies of one GPU, pinned and pageable (with two or more, bench p2p has the pinned ones)."""
    from meshscale.bench.host_copy import parse_cpu_list
    cpus = parse_cpu_list(_gpu_attrs(state).get("cpu_affinity"))
    if state.settings.fast:  # a smoke test: small copies, one sample
        return {"host-copy": host_copy(16 << 20, iters=4, warmup_iters=1, samples=1, cpus=cpus)}
    return {"host-copy": host_copy(cpus=cpus)}  # nvbandwidth's size, copies and samples


def profile_stage(state: TourState) -> dict[str, Result]:
    """The single-GPU training profile (`meshscale train --profile-batches`): step time per batch size."""
    cfg, batch = _train_config(state)
    # two sizes fix the line the predictor takes through them (a fixed cost per step plus a cost per sample); each
    # size costs a warm-up and cuDNN's search of its shapes, so the full tour alone adds a third point
    batches = [batch // 2, batch, 2 * batch] if state.settings.full else [batch // 2, batch]
    return {"profile": train_profile(cfg, batches)}


def _world_sizes(n: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 <= n:
        sizes.append(sizes[-1] * 2)
    return sizes + ([n] if sizes[-1] != n else [])


def sim_stage(state: TourState) -> dict[str, Result]:
    """The model's prediction of every collective and size the sweep measured, as a "sim" result: on GPUs NCCL's
    cost model (what NCCL picks, NVLS off as meshscale runs NCCL), on CPU workers the fastest schedule by flow
    simulation; calibrated from this run's bench p2p when it ran. With a measured sweep, also the model's
    error against it ("validate", as `meshscale validate` reports the corpus)."""
    ranks = [state.topology.nodes[d].index for d in state.topology.devices()]
    if len(ranks) < 2:
        raise Skipped("one GPU, no collective to predict" if state.gpu else "needs two ranks")
    # meshscale starts NCCL with NVLink SHARP off (NCCL_SAFETY_ENV): predict what was measured
    nccl = NcclSettings(nvls=NCCL_SAFETY_ENV["NCCL_NVLS_ENABLE"] != "0") if state.topology.device_kind == "gpu" else None
    p2p = state.results.get("p2p")
    try:  # the machine as discovered, calibrated as sim takes --p2p
        fabric = resolve_fabric(state.topology, p2p=p2p, nccl=nccl)
    except MeshscaleError as exc:
        state.notes.append(f"simulator calibration from bench p2p failed ({exc}); default link efficiencies used")
        fabric = resolve_fabric(state.topology, nccl=nccl)
    if p2p is None:
        state.notes.append("simulator predictions use default link efficiencies (no bench p2p to calibrate from)")
    params = fabric.params
    measured_rows = state.results["collective"].rows if "collective" in state.results else []
    sizes = sorted({r["size_bytes"] for r in measured_rows}) or [1 << k for k in range(12, 23, 2)]
    rows = []
    for collective in sorted({r["collective"] for r in measured_rows}) or COLLECTIVES:
        for size in sizes:
            r = fabric.cost(Call(collective, size, tuple(ranks)))
            rows.append({"collective": collective, "size_bytes": size, "time_s": r.time_s,
                         "algbw_bytes_per_s": r.algbw_bytes_per_s, "busbw_bytes_per_s": r.busbw_bytes_per_s,
                         "algorithm": r.detail})
    state.sim_params = params
    meta = {"system": state.topology.name, "label": "simulator", "ranks": ranks,
            "params": params.source if params else "defaults"}
    sim = Result("sim", rows, True, meta)
    if "collective" not in state.results:
        return {"sim": sim}
    return {"sim": sim, "validate": validate_run(state.results["collective"], sim)}


def whitepaper_results() -> dict[str, Result]:
    """Figures 5 and 6 of the NVIDIA DGX-1 System Architecture whitepaper (ResNet-50 on 8 P100: DGX-1 NVLink vs
    a PCIe server, as NVIDIA measured them, 1-GPU bar about 200 img/s) and meshscale's prediction of the same
    bars, as two scaling results."""
    names = ("DGX-1 NVLink", "PCIe server")
    one_gpu = 200.0  # both figures imply about 200 img/s on one P100
    published, predicted = [], []
    for mode in ("weak", "strong"):
        figure = reproduce(mode)
        for rows, values in ((published, figure.measured), (predicted, figure.predicted)):
            for name, value in zip(names, values):
                rows.append({"world_size": 1, "mode": mode, "system": name, "throughput_samples_per_s": one_gpu,
                             "speedup": 1.0, "efficiency": 1.0})
                rows.append({"world_size": 8, "mode": mode, "system": name, "throughput_samples_per_s": value,
                             "speedup": value / one_gpu, "efficiency": value / one_gpu / 8})
    group = "DGX-1 whitepaper reference: ResNet-50 on 8 P100"
    return {"whitepaper": Result("scale", published, False, {"group": group, "label": "whitepaper",
                                                             "source": "NVIDIA DGX-1 whitepaper, figures 5 and 6"}),
            "whitepaper-predicted": Result("predict", predicted, True, {"group": group, "label": "meshscale",
                                                                       "source": "meshscale's model: the CNTK 2016 framework profile and "
                                                                                 "NCCL 1.6's cost model"})}


def machine_prediction(scale: Result, topo: Any, params: Any = None) -> Result:
    """meshscale's prediction of this machine's scale run, point by point: the compute profile is the run's own
    1-rank steps, the exchange is simulated on ``topo`` (with ``params`` calibrated from bench p2p)."""
    rows, info = scale_beside(scale, topo, params)
    model = info.model
    out = []
    for mode in sorted({r["mode"] for r in rows}):
        part = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["world_size"])
        base = part[0]
        for r in part:
            speedup = r["predicted_samples_per_s"] / base["predicted_samples_per_s"] * base["world_size"]
            out.append({"world_size": r["world_size"], "mode": mode, "batch_per_rank": r["batch_per_rank"],
                        "global_batch": r["global_batch"], "throughput_samples_per_s": r["predicted_samples_per_s"],
                        "speedup": speedup, "efficiency": speedup / r["world_size"], "error": r["error"]})
    return Result("predict", out, True, {"model": model, "system": topo.name, "label": "meshscale",
                                         "group": "this machine", "params": getattr(params, "source", "defaults")})


SMALL_CLUSTER_NODES = (1, 2, 4)
SMALL_CLUSTER_LINK = "ndr"


def systems_of(gpu: dict[str, Any]) -> str | None:
    """The catalog's NVSwitch system of a GPU's generation (its own model first), else any system of that
    generation; None when the catalog has none."""
    generation = gpu.get("nvlink_generation")
    candidates = []
    for topo in load_catalog():
        devices = topo.gpus()
        attrs = topo.nodes[devices[0]].attrs if devices else {}
        if (generation is not None and attrs.get("nvlink_generation") == generation) or attrs.get("model") == gpu.get("model"):
            # a board before a rack of many hosts: the tour predicts 1 to 8 GPUs and a small cluster of the system
            candidates.append((attrs.get("model") != gpu.get("model"), not topo.nodes_of("nvswitch"),
                               len(topo.gpus()) > 8, topo.name))
    return min(candidates)[-1] if candidates else None


def built_from_this_gpu(state: TourState) -> dict[str, Result]:
    """What this GPU would do in the systems built from it, predicted from its own profile: the catalog's
    NVSwitch system of its generation (1 to 8 GPUs) and a small InfiniBand cluster of those nodes."""
    gpu = state.topology.nodes[state.topology.gpus()[0]].attrs
    system = systems_of(gpu)
    if system is None:
        raise MeshscaleError(f"the catalog has no system of {gpu.get('model')}'s generation to predict")
    model = state.results["profile"].meta["model"]
    _, batch = _train_config(state)
    group = f"predicted from this {gpu.get('model', 'GPU')}'s profile"
    out = {}
    for name, extra, label in (("predict-system", {"gpus": (1, 2, 4, 8)}, system),
                               ("predict-cluster", {"nodes": SMALL_CLUSTER_NODES},
                                f"{max(SMALL_CLUSTER_NODES)}x {system}, {SMALL_CLUSTER_LINK.upper()} InfiniBand")):
        req = PredictRequest(model=model, system=system, link=SMALL_CLUSTER_LINK, batch=batch,
                             profile=state.out_dir / "profile.json", **extra)
        rows, job, _ = predict_rows(req)
        out[name] = prediction_result([dict(r, mode="weak") for r in rows], job, system=label, label="predicted",
                                      group=f"{group}: {label}", predicted_from=gpu.get("model"))
    return out


def predict_stage(state: TourState) -> dict[str, Result]:
    """The DGX-1 whitepaper comparison, and this machine's scale run predicted beside itself; on one GPU, the
    systems built from it predicted from its profile."""
    # on a GPU machine only this machine and what is predicted from it; without one, the DGX-1 reference shows
    # what GPUs would do
    out = {} if state.gpu else whitepaper_results()
    if state.one_gpu and "profile" in state.results:
        try:
            out.update(built_from_this_gpu(state))
        except MeshscaleError as exc:
            state.notes.append(f"predictions of systems built from this GPU are skipped: {exc}")
    if "scale" in state.results:
        try:
            out["predict"] = machine_prediction(state.results["scale"], state.topology, state.sim_params)
        except MeshscaleError as exc:
            state.notes.append(f"this machine's scaling prediction is skipped: {exc}")
    return out


STAGES = (
    Stage("discover", "discover the topology", lambda s: 2, discover_stage),
    Stage("doctor", "doctor checks", lambda s: 1, doctor_stage),
    Stage("p2p", "bench p2p", lambda s: 20 if s.settings.full else 10, p2p_stage),
    Stage("collective", "bench collective sweep", lambda s: (300 if s.gpu else 120) if s.settings.full else (60 if s.gpu else 20),
          collective_stage),
    Stage("host-copy", "host<->device copies", lambda s: 5, host_copy_stage, lambda s: s.one_gpu),
    Stage("scale", "scale run (weak and strong)", lambda s: 180 if s.settings.full else (90 if s.gpu else 60), scale_stage),
    Stage("profile", "single-GPU training profile", lambda s: 20 if s.settings.fast else 40, profile_stage,
          lambda s: s.one_gpu),
    Stage("sim", "model predictions and their error", lambda s: 5, sim_stage),
    Stage("predict", "scaling predictions and the DGX-1 reference", lambda s: 5, predict_stage),
)


# ---- running ----------------------------------------------------------------------------------------------
def run_tour(out_dir: str | Path, settings: TourSettings | None = None, stages: tuple[Stage, ...] = STAGES,
             console: Console | None = None) -> TourOutcome:
    """Run every stage, save each result as ``out_dir/<name>.json``, then write ``out_dir/index.html``.
    Ctrl-C stops the stage that runs and keeps what finished."""
    settings = settings or TourSettings()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = TourState(settings, out)
    console = console or Console(stderr=True)
    outcomes: list[StageOutcome] = []
    interrupted = False
    sigint = _SigintFlag()
    with sigint, Progress(TextColumn("{task.description:<44}"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[eta]}"), console=console, transient=False) as progress:
        overall = progress.add_task("tour", total=len(stages), eta="")
        spent = estimated = 0.0
        for i, stage in enumerate(stages):
            if state.world is not None and not stage.applies(state):
                progress.advance(overall)
                continue
            if interrupted:
                outcomes.append(StageOutcome(stage.name, "not run", 0.0, "interrupted before it started"))
                continue
            estimate = stage.estimate_s(state)
            # time left: the estimates still to come, scaled by how the finished stages compared with theirs
            left = sum(s.estimate_s(state) for s in stages[i:]) * (spent / estimated if estimated else 1.0)
            progress.update(overall, eta=f"about {left:.0f} s left")
            task = progress.add_task(f"  {stage.title}", total=estimate, eta="")
            outcome = _run_stage(stage, state, progress, task, estimate)
            if sigint.seen and outcome.status != "interrupted":
                # Ctrl-C also reaches the ranks, whose failure can arrive first and look like an ordinary one
                outcome = StageOutcome(stage.name, "interrupted", outcome.seconds, _INTERRUPTED)
            progress.update(task, completed=estimate)
            outcomes.append(outcome)
            spent += outcome.seconds
            estimated += estimate
            progress.advance(overall)
            interrupted = outcome.status == "interrupted"
        progress.update(overall, eta="")
    notes = list(state.notes)
    for o in outcomes:
        if o.status == "skipped":
            notes.append(f"{o.name}: {o.note}; skipped")
        elif o.status != "done":
            notes.append(f"{o.name}: {o.status} — {o.note}")
    rows = [vars(o) for o in outcomes]
    tour = measured("tour", rows, settings=vars(settings), notes=notes)
    tour.save(out / "tour.json")
    sources = [Source(name, result) for name, result in state.results.items()]
    heading = ("meshscale tour: " + (f"{state.world.size} GPU{'s' if state.world.size > 1 else ''}" if state.gpu else
               f"no GPU — {state.world.size} CPU workers over Gloo" if state.world else "this machine"))
    index = write_report(sources, out, heading, notes) if sources else _empty_report(out, heading, notes)
    return TourOutcome(index, outcomes, interrupted)


def _run_stage(stage: Stage, state: TourState, progress: Progress, task: Any, estimate: float) -> StageOutcome:
    start = time.monotonic()
    stop = threading.Event()

    def tick() -> None:  # the stage blocks; creep the bar toward its estimate meanwhile
        while not stop.wait(0.25):
            progress.update(task, completed=min(0.95 * estimate, time.monotonic() - start))

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        results = stage.run(state)
        for name, result in results.items():
            result.save(state.out_dir / f"{name}.json")
            state.results[name] = result
        status, note = "done", ""
    except Skipped as exc:
        status, note = "skipped", str(exc)
    except KeyboardInterrupt:
        status, note = "interrupted", _INTERRUPTED
    except MeshscaleError as exc:
        status, note = ("interrupted", _INTERRUPTED) if "interrupted" in str(exc) else ("failed", str(exc))
    except Exception as exc:  # a bug in one stage must not cost the others their report
        status, note = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        ticker.join()
        _release_gpu_cache()
    return StageOutcome(stage.name, status, time.monotonic() - start, note)


_INTERRUPTED = "Ctrl-C; the report shows the stages that finished"


class _SigintFlag:
    """While active, remembers that Ctrl-C was pressed (then raises KeyboardInterrupt as usual)."""

    seen = False

    def __enter__(self) -> "_SigintFlag":
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum: int, frame: Any) -> None:
                self.seen = True
                signal.default_int_handler(signum, frame)
            self._previous = signal.signal(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _release_gpu_cache() -> None:
    """Stages that ran on GPUs in this process (bench p2p) leave cached blocks; later ranks want the memory."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _empty_report(out: Path, heading: str, notes: list[str]) -> Path:
    page = out / "index.html"
    return atomic_write(page, render([], heading, notes))
