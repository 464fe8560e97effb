"""`meshscale train` and `meshscale scale`: data-parallel training and weak/strong scaling sweeps.

Multi-node or elastic: run `meshscale train` under `meshscale launch` (torchrun's agent, e.g. `meshscale launch
--nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --max-restarts 3 -- train ...`; a
failed rank is one line) or torchrun. It then runs in-process on the env:// group and, with --checkpoint-dir,
resumes from the last checkpoint when the agent restarts the workers. Only rank 0 prints and writes files."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables, text_console, write_result_files
from meshscale.cli.checks import CPU_COUNT, GLOBAL_BATCH, GPU_COUNT, MAX_BATCH, checked, counts, cpu_counts, output_file
from meshscale.errors import MeshscaleError
from meshscale.cli.declared import declared_values, with_declared
from meshscale.train.config import config_from_options, option_fields
from meshscale.units import parse_ints

# a sweep runs every configuration afresh: shorter runs, and no batch until --weak asks; the timing warm-up is
# train's (one default, so that a --steps that suits train suits scale)
SCALE_DEFAULTS = {("steps",): 30, ("batch_per_rank",): None}


def _config_fields(command: str) -> list:
    return [f for f in option_fields() if command == "train" or not f.train_only]


def with_config_options(command: str) -> Callable[[Callable], Callable]:
    """Give ``fn(options, **own)`` every TrainConfig option (declared once, in train/config.py) as a typer option
    beside its own; ``fn`` receives their values as ``options``, keyed by their path in TrainConfig."""
    return with_declared(_config_fields(command), SCALE_DEFAULTS if command == "scale" else None)


def check_before_ranks(command: str, params: dict) -> None:
    """`meshscale launch -- train|scale ...`: what each rank would check of its options before training, checked
    once in the launcher from the parsed ``params``, so that a bad model or value is one line before any rank
    starts. The world is torchrun's, made later: its checks (size, layout, GPU memory) stay with the ranks."""
    from meshscale.execute.world import gpu_count
    from meshscale.train.runner import validate_options

    options, own = declared_values(_config_fields(command), params)
    if command == "train":
        _check_resume(options)
    # the ranks' device, as `train.runner.run` resolves it under torchrun: GPUs where there are any, unless --cpus
    device = "cpu" if own.get("cpus") is not None or not gpu_count() else "cuda"
    batch = options[("batch_per_rank",)] or own.get("global_batch") or 1
    cfg = config_from_options({**options, ("batch_per_rank",): batch}, device=device)
    _check_extras(cfg)
    validate_options(cfg)


# the commands whose options `meshscale launch` checks beyond parsing them
CHECKS_BEFORE_RANKS = {"train": check_before_ranks, "scale": check_before_ranks}


def _check_resume(options: dict) -> None:
    """--resume with --steps not beyond the checkpoint's step would train nothing: say so before starting."""
    directory = options[("checkpoint", "dir")]
    if not options[("checkpoint", "resume")] or not directory:
        return
    from meshscale.train.checkpoint import latest_step
    try:
        step, steps = latest_step(directory), options[("steps",)]
    except (OSError, ValueError):
        raise MeshscaleError(f"--resume: {directory}/latest is not a readable step number; resume from a "
                             "complete checkpoint folder") from None
    if step is not None and steps <= step:
        raise MeshscaleError(f"--resume: the checkpoint in {directory} is at step {step} and --steps {steps} is not "
                             f"beyond it; give --steps more than {step} (steps count in all, also when resuming)")


