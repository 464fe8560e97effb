"""Step-time marks that mean the same on a CPU (wall clock) and a GPU (CUDA events on the compute stream, so a
mark taken after `work.wait()` lands after the communication the stream waited for)."""
from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """``mark()`` returns a time stamp; ``seconds(a, b)`` the time between two (after ``sync()`` on a GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
