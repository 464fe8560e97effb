"""meshscale predict layer: `PredictRequest` states a prediction as the command line does, `predict_rows`
computes its rows. Imported on first use, so that importing a submodule stays light."""
from __future__ import annotations

from typing import Any

__all__ = ["PredictRequest", "predict_rows"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from meshscale.predict import request
        return getattr(request, name)
    raise AttributeError(f"module 'meshscale.predict' has no attribute {name!r}")
