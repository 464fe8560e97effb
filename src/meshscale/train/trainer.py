"""What one rank trains with, whatever splits the work: the model, the data's batches, the clock, precision and
capture settings, and the `Exchange` that turns gradients into updated weights (a data-parallel mode's, or a
parallel layout's engines: train/parallel/engine.py). `build` makes it; `step.py` runs its one step."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from meshscale.models.layout import ParallelLayout
from meshscale.models.registry import ModelSpec
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches
from meshscale.train.exchange import Exchange
from meshscale.train.graphed import GraphedStep
from meshscale.train.timing import Clock


@dataclass
class Trainer:
    """Everything a rank's steps use. ``model`` is the module whose weights are checkpointed (the bare model, or
    this rank's pipeline stages side by side); ``exchange.model`` is what the step calls (the model compiled and
    wrapped). ``graphed`` is set when the whole step is replayed from a CUDA graph."""

    cfg: TrainConfig
    spec: ModelSpec
    device: torch.device
    model: nn.Module
    exchange: Exchange
    batches: Batches
    clock: Clock
    scaler: torch.amp.GradScaler | None = None
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    graphed: GraphedStep | None = None

    @property
    def layout(self) -> ParallelLayout | None:
        """The parallel layout the exchange runs (None for the data-parallel modes)."""
        return self.exchange.layout

    @property
    def label(self) -> str:
        """How the run splits the work, as the progress and the rank's phase name it."""
        return self.layout.describe() if self.layout is not None else self.cfg.mode

    @property
    def per_step(self) -> dict[str, float]:
        """What a step processes, each reported as a rate: samples, and tokens for a layout run."""
        samples = self.cfg.global_batch
        if self.layout is None:
            return {"samples": samples}
        return {"samples": samples, "tokens": samples * self.spec.input_shape[0]}
