"""Checkpoints that a resumed run continues from bit for bit (in deterministic mode), and that hold data only.

Layout: ``DIR/step-00000120/rank{r}.pt`` (every rank: its optimizer / shard state, scaler and torch RNG states;
rank 0 also the model), ``rank{r}.json`` (the step, the world size and the numpy and Python RNG states) and
``DIR/latest`` (the step of the newest complete checkpoint), written by rank 0 only after every rank has saved,
with an atomic rename. A crash mid-save therefore never hides the previous checkpoint. The data position is the
step number (batches are a function of seed and step).

Loading never runs code from the files: tensors are read with torch's weights-only loader, everything else is
JSON. A file holding anything else (a pickle of arbitrary objects) is refused with a one-line error."""
from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from meshscale.errors import MeshscaleError
from meshscale.safe_io import atomic_write, read_bytes, read_text
from meshscale.units import is_digits

KEEP = 2  # complete checkpoints kept on disk


def rng_state() -> tuple[dict, dict]:
    """This process's RNG states: the tensors (torch, CUDA) and the plain data (numpy, Python) apart."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    data = {"numpy": {"algorithm": algorithm, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached_gaussian)},
            "python": {"version": version, "state": list(internal), "gauss_next": gauss_next}}
    return tensors, data


def set_rng_state(tensors: dict, data: dict) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])
    n = data["numpy"]
    np.random.set_state((n["algorithm"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = data["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def latest_step(directory: str | Path) -> int | None:
    """The step of the newest complete checkpoint in ``directory``, or None."""
    marker = Path(directory) / "latest"
    if not marker.is_file():
        return None
    text = read_bytes(marker, "checkpoint marker", 4096).decode("utf-8", errors="replace").strip()
    if not is_digits(text):
        raise MeshscaleError(f"{marker} should hold a step number, not {text[:40]!r}; remove it or choose another "
                             "checkpoint directory")
    return int(text)


def save(directory: str | Path, step: int, rank: int, world: int, state: dict, barrier: Callable[[], None]) -> None:
    """Save this rank's ``state``; rank 0 then publishes the checkpoint as the latest and prunes old ones."""
    folder = Path(directory) / f"step-{step:08d}"
    rng_tensors, rng_data = rng_state()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / f"rank{rank}.pt", lambda tmp: _torch_save({**state, "rng": rng_tensors}, tmp))
        atomic_write(folder / f"rank{rank}.json",
                     lambda tmp: tmp.write_text(json.dumps({"step": step, "world": world, "rng": rng_data}) + "\n"))
    except (OSError, MeshscaleError) as exc:
        for empty in (folder, Path(directory)):  # what this save created and left empty
            try:
                empty.rmdir()
            except OSError:
                pass
        raise MeshscaleError(f"cannot save the checkpoint of step {step} in {directory}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    barrier()  # every rank's files are on disk before the marker moves
    if rank == 0:
        publish(directory, step)


def publish(directory: str | Path, step: int) -> None:
    """Once every rank has saved step ``step``: mark it the latest (atomically) and prune older checkpoints."""
    atomic_write(Path(directory) / "latest", lambda tmp: tmp.write_text(f"{step}\n"))
    old = sorted(Path(directory).glob("step-*"))[:-KEEP]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)


def save_sharded(directory: str | Path, step: int, module: Any, optimizer: Any, rank: int,
                 barrier: Callable[[], None]) -> None:
    """A parallel layout's checkpoint: each rank writes its shards of ``module`` and ``optimizer`` with
    torch.distributed.checkpoint (read back by any layout); rank 0 then publishes it as the latest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(Path(directory) / f"step-{step:08d}"))
    barrier()
    if rank == 0:
        publish(directory, step)


def load_sharded(directory: str | Path, module: Any, optimizer: Any) -> int:
    """Load the latest sharded checkpoint into ``module`` and ``optimizer`` (resharded to this layout); its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    step = latest_step(directory)
    if step is None:
        raise MeshscaleError(f"no checkpoint in {directory} to resume from; run without --resume first")
    model_state, optim_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(Path(directory) / f"step-{step:08d}"))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step


def _torch_save(state: dict, path: Path) -> None:
    try:
        torch.save(state, path)
    except RuntimeError as exc:  # torch's zip writer reports a short write (a full disk) as a RuntimeError
        raise OSError(f"writing failed, is the disk full? ({str(exc).strip()[:120]})") from None


def load(directory: str | Path, rank: int, world: int) -> dict:
    """This rank's state of the latest checkpoint, with ``model`` taken from rank 0's file and ``step`` (RNG
    states restored); a clear error if there is none or it holds anything but data."""
    step = latest_step(directory)
    if step is None:
        raise MeshscaleError(f"no checkpoint in {directory} to resume from; run without --resume first")
    folder = Path(directory) / f"step-{step:08d}"
    path = folder / f"rank{rank}.pt"
    if not path.is_file():
        raise MeshscaleError(f"checkpoint {folder} has no file for rank {rank}; resume with the world size it was saved with")
    meta = _read_meta(folder / f"rank{rank}.json")
    if meta["step"] != step:
        raise MeshscaleError(f"checkpoint {folder} records step {meta['step']}, not {step}; it was altered or mixed "
                             "with another run: start again without --resume")
    if meta["world"] != world:
        raise MeshscaleError(f"checkpoint {folder} was saved by {meta['world']} ranks, this run has {world}; "
                             "resume with the same world size")
    state = _read_tensors(path)
    if rank != 0:
        state["model"] = _read_tensors(folder / "rank0.pt").get("model")
    try:
        set_rng_state(state.pop("rng"), meta["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise MeshscaleError(f"checkpoint {folder} has unreadable RNG states ({exc}); "
                             "start again without --resume") from None
    state["step"] = meta["step"]
    return state


def load_weights(module: Any, weights: Any, directory: str | Path) -> None:
    """``module.load_state_dict(weights)``, or one line saying the checkpoint holds another model's weights."""
    try:
        module.load_state_dict(weights)
    except (RuntimeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        text = str(exc)
        missing, unexpected = text.count("Missing key"), text.count("Unexpected key")
        what = "other parameter names" if missing or unexpected else "parameters of other shapes"
        raise MeshscaleError(f"checkpoint in {directory} holds another model's weights ({what}); resume with the "
                             "--model and options it was saved with, or choose another --checkpoint-dir") from None


def _read_tensors(path: Path) -> dict:
    """A .pt file of tensors and plain containers, read without running any code it may hold."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # RNG states must stay on the CPU
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise MeshscaleError(f"cannot load {path}: not a meshscale checkpoint of tensors and plain data "
                             f"(refused, nothing in it was run: {first})") from None
    if not isinstance(state, dict):
        raise MeshscaleError(f"cannot load {path}: it holds a {type(state).__name__}, not a checkpoint")
    return state


def _read_meta(path: Path) -> dict:
    """A rank's JSON file: step, world size and RNG states, checked for their types."""
    if not path.exists():
        raise MeshscaleError(f"checkpoint {path.parent} has no {path.name}; it is incomplete or from an older "
                             "meshscale: start again without --resume")
    try:
        meta = json.loads(read_text(path, "checkpoint record"))
    except ValueError as exc:
        raise MeshscaleError(f"cannot read {path} ({exc})") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("step"), int) and isinstance(meta.get("world"), int)
            and isinstance(meta.get("rng"), dict)):
        raise MeshscaleError(f"{path} is not a meshscale checkpoint record (step, world, rng)")
    return meta
