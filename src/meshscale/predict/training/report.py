"""The training predictions as a table (what the CLI prints), as rows of plain values, and as a Result."""
from __future__ import annotations

from rich.table import Table

from meshscale.models.memory import MEMORY_ACCOUNTING_UNCERTAINTY
from meshscale.predict.training.kernels import HOST_SECONDS_PER_OP
from meshscale.predict.training.step import TrainingPrediction, synced_step_seconds
from meshscale.results import Result

GIB = float(1 << 30)
# hosts issue eager ops at 5-20 us each on bare metal (NVIDIA's "CUDA Graph Best Practice for PyTorch") and were
# measured at 25-80 us on lent VMs (docs/results/validate-training.md): a step whose break-even is below this is
# said to be at risk of being host-bound
HOST_RISK_SECONDS_PER_OP = 50e-6


def host_bound_above(p: TrainingPrediction) -> tuple[int, float | None]:
    """The ops one rank issues a step, and the host time per op above which the host, not the GPU, would set
    the predicted step's pace (None for a CUDA graph)."""
    return p.host_ops, (p.step_s / p.host_ops if p.host_ops else None)


def prediction_row(p: TrainingPrediction, synced: bool = False) -> dict:
    """One prediction as a row of plain values (Result kind predict); ``synced``: with the step as a loop that
    syncs the device every step measures it (`train`'s timed mode)."""
    job, mem = p.job, p.memory
    row = {"model": job.name, "layout": job.layout.describe(), "world_size": p.allocation.world_size,
           "nodes": p.allocation.nodes, **{k: v for k, v in job.layout.degrees().items()},
           "pp_schedule": job.layout.pp_schedule, "micro_batches": job.layout.micro_batches,
           "batch_per_rank": job.batch, "global_batch": job.samples_per_step, "seq_len": job.seq_len,
           "precision": job.precision, "activation_checkpointing": job.checkpointing,
           "attention": p.rates.attention_kernel if job.model and p.rates else None,
           "step_time_s": p.step_s, "compute_s": p.compute_s, "throughput_samples_per_s": p.samples_per_s,
           "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu if job.seq_len else None, "mfu": p.mfu,
           "compute_source": p.compute_source, "gpu": p.gpu.model, "fits": p.memory_verdict, "why": p.why(),
           "memory_capacity_bytes": p.gpu.memory_bytes,
           "params": job.params(), "active_params": job.model.active_params() if job.model else job.params()}
    row.update({f"exposed_{k.replace(' ', '_').replace('/', '_')}_s": v for k, v in p.exposed().items()})
    row["host_ops_per_step"], row["host_bound_above_s_per_op"] = host_bound_above(p)
    if synced:
        row["synced_step_time_s"] = synced_step_seconds(p)
        row["synced_throughput_samples_per_s"] = job.samples_per_step / row["synced_step_time_s"]
    if mem is not None:
        low, high = mem.bounds()
        row.update(memory_peak_bytes=mem.total_bytes, memory_margin_bytes=p.memory_margin_bytes,
                   memory_allocated_bytes=mem.allocated_bytes, memory_reserved_bytes=mem.reserved_bytes,
                   memory_needed_low_bytes=low, memory_needed_high_bytes=high, memory_peak_moment=mem.peak.name,
                   memory_peak_stage=mem.stage, memory_outside_allocator_bytes=mem.outside_bytes,
                   memory_build_allocated_bytes=mem.moment_peak("build"),
                   memory_step_allocated_bytes=mem.moment_peak("forward", "backward", "optimizer"))
        row.update({f"memory_{k}_bytes": v for k, v in mem.breakdown().items()})
    return row


def training_result(predictions: list[TrainingPrediction], search: bool = False) -> Result:
    first = predictions[0]
    # one layout: also the step as `train`'s timed mode measures it (a search ranks steady throughput only)
    return Result("predict", [prediction_row(p, synced=not search) for p in predictions], True,
                  {"training": True, "search": search, "model": first.job.name, "system": first.allocation.system,
                   "allocation": first.allocation.describe(), "compute_source": first.compute_source,
                   "gpu": first.gpu.model})


# the columns that tell the layout table's rows apart: a narrow terminal folds them rather than leave them out
LAYOUT_IDENTITY = ("layout", "ckpt")


def experts_line(model) -> str:
    """A mixture of experts' size: its parameters, those a token passes through, its experts."""
    shared = f" + {model.shared_experts} shared" if model.shared_experts else ""
    return (f"{model.name}: {model.params() / 1e9:,.1f}B parameters, {model.active_params() / 1e9:,.1f}B active per "
            f"token ({model.experts} experts{shared}, top {model.experts_per_token}, {model.moe_layer_count()} of "
            f"{model.layers} layers)")