@with_config_options("train")
def train(
    options: dict,
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPU count: train on this many GPUs (NCCL)", callback=checked(GPU_COUNT)),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="train on this many CPU processes (Gloo; default 1)", callback=checked(CPU_COUNT)),
    profile_batches: Optional[str] = typer.Option(None, "--profile-batches", help="profile ONE device at these batch sizes (e.g. 16,32,64,128); on a GPU also each kernel category's time at the largest", callback=checked(counts(1, MAX_BATCH))),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the Result (kind train) here", callback=checked(output_file())),
) -> None:
    """Train a model data-parallel, or a transformer under a parallel layout (--fsdp --tp --pp --cp --dp), and
    report loss, throughput and the compute / communication / data split."""
    from meshscale.execute.world import World, resolve_world  # torch: imported only when training
    from meshscale.train.runner import notices, profile, train as run_train

    _check_resume(options)
    world = resolve_world(gpus, cpus, default=World(1, "gloo"))
    if options[("eval_data",)] is None and options[("data",)] == "digits":
        options[("eval_data",)] = "digits-test"
    cfg = config_from_options({**options, ("logging", "progress"): True}, world=world.size, device=world.device)
    _check_extras(cfg)
    for line in notices(cfg, cfg.world):
        typer.echo(line, err=True)
    if profile_batches:
        result = profile(cfg, parse_ints(profile_batches, "--profile-batches"))
        _table("profile (one device)", result.rows, ("batch_per_rank", "step_time_s", "compute_s", "samples_per_s"))
        if "kernel_categories_missing" in result.meta:
            typer.echo(f"kernel categories not measured ({result.meta['kernel_categories_missing']}): the profile "
                       "calibrates as one factor", err=True)
    else:
        result = run_train(cfg)
        if int(os.environ.get("RANK", "0")) != 0:
            return
        print_tables(_summary_table(cfg, result.meta["summary"]))
    if cfg.logging.trace and Path(cfg.logging.trace).exists():
        typer.echo(f"wrote {cfg.logging.trace} (rank 0's steps: open it in https://ui.perfetto.dev or chrome://tracing)")
    if json_out:
        typer.echo(f"wrote {result.save(json_out)}")


@with_config_options("scale")
def scale(
    options: dict,
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU counts to sweep, e.g. 1,2,4,8", callback=checked(counts())),
    cpus: Optional[str] = typer.Option(None, "--cpus", help="CPU worker counts, e.g. 1,2,4 (default 1)", callback=checked(cpu_counts())),
    weak: bool = typer.Option(False, "--weak", help="weak scaling: --batch per data-parallel rank"),
    strong: bool = typer.Option(False, "--strong", help="strong scaling: --global-batch split over the workers"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="strong: samples per step over all data-parallel ranks (transformers: sequences)", callback=checked(GLOBAL_BATCH)),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the Result (kind scale) here", callback=checked(output_file())),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the scaling figure here (png/svg/pdf)", callback=checked(output_file(plot=True))),
    layouts: Optional[str] = typer.Option(None, "--layouts", help="transformers: run each layout, e.g. "
                                          "fsdp4,tp2xfsdp2,pp2xfsdp2 (world size: the product; --batch per "
                                          "data-parallel rank)"),
) -> None:
    """Weak or strong scaling over 1, 2, 4 ... workers (or, for a transformer, one run per --layouts entry): throughput beside meshscale's prediction for the
    topology the run used, speedup, efficiency, communication share. Under torchrun: a sweep inside its world
    (default 1, the ranks of one node, all ranks), over the hosts' joined topology; rank 0 prints."""
    from meshscale.train.runner import notices
    from meshscale.execute import in_torchrun  # torch: imported only when training
    from meshscale.execute.world import resolve_sweep, resolve_world
    from meshscale.train.scale import ScaleIncomplete, scale as run_scale, torchrun_worlds

    if layouts:
        _scale_layouts(options, layouts, gpus, cpus, json_out, csv_path)
        return
    if weak == strong:
        raise MeshscaleError("choose one of --weak (with --batch) or --strong (with --global-batch)")
    size = options[("batch_per_rank",)] if weak else global_batch
    if not size:
        raise MeshscaleError("--weak needs --batch N" if weak else "--strong needs --global-batch N")
    gpu_list, cpu_list = (parse_ints(gpus, "--gpus") if gpus else None), (parse_ints(cpus, "--cpus") if cpus else None)
    if in_torchrun():  # torchrun fixed the world: sweep inside it, on GPUs where there are any unless --cpus
        if gpu_list and cpu_list:
            raise MeshscaleError("give --gpus or --cpus, not both")
        sizes, device = torchrun_worlds(gpu_list or cpu_list), resolve_world(None, 1 if cpus else None).device
    else:
        worlds = resolve_sweep(gpu_list, cpu_list)
        sizes, device = [w.size for w in worlds], worlds[0].device
    rank0 = int(os.environ.get("RANK", "0")) == 0
    cfg = config_from_options({**options, ("batch_per_rank",): size}, device=device)
    _check_extras(cfg)
    for line in notices(cfg, sizes[-1]) if rank0 else ():
        typer.echo(line, err=True)
    console = text_console()
    try:
        result = run_scale(cfg, sizes, weak, size, on_row=lambda r: console.print(
            f"{r['world_size']} workers: {r['throughput_samples_per_s']:,.1f} samples/s"))
    except ScaleIncomplete as failed:  # the finished world sizes are shown and saved; the failure is the last line
        if rank0:
            _show_scale(failed.result, cfg.model, cfg.mode, weak, json_out, csv_path, plot)
        raise
    if rank0:
        _show_scale(result, cfg.model, cfg.mode, weak, json_out, csv_path, plot)


