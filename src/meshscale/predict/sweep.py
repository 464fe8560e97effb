"""Scaling as `meshscale predict` and `scale` show it: the one step model (`request.Prepared.at`) evaluated at
each GPU or node count, for each compared variant, with speedup and efficiency against one GPU; or beside a
measured `scale` run, point by point, with the error.

Weak scaling keeps the batch per data-parallel rank (``--batch``); strong scaling splits a global batch
(``--global-batch``) over the ranks. Speedup is against one GPU at the same batch per rank (weak) or the same
global batch (strong); efficiency = speedup / GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshscale.errors import MeshscaleError
from meshscale.predict.frameworks import PREDICTED_MODES
from meshscale.predict.request import COMPARE_KINDS, COMPARE_PRESETS, PredictRequest, Prepared, prepare, where_on
from meshscale.predict.training.measured import compute_source
from meshscale.predict.training.step import TrainingPrediction
from meshscale.results import Result, load_result

NCCL_ALGOS_COMPARED = {"nccl": None, "ring": "ring", "tree": "tree"}


@dataclass
class SweepInfo:
    """What a sweep assumed (a Result's meta): the model, the batch, the exchange, where the compute came from."""

    model: str
    batch: int
    weak: bool
    algorithm: str
    mode: str
    framework: str
    framework_source: str
    compute_source: str
    network_source: str = ""
    notes: list[str] = field(default_factory=list)
    network: dict = field(default_factory=dict)   # a sweep over nodes: the network between them


def per_rank_batch(world_size: int, batch: int, weak: bool) -> int:
    """The per-rank batch: ``batch`` itself (weak scaling) or the global ``batch`` split evenly (strong)."""
    if weak:
        return batch
    if batch % world_size:
        raise MeshscaleError(f"global batch {batch} does not split evenly over {world_size} GPUs; "
                             "choose a batch divisible by every GPU count, or use --weak")
    return batch // world_size


def sweep_row(p: TrainingPrediction, baseline_samples_per_s: float, weak: bool) -> dict:
    """One size as `meshscale scale` writes it: throughput, speedup against ``baseline_samples_per_s``,
    efficiency, and the step's compute and communication (total and exposed)."""
    exposed = p.tp_s + p.cp_s + p.pp_s + p.sharding_s + p.replica_s
    speedup = p.samples_per_s / baseline_samples_per_s
    return {"world_size": p.allocation.world_size, "nodes": p.allocation.nodes, "mode": "weak" if weak else "strong",
            "batch_per_rank": p.job.batch, "global_batch": p.job.samples_per_step, "step_time_s": p.step_s,
            "compute_s": p.compute_s, "comm_s": p.exchange_s or exposed, "comm_exposed_s": exposed,
            "throughput_samples_per_s": p.samples_per_s, "speedup": speedup, "efficiency": speedup / p.allocation.world_size,
            "comm_share": exposed / p.step_s, "nccl_algo": p.nccl_algo, "layout": p.job.layout.describe()}


def sweep(prepared: Prepared, counts: list[int], by_nodes: bool) -> list[dict]:
    """Rows for each GPU count (or node count) of ``prepared``'s request."""
    req = prepared.req
    amount = prepared.job.batch if req.weak else req.global_batch
    base = prepared.at(prepared.allocation(gpus=1), amount)
    rows = []
    for n in counts:
        allocation = prepared.allocation(nodes=n) if by_nodes else prepared.allocation(gpus=n)
        p = prepared.at(allocation, per_rank_batch(allocation.world_size, amount, req.weak))
        rows.append(dict(sweep_row(p, base.samples_per_s, req.weak), system=prepared.where.node_system,
                         **(_network(prepared.where) if by_nodes else {})))
    return rows


def _variants(req: PredictRequest) -> tuple[list[str], str]:
    if not req.compare:
        return [req.system], "system"
    return list(COMPARE_PRESETS.get(req.compare) or req.compare.split(",")), COMPARE_KINDS.get(req.compare, "system")


def _prepared_variant(req: PredictRequest, variant: str, kind: str) -> Prepared:
    """The request as one compared variant: another system or link, another framework, mode or NCCL
    algorithm."""
    if kind == "system":
        return prepare(req, system=variant)
    if kind == "link":
        return prepare(req, link=variant)
    if kind == "framework":
        return prepare(req, exchange=(None, variant))
    if variant in PREDICTED_MODES:
        return prepare(req, exchange=(variant, None))
    if variant not in NCCL_ALGOS_COMPARED:
        raise MeshscaleError(f"--compare {variant}: compare modes ({', '.join(PREDICTED_MODES)}) or NCCL's algorithms "
                             f"({', '.join(NCCL_ALGOS_COMPARED)})")
    if req.mode == "ps-sync":
        raise MeshscaleError(f"--compare with algorithm {variant} compares all-reduces; use --mode ddp or allreduce")
    return prepare(req, nccl_algo=NCCL_ALGOS_COMPARED[variant] or "")


def predict_rows(req: PredictRequest, prepared: Prepared | None = None
                 ) -> tuple[list[dict], SweepInfo, Result | None]:
    """Rows (one per variant and GPU/node count; with ``measured``, one per measured row with its error), what
    the last variant assumed, and the measured result if any (``prepared``: the request resolved already, when
    it compares nothing)."""
    measured = load_result(req.measured) if req.measured else None
    variants, kind = _variants(req)
    rows: list[dict] = []
    for variant in variants:
        if prepared is None or req.compare:
            prepared = _prepared_variant(req, variant, kind)
        if measured is not None:
            found = compare_scale(measured, prepared)
        elif req.nodes or prepared.where.max_nodes:
            found = sweep(prepared, list(req.nodes or _powers_to(prepared.where.max_nodes)), True)
        else:   # default: powers of two up to one node
            per_node = prepared.where.gpus_per_node
            found = sweep(prepared, list(req.gpus or _powers_to(per_node)), False)
        rows += [dict(r, variant=variant) for r in found]
    return rows, sweep_info(prepared), measured


def _powers_to(n: int) -> list[int]:
    return sorted({*(2 ** k for k in range(n.bit_length())), n})


def _network(where, full: bool = False) -> dict:
    """The network between the nodes as a row (link, NICs) or a result's meta (and its shape) says it: the
    fitted link where a measured all-reduce fitted it."""
    cluster, fit = where.fabric.cluster, where.fabric.network_fit
    if cluster is None:
        return {}
    found = {"link": fit.link if fit else cluster.link, "nics": cluster.nics}
    if full:
        found.update(gpudirect=cluster.gpudirect, network=cluster.network, oversubscription=cluster.oversubscription,
                     placement=cluster.placement)
    return found


def sweep_info(prepared: Prepared) -> SweepInfo:
    job, req = prepared.job, prepared.req
    spec = job.exchange.spec
    measured = prepared.measured
    source = measured.source if measured is not None else (
        prepared.calibration.describe(prepared.where.gpu.model) if prepared.calibration
        else compute_source(prepared.where.gpu, job.precision))
    notes = list(measured.notes) if measured is not None else []
    where = prepared.where
    network = _network(where, full=True) if req.nodes or where.max_nodes else {}
    return SweepInfo(job.name, job.batch if req.weak else req.global_batch, req.weak, prepared.nccl_algo or "nccl",
                     spec.mode if spec else "ps-sync", job.exchange.name, spec.source if spec else "", source,
                     "; ".join(where.notices), notes + list(where.notices), network)


def compare_scale(measured: Result, prepared: Prepared) -> list[dict]:
    """For every row of a "scale" result (world_size, batch_per_rank, throughput_samples_per_s), the
    predicted throughput on that many GPUs (whole nodes beyond one) and the error predicted / measured - 1."""
    if measured.kind != "scale":
        raise MeshscaleError(f"--from wants a `meshscale scale` result (kind 'scale'), got kind {measured.kind!r}")
    rows = []
    for row in measured.rows:
        try:
            world, batch, meas = int(row["world_size"]), int(row["batch_per_rank"]), float(row["throughput_samples_per_s"])
        except (KeyError, TypeError, ValueError):
            raise MeshscaleError("a scale row lacks world_size, batch_per_rank or throughput_samples_per_s; "
                                 "give a file `meshscale scale --json` wrote") from None
        pred = prepared.at(prepared.allocation(gpus=world), batch).samples_per_s
        rows.append({"world_size": world, "mode": row.get("mode", ""), "batch_per_rank": batch,
                     "global_batch": world * batch, "measured_samples_per_s": meas,
                     "predicted_samples_per_s": pred, "error": pred / meas - 1,
                     "throughput_samples_per_s": pred})  # what a predict row is read by (report, compare)
    return rows


def prediction_result(rows: list[dict], info: SweepInfo, **meta) -> Result:
    """A Result of kind "predict" (predicted=True) carrying the sweep's assumptions."""
    return Result("predict", rows, True, {"model": info.model, "batch": info.batch, "weak": info.weak,
                                          "algorithm": info.algorithm, "exchange_mode": info.mode,
                                          "framework": info.framework, "framework_source": info.framework_source,
                                          "profile": info.compute_source, "notes": info.notes, **info.network,
                                          **meta})


def scale_beside(scale: Result, topo, params=None) -> tuple[list[dict], SweepInfo]:
    """A `scale` run's rows predicted on ``topo`` (its links calibrated by ``params`` where measured), its
    compute the run's own smallest world's (`run_profile`), its exchange the run's mode's."""
    from meshscale.predict.profile import run_profile

    wire = (scale.meta.get("config") or {}).get("allreduce", {}).get("compression")
    mode = scale.meta.get("mode") or "ddp"
    req = PredictRequest(model=scale.meta.get("model") or "small-cnn", system=topo.name, profile=run_profile(scale),
                         mode=mode, wire=wire if wire in ("bf16", "fp16") else None)
    prepared = prepare(req, where=where_on(topo, params))
    return compare_scale(scale, prepared), sweep_info(prepared)


def predicted_beside(scale: Result) -> tuple[Result, str]:
    """``scale`` with each row given ``predicted_samples_per_s`` and ``prediction_error`` (predicted / measured
    - 1) on the topology the run used (``meta.topology``), its compute the run's own smallest world's
    (`run_profile`), and one line saying what the prediction rests on, or why there is none."""
    from meshscale.topology import from_dict
    from meshscale.topology.multinode import network_assumed

    topo_data = scale.meta.get("topology")
    if not topo_data:
        return scale, "no prediction: the topology of the run's devices could not be told"
    topo = from_dict(topo_data)
    try:
        rows, info = scale_beside(scale, topo)
    except MeshscaleError as why:
        return scale, f"no prediction: {why}"
    cpu = topo.device_kind != "gpu"
    note = (f"PREDICTED on {topo.title or topo.name}" + (" (the CPU/Gloo model: link rates assumed, not measured)"
                                                         if cpu else "")
            + f"; compute {info.compute_source}, exchange {info.framework} by meshscale's model"
            + (_ASSUMED_NETWORK if network_assumed(topo.attrs) else ""))
    out = [dict(r, predicted_samples_per_s=p["predicted_samples_per_s"], prediction_error=p["error"])
           for r, p in zip(scale.rows, rows)]
    meta = dict(scale.meta, prediction={"note": note, "profile": info.compute_source, "system": topo.name})
    return replace(scale, rows=out, meta=meta), note


# the command that gives such a run a measured network (the one the emulated two-node check uses)
_ASSUMED_NETWORK = ("; the network between hosts is a guess: measure it (`bench collective all_reduce -b 1M -e 512M "
                    "--json ar.json` under the same torchrun) and predict again with `predict --from RUN.json --profile "
                    "RUN.json -s NODE --nodes 1,HOSTS --nics K --bench ar.json` (NODE: one host's system)")