def layout_table(predictions: list[TrainingPrediction], search: bool = False, hidden: int = 0) -> tuple[Table, list[str]]:
    """The table and the lines under it (what wins and why, what does not fit)."""
    first = predictions[0]
    job = first.job
    tokens = bool(job.seq_len)
    shape = f"seq {job.seq_len}, {job.precision}" if tokens else f"{job.precision}"
    if tokens and job.attention != "sdpa":
        shape += f", {job.attention} attention"
    title = (f"{job.name} on {first.allocation.describe()}, {shape}"
             + (", every layout ranked" if search else "") + " - PREDICTED")
    table = Table(title=title)
    cols = (["#"] if search else []) + ["layout", "ckpt", "batch/rank", "tokens/s/GPU" if tokens else "samples/s",
                                        "step ms", "MFU", "peak GiB/GPU", "fits", "compute from", "exposed"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("layout", "ckpt", "compute from", "exposed", "fits") else "right")
    for i, p in enumerate(predictions, 1):
        rate = f"{p.tokens_per_s_per_gpu:,.0f}" if tokens else f"{p.samples_per_s:,.1f}"
        memory = f"{p.memory.total_bytes / GIB:,.1f}" if p.memory else "-"
        fits = fits_cell(p)
        cells = [p.job.layout.describe(), p.job.checkpointing, str(p.job.batch), rate, f"{p.step_s * 1e3:,.1f}",
                 f"{p.mfu:.1%}", memory, fits, p.compute_source, p.why()]
        table.add_row(*([str(i)] if search else []) + cells)
    lines = [experts_line(job.model)] if job.model is not None and job.model.is_moe else []
    if search:
        fitting = [p for p in predictions if p.fits]
        if fitting:
            best = fitting[0]
            lines.append(f"best: {best.job.layout.describe()}, {best.job.checkpointing} checkpointing: "
                         f"{best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {best.mfu:.1%}; {best.why()}")
        else:
            lines.append("no layout fits in memory; the smallest need is listed first")
        if hidden > 0:
            lines.append(f"({hidden} more layouts in the JSON; --top N shows more)")
        if any(p.memory is not None for p in predictions):
            lines.append(FITS_NOTE)
    else:
        synced = synced_step_seconds(first)
        rate = f"{first.tokens_per_s_per_gpu * first.step_s / synced:,.0f} tokens/s/GPU" if tokens else \
            f"{first.samples_per_s * first.step_s / synced:,.1f} samples/s"
        if synced > first.step_s * 1.01:  # a host-bound step: a loop that waits for the device each step pays more
            lines.append(f"synced every step: {rate}, {synced * 1e3:,.1f} ms/step (table: steady)")
        ops, above = host_bound_above(first)
        if above is not None and above < HOST_RISK_SECONDS_PER_OP:
            per_op = first.rates.host_s_per_op if first.rates is not None else HOST_SECONDS_PER_OP
            lines.append(f"host: eager PyTorch issues {ops:,} ops a step per rank, priced at {per_op * 1e6:.0f} us "
                         f"each; a host slower than {above * 1e6:.0f} us an op sets the pace instead; a profile of "
                         "this job on that machine (--profile) carries its host")
        if first.memory is not None:
            lines += memory_lines(first)
    return table, lines


FITS_NOTE = (f"fits: GiB to spare (negative: over); tight: within the allocator's cache and the model's "
             f"{MEMORY_ACCOUNTING_UNCERTAINTY:.0%} uncertainty")


def fits_cell(p: TrainingPrediction) -> str:
    """yes / tight / no with the margin in GiB (the device's memory less the predicted peak)."""
    if p.memory is None:
        return "-"
    verdict, margin = p.memory_verdict, p.memory_margin_bytes / GIB
    colour = {"yes": "", "tight": "[yellow]", "no": "[red]"}[verdict]
    return f"{colour}{verdict}[/] {margin:+,.1f}" if colour else f"{verdict} {margin:+,.1f}"


def memory_lines(p: TrainingPrediction) -> list[str]:
    """Where the peak is and what it holds: the moment, the allocated tensors by component; then the
    allocator's cache, the context and NCCL, against the GPU's memory, and the verdict."""
    m = p.memory
    parts = ", ".join(f"{k} {v / GIB:,.1f}" for k, v in sorted(m.peak.parts.items(), key=lambda kv: -kv[1])
                      if v >= 0.05 * GIB)
    where = f"stage {m.stage}'s " if p.job.layout.pp > 1 else ""
    verdict = {"yes": "fits", "no": "does not fit",
               "tight": f"tight (within the cache and the model's {MEMORY_ACCOUNTING_UNCERTAINTY:.0%} uncertainty)"
               }[p.memory_verdict]
    return [f"memory: {where}peak at {m.peak.name}, {m.allocated_bytes / GIB:,.1f} GiB allocated ({parts})",
            f"  + allocator cache {(m.reserved_bytes - m.allocated_bytes) / GIB:,.1f}, CUDA context and NCCL "
            f"{m.outside_bytes / GIB:,.1f} = {m.total_bytes / GIB:,.1f} GiB of {p.gpu.memory_bytes / GIB:,.1f}: "
            f"{verdict}"]