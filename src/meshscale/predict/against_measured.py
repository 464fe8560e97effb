"""A prediction laid beside a measured `meshscale scale` result, point by point, with the error."""
from __future__ import annotations

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import system_fabric
from meshscale.predict.scaling import Job
from meshscale.results import Result
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology


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
