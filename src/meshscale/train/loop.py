"""The per-rank training loop: build the model and its gradient exchange, run the steps, time each one
(data / compute / exposed communication), log, checkpoint, and resume."""
from __future__ import annotations

import contextlib
import os
import time
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from meshscale.errors import MeshscaleError
from meshscale.train import checkpoint
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches, Dataset, open_data
from meshscale.train.exchange import flat_params, make_exchange
from meshscale.train.graphed import EAGER_STEPS, GraphedStep, set_lr, tensor_lr
from meshscale.train.step_log import StepLog
from meshscale.train.models import ModelSpec, get_model, image_spec
from meshscale.train.timing import Clock


def resolve(cfg: TrainConfig) -> tuple[ModelSpec, Dataset]:
    """The model (adapted to the data's image shape and classes) and the training data."""
    spec = get_model(cfg.model)
    shape = spec.input_shape
    if cfg.image_size and spec.input_kind == "image":
        shape = (shape[0], cfg.image_size, cfg.image_size)
    data = open_data(cfg.data, spec.input_kind, shape, spec.num_classes)
    if spec.input_kind == "image" and (data.sample_shape != spec.input_shape or data.num_classes != spec.num_classes):
        spec = image_spec(spec, *data.sample_shape, data.num_classes)
    return spec, data


def optimizer_factory(cfg: TrainConfig, spec: ModelSpec, graph_device: torch.device | None = None):
    """A function params -> optimizer (the PS owners build theirs over their shard). With ``graph_device``
    the optimizer can be captured in a CUDA graph: learning rate in device memory, fused SGD / capturable AdamW."""
    name = cfg.optimizer or spec.optimizer
    lr = tensor_lr(graph_device) if graph_device is not None else 0.0
    graph = {} if graph_device is None else {"fused": True} if name == "sgd" else {"capturable": True}
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **graph)
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, **graph)
    raise MeshscaleError(f"unknown optimizer {name!r}; choose sgd or adamw")


def learning_rate(cfg: TrainConfig, spec: ModelSpec, step: int) -> float:
    """Linear scaling with the global batch and a linear warm-up (Goyal et al. 2017)."""
    default = spec.base_lr if (cfg.optimizer or spec.optimizer) == spec.optimizer else (0.1 if cfg.optimizer == "sgd" else 3e-4)
    base = cfg.base_lr if cfg.base_lr is not None else default
    lr = base * cfg.global_batch / cfg.ref_batch
    if cfg.lr_warmup_steps:
        lr *= min(1.0, (step + 1) / cfg.lr_warmup_steps)
    return lr


def loss_fn(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "tokens":
        return F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
    return F.cross_entropy(out.float(), y)


def schedule_allreduce(cfg: TrainConfig, world: int):
    """The collective of the allreduce mode: None (native ``dist.all_reduce``) or, for ``schedule[:ALGO]``,
    meshscale's schedule executor running algorithm ALGO (default ring). The executor is blocking, so a bucket
    is reduced when it is launched and the returned handle is None (overlap then comes only from the CPU
    running ahead of the device)."""
    if cfg.collective == "native":
        return None
    kind, _, algo = cfg.collective.partition(":")
    if kind != "schedule":
        raise MeshscaleError(f"unknown collective {cfg.collective!r}; choose native or schedule[:ALGO] (e.g. schedule:ring)")
    from meshscale.execute.schedule_runner import schedule_op
    ops: dict = {}

    def allreduce(tensor: torch.Tensor, async_op: bool = True) -> None:
        key = (tensor.numel(), tensor.dtype)
        if key not in ops:  # one plan per bucket size, built on first use
            op = schedule_op("all_reduce", list(range(world)), tensor.numel() * tensor.element_size(), algo or "ring",
                             elem_bytes=tensor.element_size())
            ops[key] = (op, torch.empty_like(tensor))
        op, out = ops[key]
        op(tensor, out)
        tensor.copy_(out)
        return None
    return allreduce


def _deterministic(device: torch.device) -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False


def evaluate(model: nn.Module, data: Dataset, kind: str, device: torch.device, batch: int = 256) -> dict[str, float]:
    """Accuracy (images) and mean loss over ``data``."""
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, data.n, batch):
            idx = torch.arange(start, min(start + batch, data.n)).numpy()
            x, y = (t.to(device) for t in data.fetch(idx))
            out = model(x)
            loss_sum += loss_fn(kind, out, y).item() * len(idx)
            if kind == "image":
                correct += (out.argmax(1) == y).sum().item()
            n += len(idx)
    model.train()
    result = {"eval_loss": loss_sum / n}
    if kind == "image":
        result["eval_accuracy"] = correct / n
    return result


