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


def step_split(clock: Clock, begin: Any, data_ready: Any, end: Any, marks: list | None, last_ready: Any) -> dict:
    """A step's data / compute / exposed-communication seconds (after ``clock.sync()``). ``marks`` are the eager
    step's marks after backward, the exchange, the update and the pull; ``last_ready`` the exchange's mark of
    the last gradient ready. Exposed communication = last gradient ready -> exchange done, plus the pull. One
    graph replay (no marks): compute and communication are not separable from outside."""
    split = {"data_s": clock.seconds(begin, data_ready)}
    if not marks:
        return {**split, "compute_s": clock.seconds(data_ready, end), "comm_s": None}
    backward, exchanged, updated, pulled = marks
    ready = last_ready if last_ready is not None else backward
    return {**split, "compute_s": clock.seconds(data_ready, ready) + clock.seconds(exchanged, updated),
            "comm_s": clock.seconds(ready, exchanged) + clock.seconds(updated, pulled)}


class Window:
    """The throughput window: wall time from the start of step ``first_step`` to ``stop()`` (device synced)."""

    def __init__(self, clock: Clock, first_step: int):
        self.clock, self.first_step = clock, first_step
        self._start: float | None = None
        self.seconds = 0.0

    @property
    def started(self) -> bool:
        return self._start is not None

    def at_step(self, step: int) -> None:
        if step == self.first_step:
            self.clock.sync()
            self._start = time.perf_counter()

    def stop(self) -> None:
        self.clock.sync()
        if self._start is not None:
            self.seconds = time.perf_counter() - self._start
