"""Weak and strong scaling sweeps (whitepaper figures 5 and 6): the same run on 1, 2, 4 ... ranks; throughput,
speedup over the smallest world, parallel efficiency and the communication share, with the topology the ranks
ran on (for the prediction beside each row).

On one machine each world size runs in fresh processes. Under torchrun the sweep runs in torchrun's ranks: the
hosts' topologies are joined over the whole world, then each world size n trains on the first n ranks in a
process group of their own (the training code uses the default group, so each size gets a fresh default group,
met on the launcher's store under its own prefix) while the other ranks wait at a store barrier."""
from __future__ import annotations

import gc
import os
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from meshscale.execute.world_topology import world_topology
from meshscale.errors import MeshscaleError
from meshscale.execute import RankContext, WorkerError, in_torchrun, launch
from meshscale.execute.world import World, check_gpus, resolve_world
from meshscale.results import Result, measured
from meshscale.topology import Topology, to_dict
from meshscale.train.config import CheckpointOptions, TrainConfig
from meshscale.train.loop import train_worker
from meshscale.train.runner import check_rank_config, check_warmup, run, summarize, validate

# the split (data, compute, comm, idle) adds up to split_step_time_s: the step's own time, or a layout's profiled
# steps' (`runner.median_step_split`, `runner.breakdown_summary`)
ROW_KEYS = ("world_size", "mode", "batch_per_rank", "global_batch", "step_time_s", "split_step_time_s", "compute_s",
            "comm_s", "data_s", "idle_s", "comm_share")

RowCallback = Callable[[dict], None] | None


def configurations(cfg: TrainConfig, worlds: list[int], weak: bool, batch: int) -> list[TrainConfig]:
    """One config per world size: ``batch`` per rank (weak) or ``batch`` in all, split evenly (strong)."""
    if not worlds or min(worlds) < 1:
        raise MeshscaleError("give world sizes of at least 1, e.g. --cpus 1,2,4")
    if cfg.device == "cuda" and not in_torchrun():  # under torchrun the world is torchrun's, checked there
        check_gpus(max(worlds))
    out = []
    for n in sorted(set(worlds)):
        if not weak and batch % n:
            raise MeshscaleError(f"strong scaling: global batch {batch} is not divisible by {n} ranks; "
                                 "pick a global batch that every world size divides")
        out.append(replace(cfg, world=n, batch_per_rank=batch if weak else batch // n,
                           checkpoint=CheckpointOptions(), logging=replace(cfg.logging, jsonl=None)))
    return out


def torchrun_worlds(counts: list[int] | None) -> list[int]:
    """The world sizes of a sweep inside torchrun's world: ``counts`` (each at most its size), or by default 1,
    the ranks of one node and the whole world."""
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if counts is None:
        return sorted({1, local, world})
    beyond = [n for n in counts if n > world]
    if beyond:
        raise MeshscaleError(f"world size {max(beyond)} is more than torchrun's {world} ranks; sweep up to {world} "
                             f"(e.g. 1,{local},{world})")
    return sorted(set(counts))


def scale(cfg: TrainConfig, worlds: list[int], weak: bool, batch: int, on_row: RowCallback = None) -> Result:
    """Run the sweep; ``on_row(row)`` is called as each configuration finishes (for live printing). Under
    torchrun every rank calls it and rank 0's result holds the rows."""
    configs = configurations(cfg, worlds, weak, batch)
    if in_torchrun():
        return _torchrun_scale(cfg, configs, weak, batch, on_row)
    validate(configs[0])
    topology = world_topology(World(max(worlds), "nccl" if cfg.device == "cuda" else "gloo"))
    rows: list[dict] = []
    for c in configs:
        try:
            summary = summarize(c, run(c))
        except WorkerError as exc:
            if not rows:
                raise
            raise ScaleIncomplete(f"the {c.world}-worker run failed: {exc}",
                                  _result(cfg, weak, batch, rows, topology, failed=f"{c.world} workers: {exc}")) from None
        _add_row(rows, c, summary, on_row)
    return _result(cfg, weak, batch, rows, topology)


class ScaleIncomplete(WorkerError):
    """A later world size of the sweep failed; ``result`` holds the rows of those that finished (meta: failed)."""

    def __init__(self, message: str, result: Result):
        super().__init__(message)
        self.result = result


def _add_row(rows: list[dict], cfg: TrainConfig, summary: dict[str, Any], on_row: RowCallback) -> None:
    row = {k: summary.get(k) for k in ROW_KEYS}
    row["throughput_samples_per_s"] = summary["samples_per_s"]
    rows.append(row)
    base = rows[0]
    for r in rows:  # speedup over the smallest world, scaled as if that world were one rank's worth
        r["speedup"] = r["throughput_samples_per_s"] / base["throughput_samples_per_s"] * base["world_size"]
        r["efficiency"] = r["speedup"] / r["world_size"]
    if on_row:
        on_row(row)


def _result(cfg: TrainConfig, weak: bool, batch: int, rows: list[dict], topology: Topology | None,
            **extra: Any) -> Result:
    return measured("scale", rows, model=cfg.model, mode=cfg.mode, scaling="weak" if weak else "strong",
                    batch=batch, device=cfg.device, config=asdict(cfg),
                    topology=to_dict(topology) if topology else None,
                    hosts=topology.attrs.get("hosts") if topology else None, **extra)


