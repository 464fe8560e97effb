"""Step-time marks that mean the same on a CPU (wall clock) and a GPU (CUDA events on the compute stream, so a
mark taken after `work.wait()` lands after the communication the stream waited for)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch


def quiet_profiler() -> None:
    """Keep torch.profiler's engine (Kineto) off stderr: it prints a "USDT: ... profiler_start" and a
    "profiler_stop" line for every profiled window at every log level up to 5 (its STAGE and USDT lines; torch
    2.13), one pair per rank per run. Kineto reads KINETO_LOG_LEVEL when a profiler first starts in the
    process; a level the user set stands."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


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

    def wait(self, mark: Any) -> None:
        """Until the device has passed ``mark`` (the host clock's marks are passed when taken)."""
        if self.cuda:
            mark.synchronize()


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


@dataclass
class TimedStep:
    """A timed step's marks, read (`times`) once the device has passed the next step's start: a step is timed
    without stopping the host from queueing the next one, which a host-bound step (more launch time than kernel
    time) would pay in full at every step. ``per_step`` counts what the step processes ({"samples": 64}); each
    becomes a rate."""

    clock: Clock
    start: Any
    data_ready: Any
    end: Any
    marks: list | None = None        # the eager data-parallel step's marks (`step_split`)
    last_ready: Any = None
    per_step: dict[str, float] = field(default_factory=dict)

    def times(self, next_start: Any = None) -> dict[str, Any]:
        """step_time_s from this step's start to the next's (the step's period on the device), or to its own end
        for the last step before a checkpoint or the end; the rates; the data / compute / communication split."""
        until = self.end if next_start is None else next_start
        self.clock.wait(until)
        step_s = self.clock.seconds(self.start, until)
        return {"step_time_s": step_s, **{f"{k}_per_s": n / step_s for k, n in self.per_step.items()},
                **step_split(self.clock, self.start, self.data_ready, self.end, self.marks, self.last_ready)}


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
