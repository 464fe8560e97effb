"""Checkpoints that a resumed run continues from bit for bit (in deterministic mode).

Layout: ``DIR/step-00000120/rank{r}.pt`` (every rank: its optimizer / shard state, scaler and RNG states; rank 0
also the model) and ``DIR/latest`` (the step of the newest complete checkpoint), written by rank 0 only after
every rank has saved, with an atomic rename. A crash mid-save therefore never hides the previous checkpoint.
The data position is the step number (batches are a function of seed and step)."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from meshscale.errors import MeshscaleError

KEEP = 2  # complete checkpoints kept on disk


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_step(directory: str | Path) -> int | None:
    """The step of the newest complete checkpoint in ``directory``, or None."""
    marker = Path(directory) / "latest"
    return int(marker.read_text().strip()) if marker.is_file() else None


def save(directory: str | Path, step: int, rank: int, world: int, state: dict, barrier: Callable[[], None]) -> None:
    """Save this rank's ``state``; rank 0 then publishes the checkpoint as the latest and prunes old ones."""
    folder = Path(directory) / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_save({**state, "step": step, "world": world, "rng": rng_state()}, folder / f"rank{rank}.pt")
    barrier()  # every rank's file is on disk before the marker moves
    if rank == 0:
        tmp = Path(directory) / "latest.tmp"
        tmp.write_text(f"{step}\n")
        os.replace(tmp, Path(directory) / "latest")
        old = sorted(Path(directory).glob("step-*"))[:-KEEP]
        for d in old:
            shutil.rmtree(d, ignore_errors=True)


def load(directory: str | Path, rank: int, world: int) -> dict:
    """This rank's state of the latest checkpoint, with ``model`` taken from rank 0's file (RNG states
    restored); a clear error if there is none."""
    step = latest_step(directory)
    if step is None:
        raise MeshscaleError(f"no checkpoint in {directory} to resume from; run without --resume first")
    path = Path(directory) / f"step-{step:08d}" / f"rank{rank}.pt"
    if not path.is_file():
        raise MeshscaleError(f"checkpoint {path.parent} has no file for rank {rank}; resume with the world size it was saved with")
    state = torch.load(path, map_location="cpu", weights_only=False)  # RNG states must stay on the CPU
    if state["world"] != world:
        raise MeshscaleError(f"checkpoint {path.parent} was saved by {state['world']} ranks, this run has {world}; "
                             "resume with the same world size")
    if rank != 0:
        state["model"] = torch.load(path.parent / "rank0.pt", map_location="cpu", weights_only=False)["model"]
    set_rng_state(state["rng"])
    return state