def _torchrun_scale(cfg: TrainConfig, configs: list[TrainConfig], weak: bool, batch: int,
                    on_row: RowCallback) -> Result:
    """The sweep in torchrun's ranks; rank 0's result has the rows and the (joined) topology, the others none."""
    world = resolve_world(None, None if cfg.device == "cuda" else 1)
    for c in configs:
        c.device = world.device
        check_rank_config(c)
    topology, rows, failed = launch(_sweep_ranks, world.size, (configs, world, on_row), backend=world.backend,
                                    timeout_s=cfg.timeout_s)[0]
    result = _result(replace(cfg, device=world.device), weak, batch, rows, topology, torchrun_world_size=world.size,
                     **({"failed": failed} if failed else {}))
    if failed:
        raise ScaleIncomplete(failed, result)
    return result


def _sweep_ranks(ctx: RankContext, configs: list[TrainConfig], world: World,
                 on_row: RowCallback) -> tuple[Topology | None, list[dict], str | None]:
    """One torchrun rank's part of the sweep: the topology (joined over the hosts: collective), then each world
    size on the first ranks. Rank 0 returns the rows, and what failed if a later world size did."""
    ctx.phase("joining the hosts' topologies")
    topology = world_topology(world, ctx)
    gc.collect()
    dist.destroy_process_group()  # each world size gets a default group of its own ranks
    rows: list[dict] = []
    run_id = f"meshscale/scale/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    for c in configs:
        store = dist.PrefixStore(f"{run_id}/{c.world}", ctx.store)
        try:
            output = _train_in_first_ranks(ctx, c, store) if ctx.rank < c.world else None
            _store_barrier(store, ctx.world_size, c.timeout_s, c.world)
        except (RuntimeError, MeshscaleError) as exc:  # torch's Dist*Error are RuntimeErrors
            if not rows:
                raise
            return topology, rows, f"the {c.world}-rank run failed: {(str(exc).strip().splitlines() or ['?'])[0]}"
        if ctx.rank == 0:
            _add_row(rows, c, summarize(c, [output]), on_row)
    return topology, rows, None


def _train_in_first_ranks(ctx: RankContext, cfg: TrainConfig, store: Any) -> dict[str, Any]:
    """Train ``cfg`` on ranks 0 .. cfg.world - 1 of torchrun's world, in a default group of their own."""
    dist.init_process_group(ctx.backend, store=store, rank=ctx.rank, world_size=cfg.world,
                            timeout=timedelta(seconds=cfg.timeout_s),
                            device_id=ctx.device if ctx.backend == "nccl" else None)
    try:
        return train_worker(RankContext(ctx.rank, cfg.world, ctx.local_rank, ctx.backend, ctx.device, store), cfg)
    finally:
        gc.collect()  # free the DDP reducer before its group goes (teardown deadlock)
        dist.destroy_process_group()


def _store_barrier(store: Any, world_size: int, timeout_s: float, training_ranks: int) -> None:
    """Every rank of torchrun's world reaches this point. A rank waits while the training ranks make progress
    (rank 0 records each step's phase); ``timeout_s`` without a new phase is an error naming the run."""
    if store.add("arrived", 1) == world_size:
        store.set("all-arrived", "1")
    seen = None
    while True:
        try:
            store.wait(["all-arrived"], timedelta(seconds=timeout_s))
            return
        except dist.DistStoreError:
            phase = store.get("meshscale/phase/0") if store.check(["meshscale/phase/0"]) else None
            if phase == seen:
                raise WorkerError(f"the {training_ranks}-rank run made no progress in {timeout_s:.0f} s (rank 0 was in "
                                  f"{phase.decode() if phase else 'start-up'})") from None
            seen = phase


LAYOUT_ROW_KEYS = ("world_size", "layout", "batch_per_rank", "global_batch", "step_time_s", "split_step_time_s",
                   "data_s", "compute_s", "comm_s", "bubble_s", "idle_s", "tokens_per_s", "tokens_per_s_per_rank", "mfu",
                   "memory_needed_allocated_bytes", "memory_needed_bytes", "peak_allocated_bytes", "peak_reserved_bytes")


def scale_layouts(cfg: TrainConfig, layouts: list[dict[str, int]], on_row: RowCallback = None) -> Result:
    """The same transformer, batch per data-parallel rank and options under each layout (its world size the
    product of its degrees): one row each, in fresh processes."""
    from meshscale.train.parallel.plan import check_layout_run
    check_warmup(cfg)
    configs = []
    for degrees in layouts:
        c = replace(cfg, layout=replace(cfg.layout, **{k: degrees.get(k, 1) for k in ("dp", "fsdp", "tp", "pp", "cp")}),
                    checkpoint=CheckpointOptions(), logging=replace(cfg.logging, jsonl=None))
        c.world = c.layout.parallel_layout().world_size
        check_layout_run(c)  # every layout checked before the first starts
        configs.append(c)
    if cfg.device == "cuda":
        check_gpus(max(c.world for c in configs))
    topology = world_topology(World(max(c.world for c in configs), "nccl" if cfg.device == "cuda" else "gloo"))
    rows = []
    for c in configs:
        summary = summarize(c, run(c))
        row = {k: summary.get(k) for k in LAYOUT_ROW_KEYS}
        for dim, comm in (summary.get("comm_by_dimension") or {}).items():  # flat, for the CSV
            row[f"{dim}_comm_bytes"], row[f"{dim}_comm_s"] = comm["bytes"], comm["seconds"]
            row[f"{dim}_comm_exposed_s"] = comm.get("exposed_seconds")
        rows.append(row)
        if on_row:
            on_row(row)
    return measured("scale", rows, model=cfg.model, scaling="layouts", device=cfg.device, config=asdict(cfg),
                    topology=to_dict(topology) if topology else None)

