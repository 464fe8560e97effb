"""A prediction laid beside a measured `meshscale scale` result, point by point, with the error: for `predict
--from` (a job on a catalog system) and for `scale` itself (the run's own topology, with the compute profile
calibrated from the run's own smallest world)."""
from __future__ import annotations

from dataclasses import replace

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import Exchange, cluster_topology
from meshscale.predict.profile import run_profile
from meshscale.predict.scaling import Job
from meshscale.results import Result
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology, from_dict
from meshscale.topology.cluster import ClusterSpec
from meshscale.topology.multinode import network_assumed
from meshscale.models.registry import get_model


def _exchange(job: Job, topo: Topology, world: int, cluster: ClusterSpec | None, params: SimParams | None) -> Exchange:
    """The exchange of a row of ``world`` GPUs: on part of one node, or on whole nodes of ``cluster``."""
    per_node = len(topo.devices())
    if cluster is None or world <= per_node:
        return job.exchange(topo, world, params)
    if world % per_node:
        raise MeshscaleError(f"a row of {world} GPUs is not a whole number of {per_node}-GPU nodes")
    return job.exchange(cluster_topology(cluster, world // per_node), None, params)


def compare_scale(measured: Result, job: Job, topo: Topology, params: SimParams | None = None,
                  cluster: ClusterSpec | None = None) -> list[dict]:
    """For every row of a "scale" result (world_size, batch_per_rank, throughput_samples_per_s), the
    predicted throughput on ``topo`` (or, for rows of more GPUs than one node of it has, on that many full nodes
    of ``cluster``) and the error predicted / measured - 1."""
    if measured.kind != "scale":
        raise MeshscaleError(f"--from wants a `meshscale scale` result (kind 'scale'), got kind {measured.kind!r}")
    rows = []
    for row in measured.rows:
        try:
            world, batch, meas = int(row["world_size"]), int(row["batch_per_rank"]), float(row["throughput_samples_per_s"])
        except (KeyError, TypeError, ValueError):
            raise MeshscaleError("a scale row lacks world_size, batch_per_rank or throughput_samples_per_s; "
                                 "give a file `meshscale scale --json` wrote") from None
        pred = job.step(_exchange(job, topo, world, cluster, params), batch).throughput_samples_per_s
        rows.append({"world_size": world, "mode": row.get("mode", ""), "batch_per_rank": batch,
                     "global_batch": world * batch, "measured_samples_per_s": meas,
                     "predicted_samples_per_s": pred, "error": pred / meas - 1,
                     "throughput_samples_per_s": pred})  # what a predict row is read by (report, compare)
    return rows


def calibrated_job(scale: Result) -> Job:
    """The job of a scale run, its compute profile the run's own (`run_profile`), its exchange the run's mode's."""
    model = scale.meta.get("model") or "small-cnn"
    profile = run_profile(scale)
    wire = (scale.meta.get("config") or {}).get("allreduce", {}).get("compression")
    return Job(model, get_model(model).params, profile, max(profile.batches), True, mode=scale.meta.get("mode") or "ddp",
               wire=wire if wire in ("bf16", "fp16") else None)


# the command that gives such a run a measured network (the one the emulated two-node check uses)
_ASSUMED_NETWORK = ("; the network between hosts is a guess: measure it (`bench collective all_reduce -b 1M -e 512M "
                    "--json ar.json` under the same torchrun) and predict again with `predict --from RUN.json --profile "
                    "RUN.json -s NODE --nodes 1,HOSTS --nics K --bench ar.json` (NODE: one host's system)")


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
            f"by meshscale's model" + (_ASSUMED_NETWORK if network_assumed(topo.attrs) else ""))
    out = [dict(r, predicted_samples_per_s=p["predicted_samples_per_s"], prediction_error=p["error"])
           for r, p in zip(scale.rows, rows)]
    meta = dict(scale.meta, prediction={"note": note, "profile": job.profile.source, "system": topo.name})
    return replace(scale, rows=out, meta=meta), note
