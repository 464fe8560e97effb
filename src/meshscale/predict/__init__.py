"""meshscale predict layer: `PredictRequest` states a prediction as the command line does; `answer` gives its
one answer (`predict_training` one layout, `predict_rows` a sweep, both the one step model). Imported on first
use, so that importing a submodule stays light."""
from __future__ import annotations

from typing import Any

_WHERE = {"PredictRequest": "question", "answer": "answer", "predict_training": "request", "predict_rows": "sweep",
          "prediction_result": "sweep"}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        from importlib import import_module
        return getattr(import_module(f"meshscale.predict.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'meshscale.predict' has no attribute {name!r}")
