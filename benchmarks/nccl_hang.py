"""A real NCCL hang for `why-hung`: two collectives together, then rank 1 skips the all_reduce rank 0 enters.
Run under torchrun with TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_FR_DUMP_TEMP_FILE
(see benchmarks/doctor_level2.sh); the 20 s process-group timeout makes NCCL's watchdog dump every rank."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=timedelta(seconds=20), device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
dist.broadcast(t, 0)
torch.cuda.synchronize()
if rank == 0:
    dist.all_reduce(t)  # rank 1 never joins
    torch.cuda.synchronize()
time.sleep(60)  # the watchdog times out at 20 s, dumps the traces and ends the job
