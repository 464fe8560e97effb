"""What a training run is: one plain dataclass shared by the CLI, `meshscale scale` and the rank workers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrainConfig:
    model: str = "small-cnn"
    data: str = "synthetic"          # synthetic | digits | folder of images | token file
    eval_data: Optional[str] = None  # e.g. digits-test: accuracy after training (rank 0)
    image_size: Optional[int] = None  # images: side length (default: the model's)
    mode: str = "ddp"                # ddp | allreduce | ps-sync | ps-async
    world: int = 1
    device: str = "cpu"              # cpu (Gloo) or cuda (NCCL)
    batch_per_rank: int = 32
    steps: int = 50
    timing_warmup: int = 5           # steps left out of the throughput summary
    # optimizer and the large-batch recipe (Goyal et al.): lr = base_lr x global batch / ref_batch, warm-up
    optimizer: Optional[str] = None  # sgd | adamw (default: the model's, see models.py)
    base_lr: Optional[float] = None  # per ref_batch samples (default: the model's)
    ref_batch: int = 256
    lr_warmup_steps: int = 0
    momentum: float = 0.9
    weight_decay: float = 5e-5
    # exchange knobs
    bucket_cap_mb: float = 25.0      # ddp
    bucket_view: bool = False        # ddp gradient_as_bucket_view
    static_graph: bool = False       # ddp
    fusion_mb: float = 64.0          # allreduce
    compression: str = "none"        # allreduce: none | bf16 | fp16
    collective: str = "native"       # allreduce: native | schedule[:ALGO] (meshscale schedule executor)
    max_staleness: int = 0           # ps-async
    ps_servers: int = 0              # ps-*: dedicated server ranks (the last ones); 0: sharded over every rank
    # speed knobs
    precision: str = "fp32"          # fp32 | bf16 (autocast) | fp16 (autocast + GradScaler)
    channels_last: bool = False
    compile: Optional[str] = None    # None, or a torch.compile mode: default | reduce-overhead | max-autotune
    cuda_graph: bool = False         # capture the whole step in one CUDA graph (train/graphed.py)
    timing: bool = True              # per-step compute / comm / data split (one device sync per step)
    # reproducibility, checkpoints, output
    seed: int = 0
    deterministic: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0        # steps; 0: only at the end (when checkpoint_dir is set)
    resume: bool = False
    log: Optional[str] = None        # JSONL, one line per step (rank 0)
    tensorboard: Optional[str] = None
    progress: bool = False           # rich progress bar on rank 0
    timeout_s: float = 120.0
    # for tests
    verify_sync: bool = False        # after every step, compare every rank's parameters with rank 0's
    return_params: bool = False      # rank 0 returns the final flat parameters
    fault_step: Optional[int] = None  # fault injection: the last rank exits abruptly at this step

    @property
    def workers(self) -> int:
        """Ranks that train (all but the dedicated parameter servers)."""
        return self.world - self.ps_servers

    @property
    def global_batch(self) -> int:
        return self.batch_per_rank * self.workers
