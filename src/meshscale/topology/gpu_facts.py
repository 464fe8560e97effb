"""The table of known GPU models (gpu_models.yaml): each model's facts by the name NVML gives it, and its MIG
profiles. Apart from discovery so that the readers of system files can look facts up without importing it."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

GPU_MODELS_FILE = Path(__file__).with_name("gpu_models.yaml")


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    return yaml.load(GPU_MODELS_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: faster


def gpu_models() -> tuple[list[dict], dict]:
    """(rows, default) of the table of known GPU models: each row a name pattern, its facts and their source."""
    table = _table()
    return table["models"], table["default"]


def mig_table(family: str) -> list[dict]:
    """The MIG profiles of a family of GPUs (a model's ``mig`` fact) as the table lists them."""
    return _table()["mig_profiles"][family]["profiles"]


def model_facts(model: str) -> tuple[dict, bool]:
    """(facts, known) for a GPU model name as NVML spells it: the first table row whose pattern it matches,
    else the table's stated default (known False)."""
    rows, default = gpu_models()
    row = next((r for r in rows if re.search(r["match"], model, re.IGNORECASE)), None)
    return dict(row or default), row is not None