def _show_scale(result, model: str, mode: str, weak: bool, json_out: Path | None, csv_path: Path | None,
                plot: Path | None) -> None:
    """The sweep's table beside the prediction, and its files."""
    from meshscale import plots
    from meshscale.predict.sweep import predicted_beside

    result, note = predicted_beside(result)
    hosts = result.meta.get("hosts")
    where = f" on {len(hosts)} hosts ({', '.join(hosts)})" if hosts else ""
    _table(f"{model} {mode}: {'weak' if weak else 'strong'} scaling{where}", result.rows,
           ("world_size", "batch_per_rank", "global_batch", "throughput_samples_per_s", "predicted_samples_per_s",
            "prediction_error", "speedup", "efficiency", "step_time_s", *_split_keys(result.rows), "comm_share"))
    typer.echo(note)
    write_result_files(result, json_out, csv_path)
    if plot:
        typer.echo(f"wrote {plots.save(plots.scale_result_chart(result), plot)}")


def _scale_layouts(options: dict, text: str, gpus: Optional[str], cpus: Optional[str], json_out: Optional[Path],
                   csv_path: Optional[Path]) -> None:
    """`scale --layouts`: one row per layout of the same transformer, on GPUs with --gpus (else CPU workers)."""
    from meshscale.train.parallel.plan import parse_layouts
    from meshscale.train.scale import LAYOUT_ROW_KEYS, scale_layouts
    if gpus and cpus:
        raise MeshscaleError("give --gpus or --cpus, not both")
    given = parse_ints(gpus or cpus, "--gpus" if gpus else "--cpus") if (gpus or cpus) else None
    cfg = config_from_options({**options, ("batch_per_rank",): options[("batch_per_rank",)] or 1},
                              device="cuda" if gpus else "cpu")
    if not cfg.is_transformer:
        raise MeshscaleError(f"--layouts: {cfg.model} is not a transformer; give a preset (e.g. llama-tiny) or a "
                             "config.json")
    parsed = parse_layouts(text)
    if given is not None:
        for degrees in parsed:
            n = math.prod(degrees.values())
            if n not in given:
                raise MeshscaleError(f"--layouts: {'x'.join(f'{k}{v}' for k, v in degrees.items())} needs {n} "
                                     f"ranks, not among {gpus or cpus}")
    console = text_console()
    result = scale_layouts(cfg, parsed, on_row=lambda r: console.print(
        f"{r['layout']} on {r['world_size']}: {r['tokens_per_s'] or 0:,.0f} tokens/s"))
    # CPU workers have no CUDA context, allocator cache or NCCL buffers: the model's allocated peak alone
    rest = tuple(k for k in LAYOUT_ROW_KEYS if k not in SPLIT_KEYS and (gpus or k != "memory_needed_bytes"))
    at = rest.index("step_time_s") + 1
    _table(f"{cfg.model}: layouts", result.rows, rest[:at] + _split_keys(result.rows) + rest[at:])
    write_result_files(result, json_out, csv_path)