def _flush(pending: list, log: StepLog | None) -> None:
    """Read the losses of untimed steps (one device sync for all) into their rows and log them."""
    if pending:
        for (row, _), value in zip(pending, torch.stack([v for _, v in pending]).tolist()):
            row["loss"] = value
            if log is not None:
                log.write(row)
        pending.clear()


def train_worker(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """One rank of a training run (started by `meshscale.execute.launch`). Rank 0 returns the per-step rows."""
    device, rank, world = ctx.device, ctx.rank, ctx.world_size
    ctx.phase("building the model")
    if cfg.deterministic:
        _deterministic(device)
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    spec, data = resolve(cfg)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = spec.build().to(device)
    if cfg.channels_last and spec.input_kind == "image":
        model = model.to(memory_format=torch.channels_last)
    clock = Clock(device)
    graph_mode = cfg.cuda_graph and device.type == "cuda"
    # whole-step capture wants the exchange (DDP) built on a side stream (torch.cuda.graphs docs)
    side = torch.cuda.Stream(device) if graph_mode else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    # compile the bare model, then wrap it: the exchanges' hooks see ordinary parameters and checkpoints keep the
    # model's own keys. (DDP + compile scales poorly either way on 2 H200, 1.00-1.10x; allreduce + compile 1.64x.)
    compiled = torch.compile(model, mode=None if cfg.compile == "default" else cfg.compile) if cfg.compile else model
    # a captured step records no timing events inside it: the exchange then gets a host clock and no timing hook
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        exchange = make_exchange(cfg.mode, compiled, optimizer_factory(cfg, spec, device if graph_mode else None),
                                 Clock(torch.device("cpu")) if graph_mode else clock, rank, world, device,
                                 bucket_cap_mb=cfg.bucket_cap_mb, bucket_view=cfg.bucket_view, static_graph=cfg.static_graph,
                                 fusion_bytes=int(cfg.fusion_mb * (1 << 20)), compression=cfg.compression,
                                 allreduce=schedule_allreduce(cfg, world), max_staleness=cfg.max_staleness,
                                 timing=cfg.timing and not graph_mode, ps_servers=cfg.ps_servers)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    # capture needs autocast without its weight-cast cache (torch.cuda.graphs docs)
    autocast = (partial(torch.autocast, device.type, dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float16,
                        cache_enabled=not graph_mode)
                if cfg.precision in ("bf16", "fp16") else contextlib.nullcontext)

    def step_body(x: torch.Tensor, y: torch.Tensor, marks: list | None = None) -> torch.Tensor:
        """One training step on (x, y): forward, backward, exchange, update, pull. ``marks`` (eager timing)
        collects clock marks after backward, the exchange, the update and the pull."""
        def mark() -> None:
            if marks is not None:
                marks.append(clock.mark())
        exchange.zero_grad()
        exchange.last_ready = None
        if exchange.computes:
            with autocast():
                loss = loss_fn(spec.input_kind, exchange.model(x), y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        else:  # a dedicated parameter server: it only takes part in the exchange
            loss = torch.zeros((), device=device)
        mark()
        exchange.finish()
        mark()
        exchange.update(scaler)
        mark()
        exchange.pull()
        mark()
        return loss
    graphed = GraphedStep(step_body, EAGER_STEPS[cfg.mode], side) if graph_mode else None
    # servers fetch (and ignore) a worker's batches: every rank walks the same steps
    batches = Batches(data, cfg.batch_per_rank, rank % cfg.workers, cfg.workers, cfg.seed, device)

    start = 0
    from meshscale.execute import in_torchrun
    if cfg.checkpoint_dir and (cfg.resume or (in_torchrun() and checkpoint.latest_step(cfg.checkpoint_dir) is not None)):
        ctx.phase("loading the checkpoint")
        state = checkpoint.load(cfg.checkpoint_dir, rank, world)
        model.load_state_dict(state["model"])
        exchange.load_state_dict(state["exchange"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        start = state["step"]

    log = StepLog(cfg.log, cfg.tensorboard, cfg.progress, cfg.steps, start,
                  f"{cfg.model} {cfg.mode} x{world}") if rank == 0 else None
    rows: list[dict[str, Any]] = []
    pending: list[tuple[dict, torch.Tensor]] = []  # untimed mode: losses read only at checkpoints and the end
    max_param_diff = 0.0
    # a graphed run's timed window starts after its capture step, whatever --timing-warmup says
    warmup = max(cfg.timing_warmup, EAGER_STEPS[cfg.mode] + 1) if graphed is not None else cfg.timing_warmup
    timed_from = min(start + warmup, cfg.steps - 1)
    window_start = None
    try:
        for step in range(start, cfg.steps):
            ctx.phase(f"training step {step} ({cfg.mode})")
            if cfg.fault_step == step and rank == world - 1:
                os._exit(17)  # fault injection for the tests: die without a word, as a killed worker does
            if step == timed_from:
                clock.sync()
                window_start = time.perf_counter()
            lr = learning_rate(cfg, spec, step)
            set_lr(exchange.optimizer, lr)
            wall0 = time.perf_counter()
            t0 = clock.mark()
            x, y = batches.get(step)
            if cfg.channels_last and spec.input_kind == "image":
                x = x.contiguous(memory_format=torch.channels_last)
            t_data = clock.mark()
            marks: list | None = [] if cfg.timing and graphed is None else None
            loss = graphed(x, y) if graphed is not None else step_body(x, y, marks)
            t_end = clock.mark()
            row: dict[str, Any] = {"step": step, "lr": lr}
            if cfg.timing:
                clock.sync()
                step_s = time.perf_counter() - wall0
                row.update(loss=loss.item(), step_time_s=step_s, samples_per_s=cfg.global_batch / step_s,
                           data_s=clock.seconds(t0, t_data))
                if marks:  # eager: exposed communication = last gradient ready -> exchange done, plus the pull
                    t_bwd, t_fin, t_upd, t_pull = marks
                    ready = exchange.last_ready if exchange.last_ready is not None else t_bwd
                    row.update(compute_s=clock.seconds(t_data, ready) + clock.seconds(t_fin, t_upd),
                               comm_s=clock.seconds(ready, t_fin) + clock.seconds(t_upd, t_pull))
                else:  # one graph replay: compute and communication are not separable from outside
                    row.update(compute_s=clock.seconds(t_data, t_end), comm_s=None)
            if cfg.verify_sync:
                flat = flat_params(model.parameters())
                ref = flat.clone()
                dist.broadcast(ref, 0)
                max_param_diff = max(max_param_diff, (flat - ref).abs().max().item())
            rows.append(row)
            if cfg.timing:
                if rank == 0:
                    log.write(row)
            else:
                # a graph's loss tensor is overwritten by the next replay: keep a copy
                pending.append((row, loss.clone() if graphed is not None else loss.detach()))
            done = step + 1
            if cfg.checkpoint_dir and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == cfg.steps):
                ctx.phase(f"saving the checkpoint of step {done}")
                _flush(pending, log)
                state = {"model": model.state_dict() if rank == 0 else None, "exchange": exchange.state_dict(),
                         "scaler": scaler.state_dict() if scaler is not None else None}
                checkpoint.save(cfg.checkpoint_dir, done, rank, world, state, ctx.barrier)
        clock.sync()
        window_s = time.perf_counter() - window_start if window_start is not None else 0.0
        _flush(pending, log)
    finally:
        if log is not None:
            log.close()
    timed = cfg.steps - timed_from if window_start is not None else 0
    summary: dict[str, Any] = {"rank": rank, "steps": len(rows), "first_step": start, "max_param_diff": max_param_diff,
                               "timed_steps": timed,
                               "samples_per_s": cfg.global_batch * timed / window_s if window_s > 0 else None,
                               "params": spec.params, "flops_per_sample": spec.flops_per_sample}
    if rank == 0 and cfg.eval_data:
        ctx.phase("evaluating")
        summary.update(evaluate(model, open_data(cfg.eval_data, spec.input_kind, spec.input_shape, spec.num_classes),
                                spec.input_kind, device))
    out = {"summary": summary, "rows": rows if rank == 0 else []}
    if cfg.return_params and rank == 0:
        out["params"] = flat_params(model.parameters()).cpu().numpy()  # a tensor would travel by fd passing, which dies with the rank
    del exchange, model, compiled, graphed, step_body  # free the DDP reducer before the group goes (teardown deadlock)
    return out
