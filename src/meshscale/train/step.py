"""One training step, for the data-parallel modes and the parallel layouts alike: forward and backward (or the
pipeline schedule), the gradient exchange, the optimizer update, the parameter pull (parameter server) — and
around it, the learning rate, the batch and the step's timing."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.profiler import record_function

from meshscale.train.data import Dataset
from meshscale.train.graphed import set_lr
from meshscale.train.parallel.breakdown import DATA_LABEL
from meshscale.train.timing import Clock, TimedStep
from meshscale.train.trainer import Trainer


def loss_fn(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (per next token for token models), in fp32 whatever the outputs' dtype."""
    if kind == "tokens":
        return F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
    return F.cross_entropy(out.float(), y)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`loss_fn` of a token model, as a pipeline schedule calls it."""
    return loss_fn("tokens", logits, targets)


def forward_backward(t: Trainer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """This rank's loss of (x, y) and its gradients (the exchange's hooks start sending them as they appear);
    zero on a rank that computes no loss (a dedicated parameter server, a pipeline stage without the head)."""
    ex = t.exchange
    if not ex.computes:  # a dedicated parameter server: it only takes part in the exchange
        return torch.zeros((), device=t.device)
    if ex.schedule is not None:  # pipeline stages: the schedule runs every micro-batch's forward and backward
        losses: list[torch.Tensor] = []
        ex.schedule.step(*((x,) if ex.first_stage else ()), **({"target": y, "losses": losses} if ex.last_stage else {}))
        return torch.stack(losses).mean().detach() if losses else torch.zeros((), device=t.device)
    with t.autocast():
        loss = loss_fn(t.spec.input_kind, ex.model(x), y)
    (t.scaler.scale(loss) if t.scaler is not None else loss).backward()
    return loss


def train_step(t: Trainer, x: torch.Tensor, y: torch.Tensor, marks: list | None = None) -> torch.Tensor:
    """One step on (x, y); returns this rank's loss. ``marks`` (eager timing) collects clock marks after
    backward, the exchange, the update and the pull."""
    t.exchange.zero_grad()
    t.exchange.last_ready = None
    loss = forward_backward(t, x, y)
    _mark(t.clock, marks)
    t.exchange.finish()
    _mark(t.clock, marks)
    t.exchange.update(t.scaler)
    _mark(t.clock, marks)
    t.exchange.pull()
    _mark(t.clock, marks)
    return loss


def _mark(clock: Clock, marks: list | None) -> None:
    if marks is not None:
        marks.append(clock.mark())


def run_step(t: Trainer, step: int, lr: float) -> tuple[dict[str, Any], torch.Tensor, TimedStep | None]:
    """Step ``step`` at learning rate ``lr``: its row, its loss tensor (the exchange's: a layout's is the global
    batch's; a CUDA graph's is overwritten by the next replay) and, when timing is on, its marks (read once the
    device has passed the next step's start)."""
    set_lr(t.exchange.optimizer, lr)
    if not t.cfg.timing:  # nothing on the host beyond what a plain loop does: no clock marks
        x, y = _batch(t, step)
        loss = t.graphed(x, y) if t.graphed is not None else train_step(t, x, y)
        return {"step": step, "lr": lr}, t.exchange.reduce_loss(loss), None
    t0 = t.clock.mark()
    x, y = _batch(t, step)   # images come in the model's memory format (Batches)
    t_data = t.clock.mark()
    marks: list | None = [] if t.graphed is None and t.exchange.timed_phases else None
    loss = t.graphed(x, y) if t.graphed is not None else train_step(t, x, y, marks)
    timed = TimedStep(t.clock, t0, t_data, t.clock.mark(), marks, t.exchange.last_ready, t.per_step)
    return {"step": step, "lr": lr}, t.exchange.reduce_loss(loss), timed


def _batch(t: Trainer, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    if t.layout is None:  # no profiled steps to split (the range costs microseconds of host time per step)
        return t.batches.get(step)
    with record_function(DATA_LABEL):   # a layout's profiled steps' data time (train/parallel/breakdown.py)
        return t.batches.get(step)


def evaluate(model: nn.Module, data: Dataset, kind: str, device: torch.device, batch: int = 256) -> dict[str, float]:
    """Accuracy (images) and mean loss over ``data``."""
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, data.n, batch):
            idx = torch.arange(start, min(start + batch, data.n)).numpy()
            x, y = (v.to(device) for v in data.fetch(idx))
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
