"""A transformer trained under each parallel layout on 4 Gloo ranks gives the losses one rank gives on the same
global batch, and a sharded run resumes from its distributed checkpoint to the same losses.

Tolerance: fp32 throughout; layouts differ from one rank only in the order of floating-point sums (FSDP's
reduce-scatter averages over ranks, tensor-parallel matmuls sum partial products, context parallelism splits the
softmax's sum, micro-batches split the batch mean). Each reordered sum differs by a few units in the last place
(fp32: 1.2e-7 relative); four AdamW steps carry such differences into the loss at that order, so 1e-5 relative
leaves a margin of ~100x over what is seen (<= 2e-7) while a layout that loses or double-counts one rank's
gradient, tokens or micro-batch moves the loss by far more than that after one step (checked below: the losses
move by > 1e-2 over the run)."""
import json

import pytest

from meshscale.train import checkpoint
from meshscale.train.config import CheckpointOptions, LayoutOptions, OptimizerOptions, TrainConfig
from meshscale.train.runner import run, summarize

GLOBAL_BATCH = 8
STEPS = 4
RTOL = 1e-5
# AdamW at lr 0.003 (this batch): every step moves the loss well beyond the tolerance
FAST = OptimizerOptions(base_lr=0.1)


def _cfg(model="llama-tiny", world=1, batch=GLOBAL_BATCH, steps=STEPS, **layout):
    # warm-up steps 1 and 2 (not the first) run under the profiler for the time split: at most 2 warm-up steps
    return TrainConfig(model=model, world=world, batch_per_rank=batch, steps=steps, timing_warmup=min(3, steps - 1),
                       timeout_s=60, optimizer=FAST, layout=LayoutOptions(**layout))


_CACHE = {}


def _run(model="llama-tiny", world=1, batch=GLOBAL_BATCH, **layout):
    """The run's configuration and per-rank outputs, once per module (tests compare each other's runs)."""
    key = (model, world, batch, tuple(sorted(layout.items())))
    if key not in _CACHE:
        cfg = _cfg(model, world, batch, **layout)
        _CACHE[key] = cfg, run(cfg)
    return _CACHE[key]


def _losses(*args, **kw):
    return [r["loss"] for r in _run(*args, **kw)[1][0]["rows"]]


def _close(a, b):
    assert len(a) == len(b) == STEPS
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    assert worst <= RTOL, (worst, a, b)


def test_one_rank_losses_move_beyond_the_tolerance():
    ref = _losses()
    assert abs(ref[0] - ref[-1]) / ref[0] > 1e3 * RTOL


