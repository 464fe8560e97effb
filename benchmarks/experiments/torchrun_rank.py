"""What the torchrun benchmarks share: this rank's GPU and its NCCL process group, and the model's registry entry."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from meshscale.models.registry import ModelSpec, get_model


def join(model: str) -> tuple[int, torch.device, ModelSpec]:
    """(rank, device, model spec) of this torchrun rank, its NCCL group initialised on its local GPU."""
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local if torch.cuda.device_count() > local else 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return rank, device, get_model(model)
