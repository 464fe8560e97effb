"""The ddp and allreduce exchanges overlap communication with backward: a gradient bucket's all-reduce is
launched while backward is still computing earlier layers' gradients (one Gloo rank, in this process)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from meshscale.train.exchange import AllreduceExchange, DDPExchange
from meshscale.train.timing import Clock

WIDTH = 512  # a 512 x 512 float32 weight is 1 MiB: one bucket per layer with 1 MiB buckets


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(4)))


def _backward_with_events(exchange, first_layer: nn.Linear, events: list) -> None:
    """Two steps' backward and exchange (DDP forms its final buckets after the first); ``events`` holds the
    second's, with "first layer's gradient" when backward computes the gradient it computes last and
    "backward returned" after it."""
    first_layer.weight.register_hook(lambda grad: events.append("first layer's gradient"))
    for _ in range(2):
        events.clear()
        exchange.zero_grad()
        exchange.model(torch.randn(8, WIDTH)).square().mean().backward()
        events.append("backward returned")
        exchange.finish()


def _assert_launched_during_backward(events: list) -> None:
    launches = [i for i, e in enumerate(events) if e == "bucket launched"]
    assert len(launches) >= 2, events  # several buckets
    assert launches[0] < events.index("first layer's gradient") < events.index("backward returned"), events


def test_allreduce_launches_buckets_while_backward_runs(one_rank_group):
    events = []

    def recorded_all_reduce(tensor, async_op=True):
        events.append("bucket launched")
        return dist.all_reduce(tensor, async_op=async_op)

    model = _layers()
    exchange = AllreduceExchange(model, torch.optim.SGD(model.parameters(), lr=0.1), Clock(torch.device("cpu")), 1,
                                 fusion_bytes=1 << 20, allreduce=recorded_all_reduce)
    _backward_with_events(exchange, model[0], events)
    _assert_launched_during_backward(events)
    assert events.count("bucket launched") == len(exchange.buckets) == 4
    assert all(p.grad is not None for p in model.parameters())  # finish() put the reduced gradients back


def test_ddp_launches_buckets_while_backward_runs(one_rank_group, monkeypatch):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    events = []
    real_hook = default_hooks.allreduce_hook

    def recorded_hook(state, bucket):
        events.append("bucket launched")
        return real_hook(state, bucket)

    monkeypatch.setattr(default_hooks, "allreduce_hook", recorded_hook)  # the hook DDPExchange registers (timing on)
    model = _layers()
    exchange = DDPExchange(model, torch.optim.SGD(model.parameters(), lr=0.1), Clock(torch.device("cpu")),
                           torch.device("cpu"), bucket_cap_mb=1.0, timing=True)
    _backward_with_events(exchange, model[0], events)
    _assert_launched_during_backward(events)
    assert exchange.last_ready is not None  # the last bucket's mark, for the exposed-communication figure
