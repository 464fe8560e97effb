"""Start a training run on N ranks (fresh processes, or this process under torchrun) and turn what rank 0
measured into a Result of kind "train"; also the one-device profile over batch sizes that the predictor reads."""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from meshscale.errors import MeshscaleError, check_choice
from meshscale.execute import in_torchrun, launch
from meshscale.execute.world import check_gpus, resolve_world
from meshscale.results import Result, measured
from meshscale.train.config import TRAIN_MODES, CheckpointOptions, LogOptions, TrainConfig
from meshscale.train.data import open_data
from meshscale.train.exchange import WIRE_DTYPES
from meshscale.train.graphed import check_graphable
from meshscale.train.loop import train_worker
from meshscale.train.moe import moe_summary
from meshscale.train.parallel.breakdown import mean_breakdown
from meshscale.train.parallel.comm import FLIGHT_RECORDER_ENV
from meshscale.train.parallel.plan import check_fits_gpu, check_layout_run, layout_summary, with_default_layout
from meshscale.train.readiness import gradient_readiness
from meshscale.train.recipe import resolve

TRAIN_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
DEVICES = ("cpu", "cuda")


def notices(cfg: TrainConfig, max_world: int) -> list[str]:
    """Measured pitfalls of a configuration that still runs, for the CLI to print before starting."""
    out = []
    if cfg.speed.compile and cfg.mode == "ddp" and cfg.device == "cuda" and max_world > 1:
        out.append("note: ddp with --compile scaled only 1.00-1.10x on 2 H200 (docs/results/h200x2-2026-11-22-b); "
                   "--mode allreduce --compile scaled 1.64x")
    return out


def check_ps_servers(cfg: TrainConfig) -> None:
    """Dedicated parameter servers need a parameter-server mode and leave at least one worker."""
    if cfg.ps.servers and (not cfg.mode.startswith("ps") or not 0 < cfg.ps.servers < cfg.world):
        raise MeshscaleError(f"--ps-servers {cfg.ps.servers} needs --mode ps-sync or ps-async and at least one "
                             f"worker left: use 1..{max(1, cfg.world - 1)} with {cfg.world} ranks")


def check_warmup(cfg: TrainConfig) -> None:
    """A timing warm-up of --steps or more leaves no step to time: train, scale and scale --layouts refuse it."""
    if cfg.timing_warmup >= cfg.steps:
        raise MeshscaleError(f"--timing-warmup {cfg.timing_warmup} leaves none of the {cfg.steps} steps to time; "
                             f"give --steps more than {cfg.timing_warmup} or a shorter --timing-warmup")


def check_fp8(cfg: TrainConfig) -> None:
    """--precision fp8: a transformer, a recipe torchao has, GPUs with fp8 tensor cores, torchao installed;
    --fp8-recipe without it is refused."""
    from meshscale.train.fp8 import FP8_RECIPES, check_fp8_device, require_torchao
    if cfg.speed.precision != "fp8":
        if cfg.speed.fp8_recipe is not None:
            raise MeshscaleError(f"--fp8-recipe {cfg.speed.fp8_recipe}: a recipe of --precision fp8 (this run is "
                                 f"{cfg.speed.precision})")
        return
    check_choice(cfg.speed.fp8_recipe or "tensorwise", FP8_RECIPES, "fp8-recipe")
    if not cfg.is_transformer:
        raise MeshscaleError(f"--precision fp8: float8 training is for transformers under a layout; {cfg.model} "
                             "trains in fp32, bf16 or fp16")
    if not cfg.debug.fp8_emulate:
        check_fp8_device(cfg.device)
    require_torchao()


def validate_options(cfg: TrainConfig) -> None:
    """The checks that need no world (its size, the layout over it): model, data, mode, precision, device. Also
    what `meshscale launch` checks before torchrun makes the world."""
    if cfg.world < 1 or cfg.batch_per_rank < 1 or cfg.steps < 1:
        raise MeshscaleError("world size, batch and steps must be at least 1")
    check_choice(cfg.mode, TRAIN_MODES, "mode")
    check_choice(cfg.speed.precision, TRAIN_PRECISIONS, "precision")
    check_choice(cfg.allreduce.compression, WIRE_DTYPES, "compression")
    check_choice(cfg.device, DEVICES, "device")
    check_fp8(cfg)
    if cfg.speed.precision == "fp16" and cfg.mode.startswith("ps"):
        raise MeshscaleError("fp16 loss scaling is not supported with the parameter server modes; use --precision bf16")
    if cfg.speed.cuda_graph:
        check_graphable(cfg.mode, cfg.device, cfg.speed.precision, cfg.speed.compile)
    if cfg.checkpoint.resume and not cfg.checkpoint.dir:
        raise MeshscaleError("--resume needs --checkpoint-dir")
    check_warmup(cfg)
    spec, _ = resolve(cfg)  # unknown model, missing data folder, bad token file
    if cfg.eval_data:  # refused now, not after the training
        open_data(cfg.eval_data, spec.input_kind, spec.input_shape, spec.num_classes)


