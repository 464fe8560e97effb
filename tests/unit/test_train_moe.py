"""The mixture-of-experts layer against a per-token oracle, its grouped GEMM against a loop, its balance loss's
gradient and split invariance; fp8's conversion and refusals; --ep's refusals and communication attribution."""
import sys

import pytest
import torch
import torch.nn.functional as F

from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import config_from_fields
from meshscale.train import moe as moe_module
from meshscale.train.moe import MoE, grouped_swiglu, looped_swiglu
from meshscale.train.parallel.comm import entry_dimension
from meshscale.train.transformer import Transformer

SHAPE = dict(layers=3, d_model=16, heads=2, kv_heads=2, ffn_dim=32, vocab_size=32, max_seq_len=8, style="llama",
             tie_embeddings=False, experts=4, experts_per_token=2, expert_ffn_dim=8, shared_experts=1)


def _cfg(**kw):
    return config_from_fields("m", {**SHAPE, **kw}, "test")


def _swiglu(x, w1, w2, w3):
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def test_grouped_gemm_equals_the_loop_with_empty_groups():
    g = torch.Generator().manual_seed(1)
    counts = torch.tensor([3, 0, 5, 1])
    x = torch.randn(int(counts.sum()), 8, generator=g)
    w1, w3 = torch.randn(4, 8, 4, generator=g), torch.randn(4, 8, 4, generator=g)   # rows of 16 bytes
    w2 = torch.randn(4, 4, 8, generator=g)
    loop = looped_swiglu(x, counts, w1, w2, w3)
    starts = [0, 3, 3, 8]
    oracle = torch.cat([_swiglu(x[s:s + n], w1[e], w2[e], w3[e]) for e, (s, n) in enumerate(zip(starts, counts))])
    assert torch.allclose(loop, oracle, atol=1e-5)
    try:
        grouped = grouped_swiglu(x, counts, w1, w2, w3)
    except RuntimeError:   # a torch without a CPU path for torch._grouped_mm: the loop is what runs here
        pytest.skip("torch._grouped_mm has no CPU path in this torch")
    assert torch.allclose(grouped, oracle, atol=1e-5)


@pytest.mark.parametrize("router, k", [("softmax", 2), ("sigmoid", 2), ("softmax", 1)])
def test_layer_equals_a_per_token_oracle(router, k):
    torch.manual_seed(0)
    layer = MoE(_cfg(router=router, experts_per_token=k))
    for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3):
        torch.nn.init.normal_(w, std=0.3)
    x = torch.randn(2, 5, 16)
    out = layer(x)
    tokens = x.reshape(-1, 16)
    logits = tokens @ layer.router.gate.weight.T
    scores = logits.sigmoid() if router == "sigmoid" else logits.softmax(-1)
    e = layer.experts
    s = layer.shared_experts
    for i, t in enumerate(tokens):
        top = scores[i].topk(k)
        weights = top.values / top.values.sum() if k > 1 else top.values
        want = sum(w * _swiglu(t, e.w1[j], e.w2[j], e.w3[j]) for w, j in zip(weights, top.indices))
        want = want + _swiglu(t, s.w1.weight.T, s.w2.weight.T, s.w3.weight.T)
        assert torch.allclose(out.reshape(-1, 16)[i], want, atol=1e-5)
    assert layer.routed.sum() == tokens.shape[0] * k   # every token reached its k experts: nothing dropped


def test_balance_loss_enters_the_gradient_as_if_added_to_the_loss(monkeypatch):
    torch.manual_seed(0)
    layer = MoE(_cfg())
    x, r = torch.randn(3, 4, 16), torch.randn(3, 4, 16)
    (layer(x) * r).sum().backward()
    injected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    captured = []
    monkeypatch.setattr(moe_module._AuxLoss, "apply", lambda out, aux, scale: captured.append(aux) or out)
    ((layer(x) * r).sum() + captured[0]).backward()
    for a, b in zip(injected, (p.grad for p in layer.parameters())):
        assert torch.allclose(a, b, atol=1e-6)


def test_balance_loss_is_the_mean_over_sequences_of_any_split():
    """Sequence-wise: a batch's loss is the mean of its halves' (what data-parallel ranks each compute)."""
    torch.manual_seed(0)
    layer = MoE(_cfg())
    scores = torch.rand(4 * 6, 4).softmax(-1)
    chosen = scores.topk(2).indices
    whole = layer._balance_loss(scores, chosen, 4)
    halves = [layer._balance_loss(scores[i * 12:(i + 1) * 12], chosen[i * 12:(i + 1) * 12], 2) for i in (0, 1)]
    assert torch.allclose(whole, sum(halves) / 2)
    # balanced routing costs alpha, concentrated routing more
    flat = torch.full((6, 4), 0.25)
    balanced = torch.tensor([[0, 1], [2, 3]] * 3)
    assert torch.allclose(layer._balance_loss(flat, balanced, 1), torch.tensor(moe_module.AUX_LOSS_COEF))
    concentrated = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 6)
    assert torch.allclose(layer._balance_loss(concentrated, torch.tensor([[0, 1]] * 6), 1),
                          torch.tensor(2 * moe_module.AUX_LOSS_COEF))


