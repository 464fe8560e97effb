"""The per-step rows of a run and where they go (rank 0): a JSONL file (flushed every line, so a crash loses
nothing written), TensorBoard (an optional extra), and a rich progress bar on the terminal."""
from __future__ import annotations

import json
from typing import Any

import torch

from meshscale.errors import MeshscaleError
from meshscale.safe_io import AppendLog


def require_tensorboard() -> None:
    """--tensorboard writes through TensorBoard, an optional extra: say how to install it, in one line."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise MeshscaleError("--tensorboard needs TensorBoard: pip install 'meshscale[tensorboard]'") from None


class StepLog:
    """``add(row, loss)`` once per step, ``flush()`` before a checkpoint and at the end, ``close()`` last.
    ``rows`` keeps every row. A row whose loss is still a device tensor waits, so that untimed steps cost no
    device sync: ``flush()`` reads all waiting losses with one. Every sink is optional."""

    def __init__(self, jsonl: str | None, tensorboard: str | None, progress: bool, total_steps: int, first_step: int,
                 title: str):
        self.rows: list[dict[str, Any]] = []
        self._waiting: list[tuple[dict[str, Any], torch.Tensor]] = []
        self._file = AppendLog(jsonl) if jsonl else None
        self._tb = None
        if tensorboard:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(tensorboard)
        self._bar = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 # redrawn when a row is written, not by a thread that takes the GIL from the
                                 # training loop ten times a second
                                 auto_refresh=False)
            self._task = self._bar.add_task(title, total=total_steps, completed=first_step, info="")
            self._bar.start()

    def add(self, row: dict[str, Any], loss: torch.Tensor | None = None) -> None:
        """Keep ``row``; write it now, or once ``loss`` (a tensor for its "loss") is read by `flush`."""
        self.rows.append(row)
        if loss is None:
            self._write(row)
        else:
            self._waiting.append((row, loss))

    def flush(self) -> None:
        if self._waiting:
            for (row, _), value in zip(self._waiting, torch.stack([v for _, v in self._waiting]).tolist()):
                row["loss"] = value
                self._write(row)
            self._waiting.clear()

    def _write(self, row: dict[str, Any]) -> None:
        if self._file:
            self._file.write_line(json.dumps(row))
        if self._tb:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, row["step"])
        if self._bar:
            info = f"loss {row['loss']:.4f}"
            if row.get("samples_per_s"):
                info += f"  {row['samples_per_s']:,.0f} samples/s"
                if row.get("comm_s") is not None:
                    info += f"  comm {row['comm_s'] * 1e3:.1f} ms"
            self._bar.update(self._task, completed=row["step"] + 1, info=info, refresh=True)

    def close(self) -> None:
        if self._file:
            self._file.close()
        if self._tb:
            self._tb.close()
        if self._bar:
            self._bar.stop()
