"""`meshscale validate --training`: every published run of the shipped corpus (predict/corpus/training.yaml)
predicted from its configuration alone (`price_run`), with the error per row, per GPU family and the geomean;
the "training" corpus of `corpus_check`, which counts the errors and holds the bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.models.transformer import config_from_fields
from meshscale.predict.corpus_check import CORPORA, error, validation_result
from meshscale.predict.question import PredictRequest
from meshscale.predict.request import predict_training
from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.models.memory import GIB, MemoryEstimate
from meshscale.predict.training.step import TrainingJob, TrainingPrediction, job_memory
from meshscale.results import Result
from meshscale.validation import load_structured, typed

TRAINING = CORPORA["training"]


def corpus_path() -> Path:
    return TRAINING.path()


@dataclass(frozen=True)
class PublishedRun:
    """One corpus row: the question as `meshscale predict` states it, and what the run measured."""

    row: int
    source: str
    publication: str     # the table's publication: the row's own, the file's, else its source up to the first comma
    request: PredictRequest
    gpu_model: str
    measured: float
    metric: str          # tokens_per_s_per_gpu | samples_per_s
    memory_gib: float | None = None   # the memory the publication states for the run, GiB
    memory_counts: str = "reserved"   # what that figure counts (MEMORY_COUNTS)


# What a published memory figure counts, and the estimate's figure it is held against: PyTorch's caching allocator's
# reserved peak (torch.cuda.max_memory_reserved; torchtitan's logged and tabled "memory", reserved_bytes.all.peak
# in GiB: components/metrics.py), its allocated peak (max_memory_allocated), or the device's (nvidia-smi: reserved
# with the CUDA context and NCCL's buffers, which are outside the allocator).
MEMORY_COUNTS = {"reserved": "reserved_bytes", "allocated": "allocated_bytes", "device": "total_bytes"}


def _memory_recipe(raw: dict) -> str:
    """The row's memory recipe (models/memory.RECIPES): its framework's where the framework fixes one (megatron,
    the ZeRO stages: one field says it), else the row's `memory_recipe` (meshscale's, torchtitan's and
    llm-foundry's eager steps hold memory differently), else meshscale's."""
    from meshscale.predict.training.framework import STEP_FRAMEWORKS

    fw = STEP_FRAMEWORKS.get(str(raw.get("framework", "eager")))
    if fw is not None and fw.memory_recipe:
        if "memory_recipe" in raw:
            raise ValueError(f"memory_recipe: framework {fw.name} holds memory as {fw.memory_recipe}; drop it")
        return fw.memory_recipe
    return str(raw.get("memory_recipe", "meshscale"))


def _run(raw: dict, row: int, shapes: dict, where: str, publication: str = "") -> PublishedRun:
    try:
        name = raw["model"]
        shape = None
        if name in shapes:
            shape = config_from_fields(name, {**shapes[name], "max_seq_len": raw["seq_len"]}, f"{where}: shape {name}")
        given = dict(raw.get("layout") or {})
        schedule = str(given.pop("pp_schedule", "1f1b"))
        virtual = given.pop("stages_per_rank", None)
        moe = {"ep": int(given.pop("ep", 0)) or None, "moe_imbalance": raw.get("moe_imbalance"),
               "fp8_recipe": raw.get("fp8_recipe"), "stages_per_rank": None if virtual is None else int(virtual)}
        gpus = int(raw["gpus"])
        degrees = {k: int(v) for k, v in given.items()} or {"dp": gpus}
        per_node = _gpus_per_node(str(raw["system"]))
        # the network of a run over nodes: as the row says, else NDR to every GPU (the corpus's assumption)
        network = {"link": raw.get("link", "ndr"), "nics": int(raw.get("nics", per_node))} if gpus > per_node else {}
        request = PredictRequest(
            model=name, system=raw["system"], gpus=(gpus,), gpu=str(raw["gpu"]), **network, batch=int(raw["batch"]), seq_len=int(raw.get("seq_len", 0)) or None,
            precision=raw["precision"], checkpointing=raw.get("checkpointing", "none"),
            channels_last=name.startswith("resnet"),  # the published ResNet runs are channels-last
            attention=str(raw.get("attention", "sdpa")), **degrees, pp_schedule=schedule,
            micro_batches=int(raw.get("micro_batches", 1)), shape=shape, autocast=typed(raw.get("autocast", False), f"{where}: run {row}: autocast", (bool,), "true or false"),
            sharding=str(raw.get("sharding", "fsdp2")), selective_policy=str(raw.get("selective_policy", "matmuls")),
            rotary=str(raw.get("rotary", "pairs")), framework=str(raw.get("framework", "eager")),
            cp_attention=raw.get("cp_attention"), memory_recipe=_memory_recipe(raw), **moe)
        measured = dict(raw["measured"])
        memory = measured.pop("memory_gib", None)
        (metric, value), = measured.items()
    except (KeyError, TypeError, ValueError) as e:
        raise MeshscaleError(f"{where}: run {row}: missing or malformed field ({e})") from None
    if metric not in ("tokens_per_s_per_gpu", "samples_per_s") or float(value) <= 0:
        raise MeshscaleError(f"{where}: run {row}: measured must be tokens_per_s_per_gpu or samples_per_s > 0")
    counts = _memory_counts(raw, memory, f"{where}: run {row}")
    source = str(raw.get("source", ""))
    publication = str(raw.get("publication") or publication or source.split(", ")[0])
    return PublishedRun(row, source, publication, request, str(raw["gpu"]), float(value), metric,
                        None if memory is None else float(memory), counts)


def _memory_counts(raw: dict, memory: object, where: str) -> str:
    """What the row's published memory counts (MEMORY_COUNTS; reserved unless the row says), checked: a positive
    figure, and no memory_counts without one."""
    counts = str(raw.get("memory_counts", "reserved"))
    if memory is None:
        if "memory_counts" in raw:
            raise MeshscaleError(f"{where}: memory_counts says what measured.memory_gib counts; the run states none")
        return counts
    if counts not in MEMORY_COUNTS:
        raise MeshscaleError(f"{where}: memory_counts {counts}: use one of {', '.join(MEMORY_COUNTS)}")
    if not isinstance(memory, (int, float)) or isinstance(memory, bool) or memory <= 0:
        raise MeshscaleError(f"{where}: measured.memory_gib must be a number of GiB > 0")
    return counts


@lru_cache(maxsize=None)
def _gpus_per_node(system: str) -> int:
    """GPUs per node of a catalog system, loaded once per process (every row names one of a few)."""
    return system_gpu(system)[1]


def load_training_corpus(path: str | Path | None = None) -> list[PublishedRun]:
    path = TRAINING.path(path)
    data = load_structured(path, "training corpus", yaml_ok=True)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise MeshscaleError(f"{path}: expected a mapping with a list of runs")
    return [_run(raw, i, data.get("shapes") or {}, str(path), str(data.get("publication") or ""))
            for i, raw in enumerate(data["runs"], 1)]


def run_memory(run: PublishedRun) -> tuple[MemoryEstimate, TrainingJob] | None:
    """The memory model's estimate of one corpus run from its configuration alone, without pricing its step
    (NCCL's communicators on their default channels); None for a model it has none for (image models)."""
    from meshscale.predict.request import layout_of, resolve_model, split_framework
    from meshscale.predict.training.moe import DEFAULT_IMBALANCE

    req = run.request
    model = resolve_model(req, req.model)
    if model.transformer is None:
        return None
    step, replicas = split_framework(req.framework)
    sharding = "fsdp2" if step != "eager" else req.sharding or ("none" if model.ddp or replicas else "fsdp2")
    layout = layout_of(req, req.gpus[0], "fsdp" if sharding != "none" else "dp")
    job = TrainingJob(model.transformer, layout, req.batch, req.seq_len or 0, req.precision, req.checkpointing,
                      autocast=model.autocast if req.autocast is None else req.autocast,
                      selective_policy=req.selective_policy, sharding=sharding, memory_recipe=req.memory_recipe,
                      moe_imbalance=req.moe_imbalance or DEFAULT_IMBALANCE, framework=step,
                      fp8_recipe=req.fp8_recipe or "tensorwise")
    return job_memory(job), job


def price_run(run: PublishedRun) -> TrainingPrediction:
    """The step model's prediction of one corpus run, from its configuration alone: `meshscale predict`'s own
    (`predict_training`), so the command and the validation give a run one figure."""
    return predict_training(run.request)[0][0]


def validate_training(path: str | Path | None = None) -> Result:
    """Predict every run; rows with measured, predicted and error; meta.summary per publication (each weighing
    the same in the bounded figure), per GPU family and overall."""
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
        rows.append({"row": run.row, "source": run.source, "publication": run.publication, "model": p.job.name, "gpu": gpu.model,
                     "family": gpu.family, "world_size": p.allocation.world_size,
                     "layout": p.job.layout.describe(), "seq_len": p.job.seq_len, "precision": p.job.precision,
                     "activation_checkpointing": p.job.checkpointing, "metric": run.metric,
                     "measured": run.measured, "predicted": predicted, "error": error(ratio), "ratio": ratio,
                     "mfu_predicted": p.mfu, "fits": p.memory_verdict, "throughput_samples_per_s": p.samples_per_s,
                     "memory_peak_bytes": p.memory.total_bytes if p.memory else None,
                     "memory_margin_bytes": p.memory_margin_bytes, **_memory_row(run, p.memory)})
    return validation_result(TRAINING, rows, where, training=True)


def _memory_row(run: PublishedRun, memory: MemoryEstimate | None) -> dict:
    """The run's published memory against the estimate's figure that counts the same (MEMORY_COUNTS), in GiB:
    memory_ratio predicted / published; nothing for a run that states none."""
    if run.memory_gib is None or memory is None:
        return {}
    predicted = getattr(memory, MEMORY_COUNTS[run.memory_counts]) / GIB
    ratio = predicted / run.memory_gib
    return {"memory_counts": run.memory_counts, "memory_published_gib": run.memory_gib,
            "memory_predicted_gib": predicted, "memory_error": error(ratio), "memory_ratio": ratio}