def test_module_parameters_equal_the_config_count():
    cfg = _cfg(dense_layers=1)
    assert sum(p.numel() for p in Transformer(cfg, 8).parameters()) == cfg.params()


def test_first_dense_layers_keep_their_mlp():
    model = Transformer(_cfg(dense_layers=1), 8)
    kinds = [(b.moe is None, b.feed_forward is None) for b in model.layers.values()]
    assert kinds == [(True, False), (False, True), (False, True)]
    assert all(b.moe is None for b in Transformer(_cfg(experts=0, experts_per_token=0, expert_ffn_dim=0,
                                                       shared_experts=0), 8).layers.values())


def _entry(group, name):
    return {"process_group": ["0", group], "profiling_name": name}


def test_all_to_all_is_expert_parallelism_and_fsdp_groups_are_fsdp():
    layout = ParallelLayout(ep=2, fsdp=4, dp=2)   # experts: 2 shards (efsdp), 2 replicas (edp)
    assert entry_dimension(_entry("mesh_ep", "gloo:all_to_all"), layout) == "ep"
    assert entry_dimension(_entry("mesh_fsdp_cp", "gloo:reduce_scatter"), layout) == "fsdp"
    assert entry_dimension(_entry("mesh_efsdp_tp", "gloo:all_gather"), layout) == "fsdp"
    assert entry_dimension(_entry("mesh_edp", "gloo:all_reduce"), layout) == "dp"
    assert entry_dimension(_entry("mesh_fsdp_cp_tp", "gloo:all_gather"), ParallelLayout(tp=2, fsdp=2)) == "fsdp"
    assert entry_dimension(_entry("mesh_cp_tp", "gloo:all_reduce"), ParallelLayout(tp=2, fsdp=2, ep=2)) == "tp"
    # ep over the whole world: the default group's all-to-alls are ep's, its other collectives FSDP's
    whole = ParallelLayout(ep=4, fsdp=4)
    assert entry_dimension(_entry("default_pg", "nccl:all_to_all"), whole) == "ep"
    assert entry_dimension(_entry("default_pg", "nccl:all_gather"), whole) == "fsdp"


# ---- bad input: one line, exit 2, before any rank starts -------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (("--model", "moe-tiny", "--cpus", "4", "--ep", "3"), "--ep 3: must divide the 4 CPU workers"),
    (("--model", "moe-tiny", "--cpus", "3", "--ep", "3"), "--ep 3: must divide the model's 4 experts"),
    (("--model", "llama-tiny", "--cpus", "2", "--ep", "2"), "dense model"),
    (("--model", "llama-tiny", "--precision", "fp8"), "fp8 tensor cores"),
    (("--model", "llama-tiny", "--fp8-recipe", "rowwise"), "--fp8-recipe rowwise: a recipe of --precision fp8"),
    (("--model", "small-cnn", "--precision", "fp8", "--fp8-recipe", "columnwise"), "fp8-recipe"),
])
def test_bad_expert_and_fp8_options_are_one_line(cli, monkeypatch, args, words):
    monkeypatch.setattr("meshscale.train.runner.launch", lambda *a, **k: pytest.fail("ranks started"))
    out = cli("train", *args, "--steps", "2", "--timing-warmup", "1")
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshscale: error: ") and words in lines[0], lines


def _fp8_cfg(**speed):
    from meshscale.train.config import SpeedOptions, TrainConfig
    return TrainConfig(model="llama-tiny", device="cuda", speed=SpeedOptions(precision="fp8", **speed))


def test_fp8_refuses_gpus_without_fp8_tensor_cores_and_names_the_extra(monkeypatch):
    from meshscale.errors import MeshscaleError
    from meshscale.train.runner import check_fp8
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    with pytest.raises(MeshscaleError, match="A100.*8.0"):
        check_fp8(_fp8_cfg())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(MeshscaleError, match=r"pip install 'meshscale\[fp8\]'"):
        check_fp8(_fp8_cfg())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_converts_the_eligible_linears_and_trains(recipe):
    pytest.importorskip("torchao.float8")
    from meshscale.train.fp8 import convert_to_fp8, fp8_linears, keeps_fp8
    torch.manual_seed(0)
    model = Transformer(_cfg(dense_layers=1, d_model=32, ffn_dim=64, expert_ffn_dim=16, vocab_size=64), 8)
    eligible = [n for n, m in model.named_modules() if keeps_fp8(m, n)]
    # attention and the dense MLP; never the head, nor a mixture of experts' router or shared experts
    assert eligible and all("moe" not in n and n != "output" for n in eligible)
    assert set(eligible) >= {"layers.0.feed_forward.w1", "layers.1.attention.wq"}
    after = convert_to_fp8(model, recipe, emulate=True)
    assert fp8_linears(model) == len(eligible) and (after is not None) == (recipe == "tensorwise")
    x = torch.randint(0, 64, (2, 8))
    loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    assert torch.isfinite(loss) and model.layers["1"].attention.wq.weight.grad.abs().sum() > 0
