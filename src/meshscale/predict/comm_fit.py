"""Fit the one free knob of the exchange model, ``comm_scale`` (achieved vs simulated exchange time), to
measured throughputs: least squares on the log of predicted / measured, over a bounded range."""
from __future__ import annotations

import math
from typing import Callable

from scipy.optimize import minimize_scalar

from meshscale.errors import MeshscaleError


def fit_comm_scale(predict: Callable[[float], list[float]], measured: list[float],
                   bounds: tuple[float, float] = (0.05, 50.0)) -> float:
    """The ``comm_scale`` whose predictions ``predict(scale)`` best match ``measured`` (same order)."""
    if not measured or min(measured) <= 0:
        raise MeshscaleError("calibration needs positive measured throughputs")

    def loss(log_scale: float) -> float:
        return sum(math.log(p / m) ** 2 for p, m in zip(predict(math.exp(log_scale)), measured))

    best = minimize_scalar(loss, bounds=tuple(math.log(b) for b in bounds), method="bounded",
                           options={"xatol": 1e-4})
    return float(math.exp(best.x))
