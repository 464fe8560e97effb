"""``--cuda-graph``: the whole training step — forward, backward, the gradient all-reduces, the optimizer —
captured once in a CUDA graph and replayed every step after.

Why: in strong scaling the per-GPU batch shrinks while the number of kernels per step does not, so the host's
launch cost (thousands of kernels, each a few microseconds of Python, autograd and CUDA driver work) becomes a
visible share of a 20-30 ms step. A replay launches the step in one call. The rules of whole-network capture
(torch.cuda.graphs docs) are kept: eager warm-up steps on a side stream first (DDP needs 11 before its buckets
are final), static input buffers, autocast without its cast cache, an optimizer whose learning rate is a
device tensor (`tensor_lr`), and no host synchronization inside the step.
"""
from __future__ import annotations

from typing import Callable

import torch

from meshscale.errors import MeshscaleError

# DDP rebuilds its buckets after the first iterations; torch's docs ask for 11 eager DDP steps before capture.
EAGER_STEPS = {"ddp": 11, "allreduce": 3}


def check_graphable(mode: str, device: str, precision: str, compile_mode: str | None) -> None:
    """Reject what a captured step cannot do, with the alternative."""
    if device != "cuda":
        raise MeshscaleError("--cuda-graph needs GPUs; drop it for CPU workers")
    if mode not in EAGER_STEPS:
        raise MeshscaleError(f"--cuda-graph captures the ddp and allreduce modes, not {mode}; use --mode allreduce")
    if precision == "fp16":
        raise MeshscaleError("--cuda-graph cannot capture fp16 loss scaling (it reads the scale on the host); "
                             "use --precision bf16")
    if compile_mode:
        raise MeshscaleError("--cuda-graph and --compile both want the step: use one (--compile reduce-overhead "
                             "graphs the compiled model only)")


def tensor_lr(device: torch.device) -> torch.Tensor:
    """A learning rate the captured optimizer reads from device memory, so a schedule can change it per step."""
    return torch.zeros((), dtype=torch.float32, device=device)


def set_lr(optimizer: torch.optim.Optimizer | None, lr: float) -> None:
    """Set every group's learning rate: in place where it is a device tensor (a captured step reads it).
    None (a worker of a dedicated parameter server holds no optimizer) is left alone."""
    for group in optimizer.param_groups if optimizer is not None else []:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


class GraphedStep:
    """Calls ``body(x, y) -> loss`` eagerly for the first ``eager_steps`` calls (on a side stream), then
    captures it once and replays it: every call after returns the same static loss tensor, updated."""

    def __init__(self, body: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], eager_steps: int,
                 side: torch.cuda.Stream | None = None):
        self.body, self.eager_steps, self.calls = body, eager_steps, 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.side = side if side is not None else torch.cuda.Stream()
        self.static_x = self.static_y = self.loss = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.graph is None and self.calls <= self.eager_steps:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                loss = self.body(x, y).detach()  # detached: no autograd graph (and its AccumulateGrad nodes) outlives the step
            torch.cuda.current_stream().wait_stream(self.side)
            return loss
        if self.graph is None:
            self._capture(x, y)
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.graph.replay()
        return self.loss

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.static_x, self.static_y = torch.empty_like(x), torch.empty_like(y)
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        torch.cuda.synchronize()  # nothing of the eager steps (NCCL included) may still run when capture starts
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self.side):  # the stream the warm-up steps ran on
            self.loss = self.body(self.static_x, self.static_y).detach()
