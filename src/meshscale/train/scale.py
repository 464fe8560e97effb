"""Weak and strong scaling sweeps (whitepaper figures 5 and 6): the same run on 1, 2, 4 ... ranks, each in
fresh processes; throughput, speedup over the smallest world, parallel efficiency and the communication share."""
from __future__ import annotations

from dataclasses import asdict, replace

from meshscale.errors import MeshscaleError
from meshscale.execute.world import check_gpus
from meshscale.results import Result, measured
from meshscale.train.config import CheckpointOptions, TrainConfig
from meshscale.train.runner import run, summarize, validate

ROW_KEYS = ("world_size", "mode", "batch_per_rank", "global_batch", "step_time_s", "compute_s", "comm_s", "data_s",
            "comm_share")


def configurations(cfg: TrainConfig, worlds: list[int], weak: bool, batch: int) -> list[TrainConfig]:
    """One config per world size: ``batch`` per rank (weak) or ``batch`` in all, split evenly (strong)."""
    if not worlds or min(worlds) < 1:
        raise MeshscaleError("give world sizes of at least 1, e.g. --cpus 1,2,4")
    if cfg.device == "cuda":
        check_gpus(max(worlds))
    out = []
    for n in sorted(set(worlds)):
        if not weak and batch % n:
            raise MeshscaleError(f"strong scaling: global batch {batch} is not divisible by {n} ranks; "
                                 "pick a global batch that every world size divides")
        out.append(replace(cfg, world=n, batch_per_rank=batch if weak else batch // n,
                           checkpoint=CheckpointOptions(), logging=replace(cfg.logging, jsonl=None)))
    return out


def scale(cfg: TrainConfig, worlds: list[int], weak: bool, batch: int, on_row=None) -> Result:
    """Run the sweep; ``on_row(row)`` is called as each configuration finishes (for live printing)."""
    configs = configurations(cfg, worlds, weak, batch)
    validate(configs[0])
    rows = []
    for c in configs:
        s = summarize(c, run(c))
        row = {k: s[k] for k in ROW_KEYS}
        row["throughput_samples_per_s"] = s["samples_per_s"]
        rows.append(row)
        base = rows[0]
        for r in rows:  # speedup over the smallest world, scaled as if that world were one rank's worth
            r["speedup"] = r["throughput_samples_per_s"] / base["throughput_samples_per_s"] * base["world_size"]
            r["efficiency"] = r["speedup"] / r["world_size"]
        if on_row:
            on_row(row)
    return measured("scale", rows, model=cfg.model, mode=cfg.mode, scaling="weak" if weak else "strong",
                    batch=batch, device=cfg.device, config=asdict(cfg))