def validate(cfg: TrainConfig) -> None:
    """Everything that can be checked before ranks start: `validate_options`, then the world's devices and layout."""
    validate_options(cfg)
    check_ps_servers(cfg)
    if cfg.device == "cuda":
        check_gpus(cfg.world)
    if cfg.is_transformer:
        layout = check_layout_run(cfg)
        if cfg.device == "cuda":
            check_fits_gpu(cfg, layout)


def check_rank_config(cfg: TrainConfig) -> None:
    """`validate` for one rank of a world that may span nodes: only this rank's device is checked."""
    one = replace(cfg.layout, dp=1, fsdp=1, tp=1, pp=1, cp=1, ep=1, micro_batches=1)
    validate(replace(cfg, world=1, ps=replace(cfg.ps, servers=0), layout=one))
    check_ps_servers(cfg)
    if cfg.is_transformer:
        check_layout_run(cfg)


def run(cfg: TrainConfig) -> list[dict[str, Any]]:
    """Train on ``cfg.world`` ranks; the per-rank outputs (rank 0's has the per-step rows). Under torchrun
    this process is one rank and the world is torchrun's."""
    if in_torchrun():
        # torchrun's world: on GPUs where there are any, unless the configuration asks for CPU workers (--cpus)
        world = resolve_world(None, 1 if cfg.device == "cpu" else None)
        cfg.world, cfg.device = world.size, world.device
    if cfg.is_transformer:
        cfg.layout = with_default_layout(cfg).layout
    if in_torchrun():
        check_rank_config(cfg)
    else:
        validate(cfg)
    # a layout's timed run: the flight recorder counts each dimension's communication
    return launch(train_worker, cfg.world, (cfg,), backend=_backend(cfg), timeout_s=cfg.timeout_s,
                  env=FLIGHT_RECORDER_ENV if cfg.is_transformer and cfg.timing else None)


def _backend(cfg: TrainConfig) -> str:
    return "nccl" if cfg.device == "cuda" else "gloo"


def summarize(cfg: TrainConfig, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's summary plus medians of the timed steps and the worst parameter mismatch over ranks."""
    s = dict(outputs[0]["summary"])
    s["max_param_diff"] = max(o["summary"]["max_param_diff"] for o in outputs)
    timed = [r for r in outputs[0]["rows"][-s["timed_steps"]:] if "step_time_s" in r] if s["timed_steps"] else []
    s.update(median_step_split(timed))
    if s.get("samples_per_s") is None and s["step_time_s"]:
        s["samples_per_s"] = cfg.global_batch / s["step_time_s"]
    s.update(world_size=cfg.world, mode=cfg.mode, batch_per_rank=cfg.batch_per_rank, global_batch=cfg.global_batch)
    if cfg.is_transformer:
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "build_peak_allocated_bytes",  # the fullest rank's
                    "build_peak_reserved_bytes", "step_peak_allocated_bytes", "step_peak_reserved_bytes",
                    "end_device_used_bytes", "end_outside_allocator_bytes"):
            values = [o["summary"][key] for o in outputs if o["summary"].get(key) is not None]
            s[key] = max(values) if values else None
        s.update(layout_summary(cfg, s, cfg.layout.parallel_layout(), _gpu_name(cfg)))
        s.update(breakdown_summary(s.get("comm_by_dimension") or {}, [o["summary"].get("breakdown") for o in outputs]))
        counters = [o["summary"].get("moe") for o in outputs]
        layout = cfg.layout.parallel_layout()
        if any(counters):
            s["moe"] = moe_summary(counters, layout.data_parallel * layout.cp, (s.get("comm_by_dimension") or {}).get("ep"))
    return s


# what a step splits into: the split's parts add up to SPLIT_STEP (idle is the rest: the host between operators
# and between steps)
SPLIT_PARTS = ("data_s", "compute_s", "comm_s", "idle_s")
SPLIT_STEP = "split_step_time_s"


