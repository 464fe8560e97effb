"""When backward completes each gradient, measured: the predictor's overlap of a gradient exchange with backward
depends on it, and counting it in FLOPs misses the memory-bound work (a 50k-token vocabulary's loss and head
take half of GPT-2 small's backward on an H200, a quarter of its FLOPs). One device, the run's model, precision
and batch: each parameter's post-accumulate hook marks the time (CUDA events on a GPU, the clock on a CPU), and
the share of the backward pass done by then is the median over a few steps."""
from __future__ import annotations

import statistics
import time
from functools import lru_cache

import torch

from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches, synthetic
from meshscale.models.registry import get_model
from meshscale.train.builders import build_model
from meshscale.train.step import loss_fn


class _Marks:
    """Timestamps in stream order: CUDA events on a GPU, read after a sync; the wall clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, mark) -> float:
        return start.elapsed_time(mark) * 1e-3 if self.cuda else mark - start


def gradient_readiness(cfg: TrainConfig, batch: int, steps: int = 5, warmup: int = 2) -> list[tuple[int, float]]:
    """(elements, share of backward done when its gradient is complete) per parameter, in parameter order."""
    device = torch.device("cuda", 0) if cfg.device == "cuda" else torch.device("cpu")
    spec = get_model(cfg.model)
    torch.manual_seed(0)
    model = build_model(spec).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    x, y = Batches(synthetic(spec.input_kind, spec.input_shape, spec.num_classes), batch, 0, 1, 0, device).get(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.speed.precision)
    marks = _Marks(device)
    ready: dict[int, object] = {}
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: ready.__setitem__(id(p), marks.now()))
    shares: list[list[float]] = []
    for step in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        ready.clear()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(spec.input_kind, model(x), y)
        start = marks.now()
        loss.backward()
        end = marks.now()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= warmup:
            total = marks.seconds(start, end)
            shares.append([min(1.0, max(0.0, marks.seconds(start, ready[id(p)]) / total)) for p in params])
    out = [(p.numel(), statistics.median(s[i] for s in shares)) for i, p in enumerate(params)]
    del model, params, x, y, loss
    if device.type == "cuda":  # this runs in the launching process: give the memory back to the runs it starts
        torch.cuda.empty_cache()
    return out


@lru_cache(maxsize=16)
def traced_gradients(model: str) -> tuple[tuple[int, float], ...]:
    """A registry model's gradient tensors and their readiness, traced, as (elements, share of backward's FLOPs
    done when the gradient is complete) in parameter order: the model built on the meta device (no memory, no
    compute) runs forward and backward on one sample under torch's FLOP counter, and each parameter's
    post-accumulate hook records the backward FLOPs counted when its gradient is complete. An oracle for the
    step model's own readiness by layer (`predict.gradient_tensors`)."""
    from torch.utils.flop_counter import FlopCounterMode

    spec = get_model(model)
    with torch.device("meta"):
        module = build_model(spec)
        sample = torch.zeros((1, *spec.input_shape), dtype=torch.long if spec.input_kind == "tokens" else torch.float)
    params = [p for p in module.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False)
    done_flops: dict[int, int] = {}
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: done_flops.__setitem__(id(p), counter.get_total_flops()))
    with counter:
        out = module(sample)
        forward_flops = counter.get_total_flops()
        out.float().sum().backward()
    backward_flops = counter.get_total_flops() - forward_flops
    if backward_flops <= 0 or len(done_flops) != len(params):
        raise ValueError(f"{model}: backward FLOPs could not be traced")
    return tuple((p.numel(), (done_flops[id(p)] - forward_flops) / backward_flops) for p in params)
