"""`meshscale validate --training`: every published run of the shipped corpus (predict/corpus/training.yaml)
predicted from its configuration alone (`price_run`), with the error per row, per GPU family and the geomean;
the "training" corpus of `corpus_check`, which counts the errors and holds the bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import config_from_fields, load_model_config
from meshscale.predict.corpus_check import CORPORA, error, validation_result
from meshscale.predict.training.comm import Placement
from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.predict.training.request import RESNETS
from meshscale.predict.training.step import TrainingJob, TrainingPrediction, predict_step
from meshscale.results import Result
from meshscale.validation import load_structured

TRAINING = CORPORA["training"]


def corpus_path() -> Path:
    return TRAINING.path()


@dataclass(frozen=True)
class PublishedRun:
    """One corpus row: the job, where it ran, and what it measured."""

    row: int
    source: str
    job: TrainingJob
    placement: Placement
    gpu_model: str
    measured: float
    metric: str          # tokens_per_s_per_gpu | samples_per_s


def _run(raw: dict, row: int, shapes: dict, where: str) -> PublishedRun:
    try:
        name = raw["model"]
        if name in RESNETS:
            model, depth = None, RESNETS[name]
        elif name in shapes:
            model, depth = config_from_fields(name, {**shapes[name], "max_seq_len": raw["seq_len"]},
                                              f"{where}: shape {name}"), 0
        else:
            model, depth = load_model_config(name), 0
        given = dict(raw.get("layout") or {})
        schedule = str(given.pop("pp_schedule", "1f1b"))
        counts = {k: int(v) for k, v in given.items()}
        gpus = int(raw["gpus"])
        if not counts:
            counts = {"dp": gpus}
        layout = ParallelLayout(**counts, micro_batches=int(raw.get("micro_batches", 1)), pp_schedule=schedule)
        job = TrainingJob(model, layout, int(raw["batch"]), int(raw.get("seq_len", 0)), raw["precision"],
                          raw.get("checkpointing", "none"), depth, True, bool(raw.get("autocast", False)),
                          selective_policy=str(raw.get("selective_policy", "matmuls")),
                          sharding=str(raw.get("sharding", "fsdp2")), rotary=str(raw.get("rotary", "pairs")),
                          attention=str(raw.get("attention", "sdpa")))
        _, per_node = system_gpu(raw["system"])
        placement = Placement(raw["system"], min(gpus, per_node), max(1, gpus // per_node), raw.get("link", "ndr"),
                              int(raw.get("nics", per_node)))
        (metric, value), = raw["measured"].items()
    except (KeyError, TypeError, ValueError) as e:
        raise MeshscaleError(f"{where}: run {row}: missing or malformed field ({e})") from None
    if metric not in ("tokens_per_s_per_gpu", "samples_per_s") or float(value) <= 0:
        raise MeshscaleError(f"{where}: run {row}: measured must be tokens_per_s_per_gpu or samples_per_s > 0")
    return PublishedRun(row, str(raw.get("source", "")), job, placement, str(raw["gpu"]), float(value), metric)


def load_training_corpus(path: str | Path | None = None) -> list[PublishedRun]:
    path = TRAINING.path(path)
    data = load_structured(path, "training corpus", yaml_ok=True)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise MeshscaleError(f"{path}: expected a mapping with a list of runs")
    return [_run(raw, i, data.get("shapes") or {}, str(path)) for i, raw in enumerate(data["runs"], 1)]


def price_run(run: PublishedRun) -> TrainingPrediction:
    """The step model's prediction of one corpus run, from its configuration alone."""
    return predict_step(run.job, run.placement, gpu_spec({"model": run.gpu_model}))


def validate_training(path: str | Path | None = None) -> Result:
    """Predict every run; rows with measured, predicted and error; meta.summary per GPU family and overall."""
    where = TRAINING.path(path)
    rows = []
    for run in load_training_corpus(where):
        gpu = gpu_spec({"model": run.gpu_model})
        try:
            p = price_run(run)
        except MeshscaleError as e:   # a field the step model refuses: say which run
            raise MeshscaleError(f"{where}: run {run.row}: {e}") from None
        predicted = p.tokens_per_s_per_gpu if run.metric == "tokens_per_s_per_gpu" else p.samples_per_s
        ratio = predicted / run.measured
        rows.append({"row": run.row, "source": run.source, "model": run.job.name, "gpu": gpu.model,
                     "family": gpu.family, "world_size": run.placement.world_size,
                     "layout": run.job.layout.describe(), "seq_len": run.job.seq_len, "precision": run.job.precision,
                     "activation_checkpointing": run.job.checkpointing, "metric": run.metric,
                     "measured": run.measured, "predicted": predicted, "error": error(ratio), "ratio": ratio,
                     "mfu_predicted": p.mfu, "fits": p.fits, "throughput_samples_per_s": p.samples_per_s})
    return validation_result(TRAINING, rows, where, training=True)