@pytest.mark.parametrize("layout", [
    dict(fsdp=4),
    dict(fsdp=2, tp=2),
    dict(pp=2, fsdp=2, micro_batches=2),
    dict(cp=2, fsdp=2),
    dict(dp=2, fsdp=2),
    dict(pp=2, tp=2, pp_schedule="gpipe", micro_batches=4),
], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_layout_on_four_ranks_matches_one_rank(layout):
    data_parallel = layout.get("dp", 1) * layout.get("fsdp", 1)
    _close(_losses(world=4, batch=GLOBAL_BATCH // data_parallel, **layout), _losses())


@pytest.mark.parametrize("layout,data_parallel", [(dict(ep=2, fsdp=2), 4), (dict(ep=2, tp=2), 2)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) if isinstance(d, dict) else str(d))
def test_experts_split_over_ep_match_one_rank(layout, data_parallel):
    """moe-tiny: 4 experts, top 2, on four ranks; ep borrows data-parallel ranks and the degree not given takes
    what the others leave (ep 2 fsdp 2: dp 2 x fsdp 2, the experts split over ranks of two replicas; ep 2 tp 2:
    tp 2 x fsdp 2). Tokens cross ranks by all-to-all and come back; the balance loss's gradient joins the
    backward: a token lost, counted twice or a gradient scaled wrongly moves the losses beyond the tolerance."""
    _close(_losses("moe-tiny", world=4, batch=GLOBAL_BATCH // data_parallel, **layout), _losses("moe-tiny"))


def test_moe_summary_counts_every_token_slot_and_the_all_to_all():
    s = summarize(*_run("moe-tiny", world=4, batch=GLOBAL_BATCH // 4, ep=2, fsdp=4))
    moe, seq_len = s["moe"], s["seq_len"]
    # every layer routes each token of the global batch to its top 2 experts, summed over the ranks
    assert set(moe["tokens_per_expert"]) == {"0", "1"}
    for counts in moe["tokens_per_expert"].values():
        assert sum(counts) == pytest.approx(GLOBAL_BATCH * seq_len * 2)
    assert moe["expert_load_max_over_mean"] >= 1 and moe["dropped_tokens"] == 0
    # the balance loss as one rank computes it over the same batch (its shares summed and averaged)
    one = summarize(*_run("moe-tiny"))["moe"]
    assert moe["aux_loss"] == pytest.approx(one["aux_loss"], rel=1e-5)
    ep = s["comm_by_dimension"]["ep"]
    assert ep["bytes"] > 0 and moe["all_to_all_bytes"] == ep["bytes"] and moe["all_to_all_exposed_s"] > 0


@pytest.fixture
def four_layer_config(tmp_path):
    """A Hugging Face style config.json: 4 layers, so interleaved 1F1B has 2 stages on each of 2 ranks."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 32,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
                                "vocab_size": 128, "max_position_embeddings": 32}))
    return str(path)


def test_interleaved_pipeline_matches_one_rank(four_layer_config):
    _close(_losses(four_layer_config, world=2, pp=2, pp_schedule="interleaved-1f1b", micro_batches=4),
           _losses(four_layer_config))


def test_summary_reports_tokens_memory_and_layout():
    s = summarize(*_run(world=4, batch=4, fsdp=2, tp=2))
    assert s["tokens_per_s"] == pytest.approx(s["samples_per_s"] * s["seq_len"])
    assert s["tokens_per_s_per_rank"] == pytest.approx(s["tokens_per_s"] / 4)
    assert s["layout"] == "tp2 fsdp2"
    # by the model's arithmetic: the sharded state is smaller than one rank's
    one = summarize(*_run())
    assert s["memory_needed"]["params"] < one["memory_needed"]["params"]
    assert s["mfu"] is None  # no GPU, no peak rate
    # the flight recorder's operations, by the mesh's groups: the layout's two dimensions and no other
    comm = s["comm_by_dimension"]
    assert set(comm) == {"tp", "fsdp"} and all(c["operations"] > 0 and c["bytes"] > 0 for c in comm.values())


@pytest.mark.parametrize("layout", [dict(fsdp=2, tp=2), dict(pp=2, fsdp=2, micro_batches=2), dict(cp=2, fsdp=2)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items() if k != "micro_batches"))
def test_each_dimension_reports_its_busy_and_exposed_time(layout):
    data_parallel = layout.get("fsdp", 1)
    s = summarize(*_run(world=4, batch=GLOBAL_BATCH // data_parallel, **layout))
    b = s["breakdown"]
    assert b["steps"] == 2
    comm = s["comm_by_dimension"]
    assert set(comm) == {dim for dim, n in layout.items() if dim != "micro_batches" and n > 1}
    for dim, c in comm.items():
        # every dimension moved data, so it took time; what it exposed is part of it, and of the step
        assert 0 < c["exposed_seconds"] <= c["seconds"] <= b["step_time_s"], (dim, c, b)
    # the split's parts are disjoint pieces of the step
    assert b["data_s"] + b["compute_s"] + b["exposed_comm_s"] <= b["step_time_s"] * (1 + 1e-9)
    assert b["exposed_comm_s"] <= sum(c["exposed_seconds"] for c in comm.values()) * (1 + 1e-9)
    assert s["comm_s"] == b["exposed_comm_s"]
    if "pp" in layout:  # the stages wait for each other: the bubble is part of the pipeline's exposed time
        assert 0 < s["bubble_s"] <= comm["pp"]["exposed_seconds"] * (1 + 1e-9)
    else:
        assert s["bubble_s"] is None


def test_one_rank_has_no_communication_time():
    s = summarize(*_run())
    assert s["comm_by_dimension"] == {} and s["comm_s"] == 0 and s["breakdown"]["compute_s"] > 0


def test_sharded_resume_continues_bit_equal(tmp_path):
    def cfg(steps, resume):
        c = _cfg(world=4, batch=4, steps=steps, fsdp=2, tp=2)
        c.checkpoint = CheckpointOptions(str(tmp_path / "ck"), 0, resume)
        return c
    whole = _losses(world=4, batch=4, fsdp=2, tp=2)
    run(cfg(2, False))
    assert checkpoint.latest_step(tmp_path / "ck") == 2
    resumed = [r["loss"] for r in run(cfg(STEPS, True))[0]["rows"]]
    assert resumed == whole[2:]


def test_scale_layouts_gives_one_row_per_layout(cli, tmp_path):
    out = cli("scale", "--model", "llama-tiny", "--layouts", "fsdp2,pp2", "--micro-batches", "2", "--batch", "2",
              "--steps", "4", "--timing-warmup", "3", "--json", tmp_path / "s.json")
    assert out.exit_code == 0, out.output
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [(r["layout"], r["world_size"]) for r in rows] == [("fsdp2", 2), ("pp2 (1f1b, 2 micro-batches)", 2)]
    # fsdp2 splits the batch over two data-parallel ranks, pp2 keeps one: twice the sequences per step
    assert [r["global_batch"] for r in rows] == [4, 2]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["fsdp_comm_bytes"] > 0 and "pp_comm_bytes" not in rows[0]
    # warm-up steps 1 and 2 profiled: each row's exposed communication, and the pipeline's bubble
    assert rows[0]["fsdp_comm_exposed_s"] > 0 and rows[0]["bubble_s"] is None
    assert rows[1]["pp_comm_exposed_s"] >= rows[1]["bubble_s"] > 0
