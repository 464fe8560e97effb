"""Layer 3b: run schedules and collectives for real over torch.distributed (NCCL on GPUs, Gloo on CPUs)."""
from meshscale.execute.launch import Interrupted, RankContext, WorkerError, in_torchrun, launch

__all__ = ["launch", "Interrupted", "RankContext", "WorkerError", "in_torchrun"]
