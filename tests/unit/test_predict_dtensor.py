"""Tensor parallelism's host cost in the step model: the ops that run on DTensors pay DTensor's dispatch
(DTENSOR_HOST_SECONDS_PER_OP) in eager runs, inside the pass model, and nothing under a CUDA graph; which ops those
are is held against an aten-level trace of the engine's own tensor-parallel plan on two Gloo ranks."""
from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import preset
from meshscale.predict.training import kernels, measured
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import system_gpu
from meshscale.predict.training.kernels import host_seconds
from meshscale.predict.training.step import TrainingJob, predict_step, step_kernels, synced_step_seconds
from meshscale.predict.training.workload import (TP_LINEAR_BACKWARD_DTENSOR_OPS, TP_LINEAR_DTENSOR_OPS,
                                                 transformer_layer)

H100, _ = system_gpu("hgx-h100")
TWO = Allocation.of("hgx-h100", 2)


def _tp_job(tp: int, cuda_graph: bool = False) -> TrainingJob:
    return TrainingJob(preset("llama-1b"), ParallelLayout(tp=tp), 2, 2048, "bf16", "selective", cuda_graph=cuda_graph)


def _dtensor_ops(passes) -> int:
    return sum(k.dtensor_ops * k.count for k in passes.forward + passes.backward + passes.recompute)


def test_a_tp_layer_pays_dtensor_dispatch_per_op_and_more_host_time_than_at_tp_1():
    model = preset("llama-1b")
    plain = transformer_layer(model, 4096, 2048, checkpointing="selective")
    split = transformer_layer(model, 4096, 2048, tp=2, checkpointing="selective")
    assert _dtensor_ops(plain) == 0 and _dtensor_ops(split) > 0
    every = lambda p: list(p.forward + p.backward + p.recompute)    # noqa: E731
    # half the work per rank, yet more host time: the DTensor ops cost more than the plain ones they replace
    assert host_seconds(every(split)) > host_seconds(every(plain))
    per_op = (host_seconds(every(split)) - host_seconds(every(plain))) / _dtensor_ops(split)
    assert kernels.HOST_SECONDS_PER_OP < per_op <= kernels.DTENSOR_HOST_SECONDS_PER_OP
    # attention's core and rotary run on the local tensors the linears hand out
    assert all(k.dtensor_ops == 0 for k in every(split) if k.kind == "attention" or k.name.startswith("rotary"))


def test_the_pass_model_sees_dtensor_dispatch_and_a_cuda_graph_pays_none(monkeypatch):
    eager = [predict_step(_tp_job(2), TWO, H100)]
    graphed = [predict_step(_tp_job(2, cuda_graph=True), TWO, H100)]
    for factor in (2, 4):
        monkeypatch.setattr(measured, "host_costs", lambda f=factor: measured.HostCosts(10e-6, 90e-6 * f, 10e-6))
        eager.append(predict_step(_tp_job(2), TWO, H100))
        graphed.append(predict_step(_tp_job(2, cuda_graph=True), TWO, H100))
    steps = [p.step_s for p in eager]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert all(p.launch_s > 0 for p in eager)              # host-bound passes, inside compute_s
    assert [synced_step_seconds(p) for p in eager] == sorted(synced_step_seconds(p) for p in eager)
    assert all(p.launch_s == 0 and p.step_s == graphed[0].step_s for p in graphed)
    assert graphed[0].step_s < eager[0].step_s


def test_only_dtensor_parameters_dispatch_the_optimizer_through_dtensor():
    model = preset("llama-1b")
    fsdp2 = step_kernels(TrainingJob(model, ParallelLayout(fsdp=2), 2, 2048))
    ddp = step_kernels(TrainingJob(model, ParallelLayout(dp=2), 2, 2048, sharding="none"))
    assert next(k for k in fsdp2.per_step if k.name == "adamw step").dtensor_ops > 0
    assert all(k.dtensor_ops == 0 for k in ddp.per_step)
    # without tensor parallelism no layer op runs on DTensors (FSDP2 computes on plain unsharded parameters)
    assert _dtensor_ops(fsdp2.layer) == 0 and _dtensor_ops(fsdp2.ends) == 0


# ---- the engine's tensor-parallel plan, traced -----------------------------------------------------------------
WORLD, SEQ, BATCH = 2, 32, 2


def _trace_rank(rank: int, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from meshscale.models.transformer import TransformerConfig
    from meshscale.train.parallel.apply import apply_tensor_parallel
    from meshscale.train.transformer import Transformer

    class OnDTensor(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(isinstance(t, DTensor) for t in tree_leaves((args, kwargs or {}))):
                self.ops[func.__name__.split(".")[0]] += 1
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        cfg = TransformerConfig("t", 2, 64, 4, 2, 128, 256, SEQ)
        model = Transformer(cfg, SEQ)
        apply_tensor_parallel(model, init_device_mesh("cpu", (WORLD,)))
        tokens = torch.randint(0, 256, (BATCH, SEQ))
        forward, backward = OnDTensor(), OnDTensor()
        with forward:
            loss = model(tokens).float().sum()
        with backward:
            loss.backward()
        if rank == 0:
            out.update(forward=dict(forward.ops), backward=dict(backward.ops), layers=cfg.layers)
    finally:
        dist.destroy_process_group()


def _worker(rank: int, port: int, queue) -> None:
    out: dict = {}
    try:
        _trace_rank(rank, port, out)
        queue.put((rank, out, None))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, {}, repr(e)))


@pytest.mark.timeout(120)
def test_the_ops_the_model_puts_on_dtensors_are_the_ones_the_engines_plan_runs_there():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.multiprocessing as mp
    ctx = mp.get_context("fork")
    store = dist.TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, store.port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [e for _, _, e in results if e]
    assert not errors, errors
    traced = next(out for r, out, _ in results if r == 0)
    linears = traced["layers"] * 7 + 1                       # each block's seven projections and the head
    forward, backward = traced["forward"], traced["backward"]
    # a linear on DTensors: t, view, mm and _unsafe_view forward; two mm and four t among its backward's ops
    assert sum(forward.get(op, 0) for op in ("t", "view", "mm", "_unsafe_view")) == TP_LINEAR_DTENSOR_OPS * linears
    assert backward.get("mm", 0) == 2 * linears and backward.get("t", 0) == 4 * linears
    assert sum(backward.get(op, 0) for op in ("mm", "t", "view", "detach")) >= \
        sum(TP_LINEAR_BACKWARD_DTENSOR_OPS) * linears
    # attention, rotary and the activations run on local tensors
    local = ("_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention", "silu", "stack", "cat")
    assert not any(op in forward or op in backward for op in local)