def median_step_split(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """The step figure and its split from one and the same step: the timed step at the median (the lower middle
    of an even count), its data / compute / exposed communication (None inside a CUDA graph, where compute holds
    it) and idle, which add up to its step time."""
    if not timed:
        return {"step_time_s": None, SPLIT_STEP: None, "split_steps": 0, "split_from": None, "comm_share": None,
                **dict.fromkeys(SPLIT_PARTS)}
    row = sorted(timed, key=lambda r: r["step_time_s"])[(len(timed) - 1) // 2]
    step_s = row["step_time_s"]
    parts = {k: row.get(k) for k in ("data_s", "compute_s", "comm_s")}
    busy_s = sum(v for v in parts.values() if v is not None)
    return {"step_time_s": step_s, SPLIT_STEP: step_s, "split_steps": 1,
            "split_from": f"the median of {len(timed)} timed step{'s' if len(timed) > 1 else ''}", **parts,
            "idle_s": max(0.0, step_s - busy_s),
            "comm_share": parts["comm_s"] / step_s if step_s and parts["comm_s"] is not None else None}


def breakdown_summary(comm: dict[str, dict[str, Any]], parts: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The profiled steps' split (averaged over the ranks) as the summary's data / compute / comm / idle (bubble:
    the part of comm that is the pipeline's wait) beside those steps' own step time, and each dimension's busy and
    exposed seconds beside its operations and bytes. Nothing when no step was profiled."""
    b = mean_breakdown([p for p in parts if p])
    if b is None:
        return {}
    comm = {dim: dict(c) for dim, c in comm.items()}
    for dim, t in b["dimensions"].items():
        comm.setdefault(dim, {"operations": None, "bytes": None, "seconds": None})
        comm[dim].update(seconds=t["busy_s"], exposed_seconds=t["exposed_s"])
    for c in comm.values():
        c.setdefault("exposed_seconds", None)
    # the split is the profiled steps' own, beside their own step time (the throughput window is unprofiled)
    return {"breakdown": b, "comm_by_dimension": comm, SPLIT_STEP: b["step_time_s"], "split_steps": b["steps"],
            "split_from": f"{b['steps']:.0f} profiled warm-up step{'s' if b['steps'] != 1 else ''}",
            "data_s": b["data_s"], "compute_s": b["compute_s"], "comm_s": b["exposed_comm_s"], "idle_s": b["idle_s"],
            "bubble_s": b["bubble_s"],
            "comm_share": b["exposed_comm_s"] / b["step_time_s"] if b["step_time_s"] else None}


def _gpu_name(cfg: TrainConfig) -> str | None:
    if cfg.device != "cuda":
        return None
    import torch
    return torch.cuda.get_device_name(0)


def train(cfg: TrainConfig) -> Result:
    """A training run as a Result of kind "train": per-step rows, meta.summary, meta.config."""
    outputs = run(cfg)
    return measured("train", outputs[0]["rows"], config=asdict(cfg), summary=summarize(cfg, outputs))


def profile(cfg: TrainConfig, batches: list[int]) -> Result:
    """Time per step on ONE device for each per-device batch size (one process for all of them, smallest batch
    first): rows with batch_per_rank and step_time_s, meta.profile = True (the predictor's input). Timed as the
    scaled runs are (``timing`` off): no device sync inside the window, one at each end; the step time is the
    window's mean, so there is no compute / data split (None). meta.gradients: when backward completes each
    gradient (`gradient_readiness`), which the predictor's overlap of the exchange with backward takes. On a GPU,
    meta.kernel_categories: the largest batch's kernel time per category (`kernel_categories`), which calibrates
    a prediction category by category (meta.kernel_categories_missing says why, where the trace failed)."""
    ones = [replace(cfg, world=1, batch_per_rank=b, timing=False, checkpoint=CheckpointOptions(), logging=LogOptions())
            for b in sorted(batches)]
    for one in ones:
        if one.is_transformer:
            one.layout = with_default_layout(one).layout
    validate(ones[-1])  # the largest batch: the smaller ones need no more memory and share everything else
    # one process: a fresh one per batch size costs a process start and CUDA's and cuDNN's set-up each time (most
    # of a short profile on a GPU); each run still builds its own model and warms up before its window
    [(outputs, gradients, kernels, missing)] = launch(_profile_worker, 1, (ones, max(batches)), backend=_backend(cfg),
                                                      timeout_s=cfg.timeout_s)
    rows = []
    for one, out in zip(ones, outputs):
        s = summarize(one, [out])
        rate = s["samples_per_s"]
        rows.append({"batch_per_rank": one.batch_per_rank, "step_time_s": one.batch_per_rank / rate if rate else None,
                     "compute_s": s["compute_s"], "data_s": s["data_s"], "samples_per_s": rate})
    categories = {"kernel_categories": kernels} if kernels else {"kernel_categories_missing": missing} if missing \
        else {}
    return measured("train", rows, profile=True, model=cfg.model, device=cfg.device, precision=cfg.speed.precision,
                    timing="window, synced at its ends only", config=asdict(replace(cfg, timing=False)),
                    gradients=[[elements, share] for elements, share in gradients], gradients_batch=max(batches),
                    **categories)


def _profile_worker(ctx, ones: list[TrainConfig], gradients_batch: int) -> tuple[list[dict[str, Any]], list,
                                                                                dict | None, str | None]:
    """The profile's one rank: every batch size's run, when backward completes each gradient, and on a GPU the
    largest batch's kernel time per category (`kernel_categories`: what a prediction for another GPU moves
    category by category)."""
    outputs = [train_worker(ctx, one) for one in ones]
    kernels, missing = None, None
    if ones[-1].device == "cuda":
        import torch

        from meshscale.train.kernel_categories import kernel_categories
        torch.cuda.empty_cache()
        try:
            kernels = kernel_categories(ones[-1], torch.device("cuda", 0))
        except Exception as e:  # the step times stand without them: the profile says why they are missing
            missing = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return outputs, gradient_readiness(ones[0], gradients_batch), kernels, missing
