"""Layer 3b: run schedules and collectives for real over torch.distributed (NCCL on GPUs, Gloo on CPUs).

The names resolve on first use so that commands which only parse options (or never launch ranks) do not pay
for importing torch."""
from __future__ import annotations

import importlib
from typing import Any

from meshscale.execute.world import in_torchrun

__all__ = ["launch", "Interrupted", "RankContext", "WorkerError", "in_torchrun"]


def __getattr__(name: str) -> Any:
    if name in ("launch", "Interrupted", "RankContext", "WorkerError"):
        return getattr(importlib.import_module("meshscale.execute.launcher"), name)
    raise AttributeError(f"module 'meshscale.execute' has no attribute {name!r}")
