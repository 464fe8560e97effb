"""A transformer trained under a `ParallelLayout` with PyTorch's own engines: DeviceMesh for the layout,
DTensor tensor/sequence parallelism, context parallelism (keys and values gathered over the cp group),
activation checkpointing, FSDP2 (fully_shard) and torch.distributed.pipelining."""
