"""Layer 3b: run schedules and collectives for real over torch.distributed (NCCL on GPUs, Gloo on CPUs)."""
from meshscale.execute.launch import RankContext, WorkerError, in_torchrun, launch

__all__ = ["launch", "RankContext", "WorkerError", "in_torchrun"]