_LABELS = {"predicted_samples_per_s": "PREDICTED/s", "prediction_error": "error", "world_size": "N", "batch_per_rank": "batch/N", "global_batch": "global", "throughput_samples_per_s": "samples/s",
           "samples_per_s": "samples/s", "efficiency": "eff", "step_time_s": "step ms", "compute_s": "compute ms",
           "comm_s": "comm ms", "bubble_s": "bubble ms", "data_s": "data ms", "comm_share": "comm", "eval_accuracy": "test accuracy",
           "tokens_per_s": "tokens/s", "tokens_per_s_per_rank": "tokens/s per rank", "mfu": "MFU",
           "peak_allocated_bytes": "peak allocated GiB", "peak_reserved_bytes": "peak reserved GiB",
           "peak_rss_bytes": "peak RSS GiB (a CPU worker)",
           "build_peak_allocated_bytes": "build's peak allocated GiB", "step_peak_allocated_bytes": "steps' peak allocated GiB",
           "memory_needed_allocated_bytes": "PREDICTED allocated GiB",
           "memory_needed_bytes": "PREDICTED peak GiB (reserved, context, NCCL)", "idle_s": "idle ms",
           "split_step_time_s": "profiled step ms"}


def _moe_rows(moe: dict | None) -> list[tuple[str, str]]:
    """A mixture of experts' figures per step: token slots per expert over the layers (fewest to most, the most
    loaded over the mean in the worst layer), the balance loss, the experts' GEMM (the all-to-all is ep's row)."""
    if not moe:
        return []
    loads = [n for counts in moe["tokens_per_expert"].values() for n in counts]
    worst = moe["expert_load_max_over_mean"]
    return [("tokens per expert / step", f"{min(loads):.0f} to {max(loads):.0f} over {len(moe['tokens_per_expert'])} "
             f"MoE layers" + (f" (max/mean {worst:.2f}; dropless)" if worst else " (dropless)")),
            ("MoE balance loss", f"{moe['aux_loss']:.4g}"), ("experts GEMM", str(moe["experts_gemm"]))]

