"""`meshscale train` and `meshscale scale`: data-parallel training and weak/strong scaling sweeps.

Multi-node or elastic: run `meshscale train` under torchrun (it then runs in-process on the env:// group and,
with --checkpoint-dir, resumes from the last checkpoint when torchrun restarts the workers). Only rank 0
prints and writes files."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from meshscale.errors import MeshscaleError
from meshscale.units import parse_ints
from meshscale.train.config import TrainConfig

_HELP_DATA = "synthetic, digits (scikit-learn), a folder of images (ImageFolder layout) or a token file (.npy/.bin)"


def _workers(gpus: Optional[str], cpus: Optional[str]) -> tuple[str, str]:
    if gpus and cpus:
        raise MeshscaleError("give either --gpus or --cpus, not both")
    return ("cuda", gpus) if gpus else ("cpu", cpus or "1")


def train(
    model: str = typer.Option("small-cnn", "--model", "-m", help="resnet50, resnet18, small-cnn, gpt-tiny, gpt-small, gpt-medium"),
    data: str = typer.Option("synthetic", "--data", help=_HELP_DATA),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="train on this many GPUs (NCCL)"),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="train on this many CPU processes (Gloo; default 1)"),
    mode: str = typer.Option("ddp", "--mode", help="ddp, allreduce, ps-sync or ps-async"),
    batch: int = typer.Option(32, "--batch", "-b", help="batch per rank"),
    steps: int = typer.Option(50, "--steps", help="training steps (in all, also when resuming)"),
    warmup: int = typer.Option(5, "--timing-warmup", help="steps left out of the throughput figure"),
    lr: Optional[float] = typer.Option(None, "--lr", help="base learning rate per --ref-batch samples (scaled linearly)"),
    ref_batch: int = typer.Option(256, "--ref-batch", help="batch the base learning rate is for"),
    lr_warmup: int = typer.Option(0, "--lr-warmup-steps", help="linear learning-rate warm-up (Goyal et al.)"),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="sgd or adamw (default: the model's: sgd for resnets, adamw otherwise)"),
    precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 (autocast) or fp16 (autocast + loss scaling)"),
    channels_last: bool = typer.Option(False, "--channels-last", help="channels-last memory format (images)"),
    compile: Optional[str] = typer.Option(None, "--compile", help="torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="capture the whole step (forward, backward, all-reduce, optimizer) in one CUDA graph (GPUs; ddp/allreduce)"),
    bucket_cap_mb: float = typer.Option(25.0, "--bucket-cap-mb", help="ddp: gradient bucket size"),
    bucket_view: bool = typer.Option(False, "--bucket-view", help="ddp: gradient_as_bucket_view"),
    static_graph: bool = typer.Option(False, "--static-graph", help="ddp: static_graph"),
    fusion_mb: float = typer.Option(64.0, "--fusion-mb", help="allreduce: fusion buffer size"),
    compression: str = typer.Option("none", "--compression", help="allreduce: none, bf16 or fp16 on the wire"),
    collective: str = typer.Option("native", "--collective", help="allreduce: native, or schedule[:ALGO] (meshscale schedule executor, e.g. schedule:ring)"),
    max_staleness: int = typer.Option(0, "--max-staleness", help="ps-async: parameters may be this many steps old"),
    ps_servers: int = typer.Option(0, "--ps-servers", help="ps-*: this many dedicated server ranks (the last ones; default 0: sharded over all ranks)"),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="side of the images (default: the model's)"),
    eval_data: Optional[str] = typer.Option(None, "--eval", help="evaluate on this data at the end (e.g. digits-test)"),
    seed: int = typer.Option(0, "--seed"),
    deterministic: bool = typer.Option(False, "--deterministic", help="deterministic kernels (exact resume on GPUs)"),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="save checkpoints here"),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="steps between checkpoints (0: at the end)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the latest checkpoint in --checkpoint-dir"),
    log: Optional[str] = typer.Option(None, "--log", help="JSONL file, one line per step"),
    tensorboard: Optional[str] = typer.Option(None, "--tensorboard", help="TensorBoard log folder (if installed)"),
    no_timing: bool = typer.Option(False, "--no-timing", help="no per-step device sync and split (fastest)"),
    timeout_s: float = typer.Option(300.0, "--timeout", help="seconds any collective may take before the run stops"),
    profile_batches: Optional[str] = typer.Option(None, "--profile-batches", help="profile ONE device at these batch sizes (e.g. 16,32,64,128)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the Result (kind train) here"),
) -> None:
    """Train a model data-parallel and report loss, samples/s and the compute / communication / data split."""
    from meshscale.train.runner import notices, profile, train as run_train

    if gpus is not None and cpus is not None:
        raise MeshscaleError("give either --gpus or --cpus, not both")
    cfg = TrainConfig(model=model, data=data, eval_data=eval_data or ("digits-test" if data == "digits" else None),
                      image_size=image_size, mode=mode, world=gpus or cpus or 1, device="cuda" if gpus else "cpu",
                      batch_per_rank=batch, steps=steps, timing_warmup=warmup, optimizer=optimizer, base_lr=lr,
                      ref_batch=ref_batch, lr_warmup_steps=lr_warmup, bucket_cap_mb=bucket_cap_mb,
                      bucket_view=bucket_view, static_graph=static_graph, fusion_mb=fusion_mb, compression=compression,
                      collective=collective, max_staleness=max_staleness, ps_servers=ps_servers, precision=precision,
                      channels_last=channels_last, compile=compile, cuda_graph=cuda_graph, timing=not no_timing, seed=seed,
                      deterministic=deterministic, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                      resume=resume, log=log, tensorboard=tensorboard, progress=True, timeout_s=timeout_s)
    for line in notices(cfg, cfg.world):
        typer.echo(line, err=True)
    if profile_batches:
        result = profile(cfg, parse_ints(profile_batches, "--profile-batches"))
        _table("profile (one device)", result.rows, ("batch_per_rank", "step_time_s", "compute_s", "samples_per_s"))
    else:
        result = run_train(cfg)
        if int(os.environ.get("RANK", "0")) != 0:
            return
        s = result.meta["summary"]
        table = Table(title=f"{model} {mode} on {cfg.world} {'GPU' if gpus else 'CPU worker'}(s)")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k in ("global_batch", "samples_per_s", "step_time_s", "compute_s", "comm_s", "data_s", "comm_share",
                  "eval_accuracy", "eval_loss"):
            if s.get(k) is not None:
                table.add_row(_LABELS.get(k, k), _fmt(k, s[k]))
        Console().print(table)
    if json_out:
        typer.echo(f"wrote {result.save(json_out)}")


def scale(
    model: str = typer.Option("small-cnn", "--model", "-m", help="model name (see meshscale train --help)"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU counts, e.g. 1,2,4,8"),
    cpus: Optional[str] = typer.Option(None, "--cpus", help="CPU worker counts, e.g. 1,2,4"),
    weak: bool = typer.Option(False, "--weak", help="weak scaling: --batch per worker"),
    strong: bool = typer.Option(False, "--strong", help="strong scaling: --global-batch split over the workers"),
    batch: Optional[int] = typer.Option(None, "--batch", "-b", help="weak: batch per worker"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="strong: batch in all"),
    mode: str = typer.Option("ddp", "--mode", help="ddp, allreduce, ps-sync or ps-async"),
    data: str = typer.Option("synthetic", "--data", help=_HELP_DATA),
    steps: int = typer.Option(30, "--steps", help="steps per configuration"),
    warmup: int = typer.Option(10, "--timing-warmup", help="steps per configuration left out of the timing"),
    precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 or fp16"),
    channels_last: bool = typer.Option(False, "--channels-last"),
    compile: Optional[str] = typer.Option(None, "--compile", help="torch.compile mode"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="capture the whole step in one CUDA graph"),
    bucket_cap_mb: float = typer.Option(25.0, "--bucket-cap-mb"),
    bucket_view: bool = typer.Option(False, "--bucket-view"),
    static_graph: bool = typer.Option(False, "--static-graph"),
    fusion_mb: float = typer.Option(64.0, "--fusion-mb"),
    compression: str = typer.Option("none", "--compression"),
    max_staleness: int = typer.Option(0, "--max-staleness"),
    no_timing: bool = typer.Option(False, "--no-timing", help="no per-step device sync and split (fastest)"),
    timeout_s: float = typer.Option(300.0, "--timeout"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the Result (kind scale) here"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the scaling figure here (png/svg/pdf)"),
) -> None:
    """Weak or strong scaling over 1, 2, 4 ... workers: throughput, speedup, efficiency, communication share."""
    from meshscale import plots
    from meshscale.train.runner import notices
    from meshscale.train.scale import scale as run_scale

    if weak == strong:
        raise MeshscaleError("choose one of --weak (with --batch) or --strong (with --global-batch)")
    size = batch if weak else global_batch
    if not size:
        raise MeshscaleError("--weak needs --batch N" if weak else "--strong needs --global-batch N")
    device, counts = _workers(gpus, cpus)
    what = "--gpus" if device == "cuda" else "--cpus"
    cfg = TrainConfig(model=model, data=data, mode=mode, device=device, steps=steps, timing_warmup=warmup,
                      precision=precision, channels_last=channels_last, compile=compile, cuda_graph=cuda_graph,
                      bucket_cap_mb=bucket_cap_mb,
                      bucket_view=bucket_view, static_graph=static_graph, fusion_mb=fusion_mb, compression=compression,
                      max_staleness=max_staleness, timing=not no_timing, timeout_s=timeout_s)
    for line in notices(cfg, max(parse_ints(counts, what))):
        typer.echo(line, err=True)
    console = Console()
    result = run_scale(cfg, parse_ints(counts, what), weak, size,
                       on_row=lambda r: console.print(f"{r['world_size']} workers: {r['throughput_samples_per_s']:,.1f} samples/s"))
    _table(f"{model} {mode}: {'weak' if weak else 'strong'} scaling", result.rows,
           ("world_size", "batch_per_rank", "global_batch", "throughput_samples_per_s", "speedup", "efficiency",
            "step_time_s", "compute_s", "comm_s", "data_s", "comm_share"))
    if json_out:
        typer.echo(f"wrote {result.save(json_out)}")
    if plot:
        typer.echo(f"wrote {plots.save(plots.scale_result_chart(result), plot)}")


_LABELS = {"world_size": "N", "batch_per_rank": "batch/N", "global_batch": "global", "throughput_samples_per_s": "samples/s",
           "samples_per_s": "samples/s", "efficiency": "eff", "step_time_s": "step ms", "compute_s": "compute ms",
           "comm_s": "comm ms", "data_s": "data ms", "comm_share": "comm", "eval_accuracy": "test accuracy"}


def _table(title: str, rows: list[dict], keys: tuple[str, ...]) -> None:
    keys = tuple(k for k in keys if any(r.get(k) is not None for r in rows))
    table = Table(title=title)
    for k in keys:
        table.add_column(_LABELS.get(k, k), justify="right")
    for r in rows:
        table.add_row(*(_fmt(k, r.get(k)) for k in keys))
    Console().print(table)


def _fmt(key: str, v) -> str:
    """Times in ms, shares in %, the rest short."""
    if v is None:
        return ""
    if key in ("step_time_s", "compute_s", "comm_s", "data_s"):
        return f"{v * 1e3:.2f}" if v < 0.01 else f"{v * 1e3:.1f}"
    if key in ("comm_share", "efficiency", "eval_accuracy"):
        return f"{v:.0%}"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command("train")(train)
    app.command("scale")(scale)
