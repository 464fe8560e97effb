"""A prediction laid beside a measured `meshscale scale` result, point by point, with the error: for `predict
--from` (a job on a catalog system) and for `scale` itself (the run's own topology, with the compute profile
calibrated from the run's own smallest world)."""
from __future__ import annotations

from dataclasses import replace

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import system_fabric
from meshscale.predict.profile import ComputeProfile
from meshscale.predict.scaling import Job
from meshscale.results import Result
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology, from_dict
from meshscale.train.models import get_model


def compare_scale(measured: Result, job: Job, topo: Topology, params: SimParams | None = None) -> list[dict]:
    """For every row of a "scale" result (world_size, batch_per_rank, throughput_samples_per_s), the
    predicted throughput on ``topo`` and the error predicted / measured - 1."""
    if measured.kind != "scale":
        raise MeshscaleError(f"--from wants a `meshscale scale` result (kind 'scale'), got kind {measured.kind!r}")
    rows = []
    for row in measured.rows:
        try:
            world, batch, meas = int(row["world_size"]), int(row["batch_per_rank"]), float(row["throughput_samples_per_s"])
        except (KeyError, TypeError, ValueError):
            raise MeshscaleError("a scale row lacks world_size, batch_per_rank or throughput_samples_per_s; "
                                 "give a file `meshscale scale --json` wrote") from None
        pred = job.step(job.exchange(system_fabric(topo, world), params), batch).throughput_samples_per_s
        rows.append({"world_size": world, "mode": row.get("mode", ""), "batch_per_rank": batch,
                     "global_batch": world * batch, "measured_samples_per_s": meas,
                     "predicted_samples_per_s": pred, "error": pred / meas - 1})
    return rows


def _step_time_s(row: dict) -> float | None:
    """A row's step time: as timed, or (a run with --no-timing) its global batch over its throughput."""
    if row.get("step_time_s"):
        return float(row["step_time_s"])
    rate, batch = row.get("throughput_samples_per_s"), row.get("global_batch") or row.get("batch_per_rank")
    return float(batch) / float(rate) if rate and batch else None


def run_profile(scale: Result) -> ComputeProfile:
    """The compute profile a scale run measured itself: the step time of its 1-worker rows (no exchange in
    them; without per-step timing, batch over throughput), else the compute and data time of its smallest world's row."""
    ones = {int(r["batch_per_rank"]): _step_time_s(r) for r in scale.rows if r.get("world_size") == 1 and _step_time_s(r)}
    if ones:
        return ComputeProfile(list(ones), list(ones.values()), source="calibrated from this run's 1-worker row")
    timed = [r for r in scale.rows if r.get("compute_s") and r.get("batch_per_rank")]
    if not timed:
        raise MeshscaleError("the scale run has no 1-worker row and no compute time to take the compute profile from; "
                             "include 1 in the world sizes")
    smallest = min(timed, key=lambda r: r["world_size"])
    return ComputeProfile([int(smallest["batch_per_rank"])], [smallest["compute_s"] + (smallest.get("data_s") or 0.0)],
                          source=f"calibrated from this run's {smallest['world_size']}-worker row (its compute and "
                                 "data time)")


def calibrated_job(scale: Result) -> Job:
    """The job of a scale run, its compute profile the run's own (`run_profile`), its exchange the run's mode's."""
    model = scale.meta.get("model") or "small-cnn"
    profile = run_profile(scale)
    wire = (scale.meta.get("config") or {}).get("allreduce", {}).get("compression")
    return Job(model, get_model(model).params, profile, max(profile.batches), True, mode=scale.meta.get("mode") or "ddp",
               wire=wire if wire in ("bf16", "fp16") else None)


def predicted_beside(scale: Result) -> tuple[Result, str]:
    """``scale`` with each row given ``predicted_samples_per_s`` and ``prediction_error`` (predicted / measured
    - 1) on the topology the run used (``meta.topology``), and one line saying what the prediction rests on, or
    why there is none."""
    topo_data = scale.meta.get("topology")
    if not topo_data:
        return scale, "no prediction: the topology of the run's devices could not be told"
    topo = from_dict(topo_data)
    try:
        job = calibrated_job(scale)
        rows = compare_scale(scale, job, topo)
    except MeshscaleError as why:
        return scale, f"no prediction: {why}"
    cpu = topo.device_kind != "gpu"
    where = topo.title or topo.name
    note = (f"PREDICTED on {where}" + (" (the CPU/Gloo model: link rates assumed, not measured)" if cpu else "")
            + f"; compute {job.profile.source}, exchange {job.framework.name if job.framework else 'parameter server'} "
            f"by meshscale's model")
    out = [dict(r, predicted_samples_per_s=p["predicted_samples_per_s"], prediction_error=p["error"])
           for r, p in zip(scale.rows, rows)]
    meta = dict(scale.meta, prediction={"note": note, "profile": job.profile.source, "system": topo.name})
    return replace(scale, rows=out, meta=meta), note
