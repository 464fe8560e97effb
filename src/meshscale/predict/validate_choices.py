"""`meshscale validate --choices`: the algorithm, protocol and channels NCCL logged for each call beside the ones
NCCL's cost model picks for the same call (``corpus/nccl-choices-h200x2/``, SOURCES.md tells the run); the
"choices" corpus of `corpus_check`.

Each file is NCCL's own log (NCCL_DEBUG_SUBSYS=TUNING, rank 0) of one collective swept 1 KiB - 1 GiB on 2 H200,
NCCL 2.28.9: ``AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..23}``. A choice is right or
wrong, so the bound is every size: the model picks NCCL's algorithm and protocol at each one. Channels are
reported, not bounded: NCCL splits some calls over fewer channels than its tuning gives the size (22 of 24).
"""
from __future__ import annotations

import re
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.predict.corpus_check import CORPORA, validation_result
from meshscale.results import Result

SYSTEM, RANKS, NCCL_VERSION = "hgx-h200", [0, 1], "2.28.9"  # the run the logs are of (SOURCES.md)
NAMES = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce"}
LINE = re.compile(r"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
MIN_BYTES = 1024  # the harness's own smaller calls (its checks) are not the sweep's
CHOICES = CORPORA["choices"]


def choices_dir() -> Path:
    return CHOICES.path()


def _logged(directory: Path) -> list[tuple[str, int, str, str, int]]:
    """(collective, nccl-tests' size, algorithm, protocol, channels) of every sweep call NCCL logged."""
    calls = []
    for path in sorted(directory.glob("*-choices.txt")):
        collective = path.name[:-len("-choices.txt")]
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = LINE.search(line)
            if not found:
                raise MeshscaleError(f"{path}, line {number}: not an NCCL tuning line (Func: N Bytes -> Algo ...)")
            func, nbytes, algo, proto, lo, hi = found.groups()
            # NCCL logs an all-gather's send and a reduce-scatter's receive count; nccl-tests' size is the whole buffer
            total = int(nbytes) * (len(RANKS) if collective in ("all_gather", "reduce_scatter") else 1)
            if NAMES.get(func) == collective and total >= MIN_BYTES:
                calls.append((collective, total, algo.lower(), proto.lower(), int(hi) - int(lo) + 1))
    if not calls:
        raise MeshscaleError(f"{directory}: no *-choices.txt file with NCCL tuning lines")
    return calls


def validate_choices(directory: str | Path | None = None) -> Result:
    """One row per logged call with the model's pick; meta.summary per collective and whether every algorithm and
    protocol is NCCL's."""
    from meshscale.simulate import nccl
    from meshscale.topology import load_system

    topo = load_system(SYSTEM)
    directory = CHOICES.path(directory)
    rows = []
    for collective, nbytes, algo, proto, channels in _logged(directory):
        p = nccl.predict(topo, collective, RANKS, nbytes, nccl_version=NCCL_VERSION)
        rows.append({"row": len(rows) + 1, "collective": collective, "size_bytes": nbytes, "logged_algo": algo,
                     "logged_proto": proto, "logged_channels": channels, "predicted_algo": p.algo.lower(),
                     "predicted_proto": p.proto.lower(), "predicted_channels": p.channels,
                     "channel_gap": abs(p.channels - channels), "same": (p.algo.lower(), p.proto.lower()) == (algo, proto)})
    return validation_result(CHOICES, rows, directory, choices=True, system=SYSTEM, nccl_version=NCCL_VERSION)


__all__ = ["validate_choices"]