def _summary_table(cfg, s: dict) -> Table:
    """`train`'s table: throughput, the step figure beside its split from the same steps (the median timed step;
    a layout's profiled warm-up steps, with their own step time, the throughput window being unprofiled), memory
    measured beside the model's (its allocated peak; on a GPU the whole peak, with the allocator's cache, the
    CUDA context and NCCL's buffers, apart), each dimension's communication and a mixture of experts' figures."""
    table = Table(title=f"{cfg.model} {s.get('layout', cfg.mode)} on {cfg.world} "
                        f"{'GPU' if cfg.device == 'cuda' else 'CPU worker'}(s)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = []

    def add(key: str, label: str | None = None) -> None:
        if s.get(key) is not None:
            rows.append((label or _LABELS.get(key, key), _fmt(key, s[key])))
    for k in ("global_batch", "samples_per_s", "tokens_per_s", "tokens_per_s_per_rank"):
        add(k)
    apart = s.get("split_step_time_s") is not None and s.get("split_steps") and s["split_step_time_s"] != s["step_time_s"]
    timed = s.get("timed_steps")
    add("step_time_s", f"step ms (median of {timed} timed step{'s' if timed != 1 else ''})" if timed else None)
    if apart:  # the split's own step: its parts add up to it
        add("split_step_time_s", f"step ms of the split ({s['split_from']})")
    for k in ("data_s", "compute_s", "comm_s", "bubble_s", "idle_s", "comm_share"):
        add(k, "  " + _SPLIT_LABELS[k])
    for k in ("mfu", "peak_allocated_bytes", "peak_rss_bytes", "peak_reserved_bytes", "build_peak_allocated_bytes",
              "step_peak_allocated_bytes", "memory_needed_allocated_bytes", "eval_accuracy", "eval_loss"):
        add(k)
    if cfg.device == "cuda":  # the allocator's cache, the CUDA context and NCCL's buffers: a GPU's alone
        add("memory_needed_bytes")
    for label, value in rows:
        table.add_row(label, value)
    for dim, c in (s.get("comm_by_dimension") or {}).items():
        table.add_row(f"{dim} communication / step", _dimension_cell(c))
    for label, cell in _moe_rows(s.get("moe")):
        table.add_row(label, cell)
    return table


# the split's rows, under the step figure they add up to (the bubble is part of the exposed communication)
_SPLIT_LABELS = {"data_s": "data ms", "compute_s": "compute ms", "comm_s": "comm ms (exposed)",
                 "bubble_s": "  of it pipeline bubble ms", "idle_s": "idle ms (host between operators)",
                 "comm_share": "comm share of the step"}


SPLIT_KEYS = ("split_step_time_s", "data_s", "compute_s", "comm_s", "bubble_s", "idle_s")


def _split_keys(rows: list[dict]) -> tuple[str, ...]:
    """The split's columns; its own step column only where a row's split is of other steps than its step figure
    (a layout's profiled warm-up steps), so that each row's parts add up to a figure beside them."""
    apart = any(r.get("split_step_time_s") not in (None, r.get("step_time_s")) for r in rows)
    return tuple(k for k in SPLIT_KEYS if apart or k != "split_step_time_s")


def _dimension_cell(c: dict) -> str:
    """A dimension's operations and bytes, and (measured) its busy and exposed time, per step."""
    parts = [] if c.get("operations") is None else [f"{c['operations']:.0f} ops, {c['bytes'] / 1e6:.2f} MB"]
    if c.get("seconds") is not None:
        parts.append(f"{c['seconds'] * 1e3:.2f} ms")
    if c.get("exposed_seconds") is not None:
        parts[-1] += f" ({c['exposed_seconds'] * 1e3:.2f} exposed)"
    return ", ".join(parts)


def _check_extras(cfg) -> None:
    """An optional extra the run needs is missing: one line naming the pip command, before any rank starts."""
    from meshscale.train.data import require_scikit_learn
    from meshscale.train.step_log import require_tensorboard
    if any(str(name or "").startswith("digits") for name in (cfg.data, cfg.eval_data)):
        require_scikit_learn()
    if cfg.logging.tensorboard:
        require_tensorboard()


def _table(title: str, rows: list[dict], keys: tuple[str, ...]) -> None:
    keys = tuple(k for k in keys if any(r.get(k) is not None for r in rows))
    table = Table(title=title)
    for k in keys:
        table.add_column(_LABELS.get(k, k), justify="right")
    for r in rows:
        table.add_row(*(_fmt(k, r.get(k)) for k in keys))
    print_tables(table)


def _fmt(key: str, v) -> str:
    """Times in ms, shares in %, the rest short."""
    if v is None:
        return ""
    if key in ("step_time_s", "split_step_time_s", "compute_s", "comm_s", "bubble_s", "data_s", "idle_s"):
        return f"{v * 1e3:.2f}" if v < 0.01 else f"{v * 1e3:.1f}"
    if key.endswith("_bytes"):
        return f"{v / (1 << 30):.2f}"
    if key in ("comm_share", "efficiency", "eval_accuracy", "mfu"):
        return f"{v:.0%}"
    if key == "prediction_error":
        return f"{v:+.1%}"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:#.3g}"  # 39.0 stays 39.0, as the streamed lines print it
    return str(v)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command("train", short_help="Train data-parallel, or a transformer under a layout")(train)
    app.command("scale", short_help="Weak or strong scaling, or layouts, beside the prediction")(scale)
