"""The best layout for a model on a number of GPUs at a global batch: every layout the model and the fabric
allow, each predicted, ranked by tokens per second among those that fit in memory.

Candidates: tp a divisor of the GPUs per node (a tp group spanning nodes is never faster than one inside),
pp and cp powers of two, the rest of the world split between FSDP shards and replicas in powers of two, the
three checkpointing policies, and for pipelines 1F1B and interleaved 1F1B (two virtual stages per rank) with
one sequence per micro-batch; for a mixture of experts every expert-parallel degree that is a power of two
dividing the experts and the data-parallel ranks it borrows. Layouts the model cannot run (heads, layers,
sequence, experts) are left out silently; those that fit in memory with room come first, then those within
the memory model's uncertainty ("tight").
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product

from meshscale.errors import MeshscaleError
from meshscale.models.layout import CHECKPOINTING, ParallelLayout
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import GpuSpec
from meshscale.predict.training.step import Calibration, TrainingJob, TrainingPrediction, check_job, predict_step

MAX_PP = 32
MAX_CP = 16


def _powers(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _expert_degrees(job: TrainingJob, borrowable: int) -> list[int]:
    """Expert-parallel degrees to try: 1, and for a mixture of experts the powers of two dividing its experts and
    the data-parallel ranks (`check_ep` leaves out the rest)."""
    if job.model is None or not job.model.is_moe:
        return [1]
    return [n for n in _powers(min(job.model.experts, borrowable)) if job.model.experts % n == 0 and borrowable % n == 0]


def candidate_layouts(job: TrainingJob, world: int, gpus_per_node: int, global_batch: int) -> list[TrainingJob]:
    """Every job of ``job``'s model and step shape on ``world`` GPUs at ``global_batch`` sequences per step that
    passes the layout's checks."""
    jobs = []
    for tp in [t for t in _powers(gpus_per_node) if gpus_per_node % t == 0]:
        for pp in _powers(min(MAX_PP, world // tp)):
            for cp in _powers(min(MAX_CP, world // (tp * pp))):
                rest = world // (tp * pp * cp)
                if tp * pp * cp * rest != world:
                    continue
                for fsdp in [f for f in _powers(rest) if rest % f == 0]:
                    dp = rest // fsdp
                    if global_batch % (dp * fsdp):
                        continue
                    batch = global_batch // (dp * fsdp)
                    schedules = [("1f1b", 1), ("interleaved-1f1b", 2)] if pp > 1 else [("1f1b", 1)]
                    for (schedule, v), ep in product(schedules, _expert_degrees(job, dp * fsdp * cp)):
                        layout = ParallelLayout(dp=dp, fsdp=fsdp, tp=tp, pp=pp, cp=cp, pp_schedule=schedule,
                                                micro_batches=batch if pp > 1 else 1, stages_per_rank=v, ep=ep)
                        for checkpointing in CHECKPOINTING:
                            candidate = replace(job, layout=layout, batch=batch, checkpointing=checkpointing)
                            try:
                                check_job(candidate, world)
                            except MeshscaleError:
                                continue
                            jobs.append(candidate)
    return jobs


def search_layouts(job: TrainingJob, allocation: Allocation, gpu: GpuSpec, global_batch: int,
                   calibration: Calibration | None = None) -> list[TrainingPrediction]:
    """Every candidate predicted: those that fit first (yes before tight), fastest first, then those that do
    not, smallest memory first."""
    if job.model is None:
        raise MeshscaleError("--search ranks transformer layouts; a ResNet trains data parallel only")
    found = [predict_step(j, allocation, gpu, calibration)
             for j in candidate_layouts(job, allocation.world_size, allocation.gpus_per_node, global_batch)]
    if not found:
        raise MeshscaleError(f"no layout of {job.name} runs on {allocation.world_size} GPUs at a global batch of "
                             f"{global_batch}; try a global batch that the GPU count divides")
    # those that fit with room (yes) first, then those within the memory model's uncertainty (tight)
    fits = sorted((p for p in found if p.fits), key=lambda p: (p.memory_verdict != "yes", -p.tokens_per_s_per_gpu))
    over = sorted((p for p in found if not p.fits), key=lambda p: p.memory.total_bytes)
    return fits + over
