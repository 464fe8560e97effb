"""`train --trace FILE`: a Chrome trace (chrome://tracing, https://ui.perfetto.dev) of `TRACE_STEPS` training
steps of rank 0, from PyTorch's profiler. meshscale labels the phases of each step as profiler ranges: "data"
(the batch), "forward", "backward" (from the end of forward to the exchange's finish), "exchange finish" (waiting
for the gradients' communication), "optimizer" and "parameter pull" (parameter-server modes); the profiler adds
every collective itself ("gloo:all_reduce", "nccl:all_reduce": one per DDP bucket, launched during backward)
and, on GPUs, the kernels and copies.

The hook into the loop is one context manager around each step (`StepTracer.step`); the phases are labelled
by wrapping the Trainer's own calls for the traced steps only, so the loop and the step code stay as they are.
A step replayed from a CUDA graph shows as one replay (its phases run inside the graph)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.autograd.profiler import record_function

TRACE_STEPS = 3


class StepTracer:
    """Profiles steps ``first .. first + TRACE_STEPS - 1`` of rank 0 into ``path`` (nothing for other ranks or
    without a path)."""

    def __init__(self, path: str | None, rank: int, first: int, last_step: int, trainer: Any) -> None:
        self.path = Path(path) if path and rank == 0 else None
        self.first, self.last = first, min(first + TRACE_STEPS, last_step) - 1
        self.trainer = trainer
        self.profiler: Any = None
        self.restore: list[Callable[[], None]] = []
        self.open: dict[str, Any] = {}

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if self.path is None or not self.first <= step <= self.last:
            yield
            return
        if self.profiler is None:
            self._start()
        with record_function(f"step {step}"):
            yield
            self._end("backward")
        if step == self.last:
            self.close()

    def close(self) -> None:
        """Stop profiling (if it runs), undo the labels and write the trace."""
        if self.profiler is None:
            return
        for undo in reversed(self.restore):
            undo()
        self.restore.clear()
        self.profiler.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.path))
        self.profiler = None

    def _start(self) -> None:
        from meshscale.train.timing import quiet_profiler
        quiet_profiler()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.__enter__()
        t = self.trainer
        self._wrap(t.batches, "get", "data")
        self._wrap(t.exchange, "finish", "exchange finish", before=lambda: self._end("backward"))
        self._wrap(t.exchange, "update", "optimizer")
        self._wrap(t.exchange, "pull", "parameter pull")
        model = t.exchange.model
        handles = [model.register_forward_pre_hook(lambda *a: self._begin("forward")),
                   model.register_forward_hook(lambda *a: (self._end("forward"), self._begin("backward")) and None)]
        self.restore += [h.remove for h in handles]

    def _wrap(self, owner: Any, name: str, label: str, before: Callable[[], None] | None = None) -> None:
        """``owner.name`` labelled ``label`` while traced (an attribute on the instance, removed afterwards)."""
        if not hasattr(owner, name):
            return
        original = getattr(owner, name)

        def labelled(*args: Any, **kwargs: Any) -> Any:
            if before:
                before()
            with record_function(label):
                return original(*args, **kwargs)
        setattr(owner, name, labelled)
        self.restore.append(lambda: delattr(owner, name) if name in vars(owner) else None)

    def _begin(self, label: str) -> None:
        self._end(label)
        self.open[label] = record_function(label)
        self.open[label].__enter__()

    def _end(self, label: str) -> None:
        region = self.open.pop(label, None)
        if region is not None:
            region.__exit__(None, None, None)
