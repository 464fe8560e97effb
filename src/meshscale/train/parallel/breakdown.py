"""Where a layout step's time goes, measured: a few steps under torch.profiler, their communication attributed to
the parallel dimension whose process group ran it, set against the compute on the same timeline.

The timeline of one rank (spans in wall-clock seconds):
- compute: on a GPU the kernels that are not NCCL's; on a CPU the main thread's operators, less the time inside
  communication operators (issuing, waiting: c10d::*, _c10d_functional::*) and less the data's.
- data: the step's batch (`DATA_LABEL`, a profiler range around it).
- each dimension's communication: its collectives from start to end (Gloo: the work's range on Gloo's threads;
  NCCL: the kernel), matched to the flight recorder's entries, which name the process group, in order of issue
  and kind; Gloo's point-to-point operations (not in the recorder) are the pipeline's.
A dimension's busy time is the union of its communication spans; its exposed time the part of that union neither
compute nor data covers: what the rank could not hide. The bubble (pp > 1) is the exposed time of the pipeline's
receives: the stage waiting for its neighbour's activations or gradients (and their transfer). The step splits
into data + compute + exposed communication (any dimension) + idle, idle being the rest: the host between
operators, and on a CPU a collective's own copies while no operator runs. Every span is clipped to the profiled
steps, so the four parts add up to their step time."""
from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from meshscale.models.layout import ParallelLayout
from meshscale.train.parallel.comm import entry_dimension, recorded_entries
from meshscale.train.timing import Clock, quiet_profiler

DATA_LABEL = "meshscale: data"
_COMM_OPS = ("c10d::", "_c10d_functional::", "c10d_functional::", "gloo:", "nccl:", "record_param_comms")
# a collective's kind, as the recorder's "gloo:all_gather" and a kernel's "ncclDevKernel_AllGather_RING_LL" both
# say it (longest names first: "allgather" before "gather")
_KINDS = ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "barrier", "reduce", "gather",
          "scatter", "send", "recv")

Span = tuple[float, float]


@dataclass
class DimensionTime:
    """One dimension's communication per step on this rank, seconds."""

    busy_s: float = 0.0          # the union of its communication spans
    exposed_s: float = 0.0       # the part of it neither compute nor data covers


@dataclass
class StepBreakdown:
    """Per step, averaged over the profiled steps of one rank."""

    steps: int
    step_time_s: float
    data_s: float
    compute_s: float
    exposed_comm_s: float        # any dimension's exposed communication (their union)
    idle_s: float                # the rest of the step
    bubble_s: float | None       # pp > 1: the pipeline receives' exposed time
    dimensions: dict[str, DimensionTime] = field(default_factory=dict)


# ---- spans -----------------------------------------------------------------------------------------------------
def union(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(spans: Iterable[Span]) -> float:
    return sum(end - start for start, end in union(spans))


def minus(spans: Iterable[Span], cover: Iterable[Span]) -> list[Span]:
    """The parts of ``spans`` outside ``cover``."""
    out, cover, i = [], union(cover), 0
    for start, end in union(spans):  # both sorted: one pass over the cover
        while i < len(cover) and cover[i][1] <= start:
            i += 1
        j = i
        while j < len(cover) and cover[j][0] < end and start < end:
            if cover[j][0] > start:
                out.append((start, cover[j][0]))
            start = max(start, cover[j][1])
            j += 1
        if start < end:
            out.append((start, end))
    return out


class StepProfile:
    """Runs ``steps`` (consecutive) of this rank under torch.profiler (CPU activity, and CUDA on a GPU) and leaves
    their `StepBreakdown` in ``result`` (None until the last of them ends, or with no steps)."""

    def __init__(self, steps: range, clock: Clock, layout: ParallelLayout):
        self.steps, self.clock, self.layout = steps, clock, layout
        self.result: StepBreakdown | None = None
        self._profiler: Any = None
        self._start_s = 0.0

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        if step == self.steps[0]:
            from torch.profiler import ProfilerActivity, profile
            quiet_profiler()
            self.clock.sync()
            self._profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.clock.cuda
                                                                          else []))
            self._profiler.__enter__()
            self._start_s = time.time()
        yield
        if step == self.steps[-1]:
            self.clock.sync()
            end_s = time.time()
            self._profiler.__exit__(None, None, None)
            self.result = breakdown(trace_events(self._profiler), recorded_entries(), self.layout,
                                    (self._start_s, end_s), len(self.steps))
            self._profiler = None


# ---- the profile -----------------------------------------------------------------------------------------------
def trace_events(prof: Any) -> list[dict[str, Any]]:
    """The complete events of a finished torch.profiler run, times in wall-clock seconds (``start_s``, ``end_s``)."""
    with tempfile.TemporaryDirectory(prefix="meshscale-profile-") as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    base_ns = trace.get("baseTimeNanoseconds", 0)  # the trace's microseconds count from this wall-clock time
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and "dur" in e:
            start = (base_ns + e["ts"] * 1e3) / 1e9
            out.append({**e, "start_s": start, "end_s": start + e["dur"] / 1e6})
    return out


