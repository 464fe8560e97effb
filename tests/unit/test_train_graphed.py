"""--cuda-graph pieces that run without a GPU: what is refused, and the optimizer whose learning rate lives in
a tensor (what a captured step reads) giving the same parameters as the ordinary one under a changing rate."""
import pytest
import torch

from meshscale.errors import MeshscaleError
from meshscale.train.recipe import optimizer_factory
from meshscale.train.config import OptimizerOptions, SpeedOptions, TrainConfig
from meshscale.train.graphed import check_graphable, set_lr, tensor_lr
from meshscale.models.registry import get_model


@pytest.mark.parametrize("args, message", [
    (("ddp", "cpu", "bf16", None), "needs GPUs"),
    (("ps-sync", "cuda", "bf16", None), "not ps-sync"),
    (("allreduce", "cuda", "fp16", None), "fp16 loss scaling"),
    (("ddp", "cuda", "bf16", "default"), "--compile"),
])
def test_what_cannot_be_captured_is_refused(args, message):
    with pytest.raises(MeshscaleError, match=message):
        check_graphable(*args)
    check_graphable("allreduce", "cuda", "bf16", None)  # and what can is not


# capturable AdamW keeps its state on the device and refuses CPU parameters
@pytest.mark.parametrize("optimizer, device", [("sgd", "cpu"), pytest.param("adamw", "cuda", marks=pytest.mark.gpu)])
def test_tensor_learning_rate_matches_the_float_one(optimizer, device):
    """Both optimizers get bit-identical gradients (not from a backward: Adam's first steps are about
    lr * sign(g), so kernel noise in a near-zero gradient would move a weight by a whole step)."""
    torch.manual_seed(0)
    cfg, spec = TrainConfig(model="small-cnn", optimizer=OptimizerOptions(optimizer)), get_model("small-cnn")
    start = [torch.randn(16, 8, device=device), torch.randn(8, device=device)]
    params = [[torch.nn.Parameter(t.clone()) for t in start] for _ in range(2)]
    plain = optimizer_factory(cfg, spec)(params[0])
    graphable = optimizer_factory(cfg, spec, torch.device(device))(params[1])
    assert isinstance(graphable.param_groups[0]["lr"], torch.Tensor)
    assert graphable.defaults.get("fused" if optimizer == "sgd" else "capturable")
    for lr in (0.05, 0.1, 0.02):
        grads = [torch.randn_like(t) for t in start]
        for ps, opt in zip(params, (plain, graphable)):
            set_lr(opt, lr)
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
    assert graphable.param_groups[0]["lr"].item() == pytest.approx(0.02)
    for a, b, s0 in zip(*params, start):
        assert not torch.equal(a.detach(), s0)  # it moved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    before = [p.detach().clone() for p in params[1]]
    set_lr(graphable, 0.0)  # a zero rate must freeze the weights: the tensor is really what step() reads
    graphable.param_groups[0]["weight_decay"] = 0.0
    graphable.step()
    assert all(torch.equal(a, b) for a, b in zip(before, params[1]))
    assert tensor_lr(torch.device("cpu")).shape == ()


def test_bucket_slots_keep_each_parameters_layout():
    from meshscale.train.exchange import grad_view
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    flat = torch.zeros(7 + conv.weight.numel())
    slot = grad_view(flat, conv.weight, 7)
    assert slot.stride() == conv.weight.stride() and slot.shape == conv.weight.shape
    grad = torch.randn(conv.weight.shape).contiguous(memory_format=torch.channels_last)
    slot.copy_(grad)
    assert torch.equal(slot, grad) and flat[:7].eq(0).all()
    assert torch.equal(flat[7:], grad.permute(0, 2, 3, 1).reshape(-1))  # memory order: one dense copy


def test_ddp_with_compile_on_gpus_gets_the_measured_note():
    from meshscale.train.runner import notices
    compiled = SpeedOptions(compile="default")
    cfg = TrainConfig(model="resnet50", mode="ddp", device="cuda", speed=compiled)
    assert "allreduce --compile" in notices(cfg, 2)[0]
    assert notices(cfg, 1) == [] and notices(TrainConfig(mode="allreduce", device="cuda", speed=compiled), 2) == []