def _kind(name: str) -> str:
    flat = name.lower().replace("_", "")
    kind = next((k for k in _KINDS if k in flat), flat)
    # a batch of sends and receives (the pipeline's batch_isend_irecv) is recorded as one coalesced operation
    return "p2p" if kind in ("send", "recv") or kind.endswith("coalesced") else kind


def _receives(name: str) -> bool:
    """Whether an operation waits for a peer's data: a receive, or a batch of point-to-point operations."""
    return "recv" in name or _kind(name) == "p2p" and "coalesced" in name.lower()


def _span(e: dict[str, Any]) -> Span:
    return e["start_s"], e["end_s"]


def clip(spans: Iterable[Span], window: Span) -> list[Span]:
    """The parts of ``spans`` inside ``window``: what the split counts of a span that began before the profiled
    steps or ended after them, so that the parts never add up to more than the steps took."""
    return [(max(a, window[0]), min(b, window[1])) for a, b in spans if min(b, window[1]) > max(a, window[0])]


def _match(entries: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """Each recorder entry (in order of issue) with the first unmatched communication event of its kind that did
    not start before it was issued; a process group runs its operations in that order."""
    pending = sorted(events, key=lambda e: e["start_s"])
    used = [False] * len(pending)
    pairs = []
    for entry in sorted(entries, key=lambda e: e["time_created_ns"]):
        created, kind = entry["time_created_ns"] / 1e9 - 1e-3, _kind(entry.get("profiling_name", ""))
        for i, e in enumerate(pending):
            if not used[i] and e["start_s"] >= created and _kind(e["name"]) == kind:
                used[i] = True
                pairs.append((entry, e))
                break
    return pairs


def breakdown(events: list[dict[str, Any]], entries: list[dict[str, Any]], layout: ParallelLayout,
              window: Span, steps: int) -> StepBreakdown:
    """The per-step breakdown of ``steps`` steps profiled over ``window`` (wall-clock seconds), from the profile's
    ``events`` (`trace_events`) and the flight recorder's ``entries``."""
    on_device = any(e.get("cat") == "kernel" for e in events)
    main = [e for e in events if e.get("tid") == e.get("pid") and e.get("cat") in ("cpu_op", "user_annotation")]
    data = [_span(e) for e in main if e["name"] == DATA_LABEL]
    if on_device:
        kernels = [e for e in events if e.get("cat") == "kernel"]
        compute = [_span(e) for e in kernels if not e["name"].lower().startswith("nccl")]
        comm_events = [e for e in kernels if e["name"].lower().startswith("nccl")]
        p2p_events: list[dict[str, Any]] = []
    else:
        ops = [e for e in main if e.get("cat") == "cpu_op"]
        waits = [_span(e) for e in ops if e["name"].startswith(_COMM_OPS)]
        compute = minus([_span(e) for e in ops if not e["name"].startswith(_COMM_OPS)], waits + data)
        gloo = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")]
        comm_events = [e for e in gloo if _kind(e["name"]) != "p2p"]
        p2p_events = [e for e in gloo if _kind(e["name"]) == "p2p"]  # not in Gloo's recorder: the pipeline's
    lo_ns, hi_ns = window[0] * 1e9, window[1] * 1e9
    spans: dict[str, list[Span]] = {}
    receives: list[Span] = []
    for entry, e in _match([x for x in entries if lo_ns <= x.get("time_created_ns", 0) <= hi_ns], comm_events):
        dim = entry_dimension(entry, layout)
        if dim is not None:
            spans.setdefault(dim, []).append(_span(e))
            if _receives(entry.get("profiling_name", "")):
                receives.append(_span(e))
    if p2p_events and layout.pp > 1:
        spans.setdefault("pp", []).extend(_span(e) for e in p2p_events)
        receives += [_span(e) for e in p2p_events if _receives(e["name"])]
    data, compute, receives = clip(data, window), clip(compute, window), clip(receives, window)
    spans = {dim: clip(s, window) for dim, s in spans.items()}
    hidden = compute + data
    dims = {dim: DimensionTime(length(s) / steps, length(minus(s, hidden)) / steps) for dim, s in spans.items()}
    step_s = (window[1] - window[0]) / steps
    data_s, compute_s = length(data) / steps, length(minus(compute, data)) / steps
    exposed = length(minus([x for s in spans.values() for x in s], hidden)) / steps
    return StepBreakdown(steps, step_s, data_s, compute_s, exposed, max(0.0, step_s - data_s - compute_s - exposed),
                         length(minus(receives, hidden)) / steps if layout.pp > 1 else None, dims)


def mean_breakdown(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' breakdowns (as dicts) averaged: a dimension's figure over the ranks that have it."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    out: dict[str, Any] = {}
    for key in (f.name for f in fields(StepBreakdown) if f.name != "dimensions"):
        values = [p[key] for p in parts if p.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    dims: dict[str, list[dict[str, float]]] = {}
    for p in parts:
        for dim, t in p["dimensions"].items():
            dims.setdefault(dim, []).append(t)
    out["dimensions"] = {dim: {k: sum(t[k] for t in ts) / len(ts) for k in asdict(DimensionTime())}
                         for dim, ts in dims.items()}
    return out
