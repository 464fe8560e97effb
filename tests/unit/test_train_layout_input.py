"""Bad layouts, model files and sequence lengths are refused in one line naming the field and the rule, with
exit 2, before any rank starts; the memory check refuses a layout a GPU cannot hold and passes one it can."""
import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.memory import GIB
from meshscale.train.config import LayoutOptions, SpeedOptions, TrainConfig
from meshscale.train.parallel.plan import check_fits, memory_needed, parse_layouts, with_default_layout


@pytest.mark.parametrize("args, words", [
    (["--cpus", "4", "--fsdp", "3"], "must equal the number of workers"),
    (["--cpus", "3", "--tp", "3"], "must divide the model's 4 attention heads"),
    (["--cpus", "4", "--tp", "4"], "key/value heads"),
    (["--cpus", "4", "--pp", "4", "--micro-batches", "4"], "each stage needs at least one layer"),
    (["--cpus", "2", "--pp", "2", "--micro-batches", "1"], "needs at least 2 micro-batches"),
    (["--seq-len", "128"], "longer than the model's 64 positions"),
    (["--cpus", "2", "--cp", "2", "--seq-len", "30"], "use a multiple of 4"),
    (["--activation-checkpointing", "some"], "--activation-checkpointing some"),
    (["--mode", "allreduce"], "--mode"),
], ids=["product", "tp-heads", "tp-kv", "pp-layers", "micro-batches", "seq-len", "cp-chunks", "checkpointing",
        "mode"])
def test_bad_layout_is_one_line_exit_2(cli, args, words):
    out = cli("train", "--model", "llama-tiny", "--steps", "1", "--timing-warmup", "0", *args)
    assert out.exit_code == 2, out.output
    assert words in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("fields, words", [
    ({"num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 32,
      "num_hidden_layers": 2}, "hidden_size"),
    ({"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 128,
      "max_position_embeddings": 32, "num_hidden_layers": 0}, "num_hidden_layers"),
])
def test_bad_config_file_is_one_line_exit_2(cli, tmp_path, fields, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", **fields}))
    out = cli("train", "--model", str(path), "--steps", "1", "--timing-warmup", "0")
    assert out.exit_code == 2, out.output
    assert words in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_no_degrees_shard_over_the_world():
    cfg = with_default_layout(TrainConfig(model="llama-tiny", world=4))
    assert cfg.layout.parallel_layout().fsdp == 4 and cfg.global_batch == 4 * cfg.batch_per_rank


def _cfg(model, **layout):
    return TrainConfig(model=model, batch_per_rank=1, device="cuda",
                       speed=SpeedOptions(precision="bf16"), layout=LayoutOptions(seq_len=2048, **layout))


def test_memory_check_refuses_what_does_not_fit_in_one_line():
    cfg = _cfg("llama3-8b")
    with pytest.raises(MeshscaleError) as err:
        check_fits(cfg, cfg.layout.parallel_layout(), 80 * GIB, "NVIDIA H100 80GB HBM3")
    text = str(err.value)
    assert "llama3-8b needs" in text and "has 80.0 GiB" in text and "\n" not in text


def test_memory_check_passes_a_1b_model_with_full_checkpointing():
    cfg = _cfg("llama-1b", checkpointing="full")
    check_fits(cfg, cfg.layout.parallel_layout(), 80 * GIB, "NVIDIA H100 80GB HBM3")


def test_checkpointing_and_sharding_lower_the_memory_needed():
    def need(**kw):
        cfg = _cfg("llama-1b", **kw)
        return memory_needed(cfg, cfg.layout.parallel_layout())
    # checkpointing keeps fewer activations; the peak falls with them, or stays at AdamW's step where that is higher
    held = [need(checkpointing=c).largest("activations") for c in ("full", "selective", "none")]
    assert held[0] < held[1] < held[2]
    totals = [need(checkpointing=c).total_bytes for c in ("full", "selective", "none")]
    assert totals == sorted(totals)
    assert need(fsdp=2, checkpointing="full").total_bytes < totals[0]


@pytest.mark.parametrize("text", ["fsdp", "tp2xtp2", "zz2", "fsdp2,,tp2", "fsdp0"])
def test_bad_layouts_list_is_one_line_exit_2(cli, text):
    out = cli("scale", "--model", "llama-tiny", "--layouts", text)
    assert out.exit_code == 2, out.output
    assert "--layouts" in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_layouts_list_parses_degrees():
    assert parse_layouts("fsdp4,tp2xfsdp2") == [{"fsdp": 4}, {"tp": 2, "fsdp": 2}]


@pytest.mark.parametrize("text, message", [
    ("fsdp1,fsdp1", "same layout"), ("fsdp1,tp1", "same layout"), ("tp2xfsdp2,fsdp2xtp2", "same layout"),
    ("fsdp" + "9" * 5001, "not a layout"), ("fsdp100000", "not a layout"), ("fsdp0", "not a layout"),
    (",".join(f"fsdp{n}" for n in range(1, 80)), "at most"), ("fsdp2\nx", "not a layout"),
])
def test_a_layout_list_is_bounded_and_names_each_layout_once(text, message):
    from meshscale.errors import MeshscaleError
    with pytest.raises(MeshscaleError, match=message) as found:
        parse_layouts(text)
    assert "\n" not in str(found.value)


def test_comm_by_dimension_counts_each_mesh_group_per_step():
    from meshscale.models.layout import ParallelLayout
    from meshscale.train.parallel.comm import comm_by_dimension

    def entry(group, t_ns, numel, ms=None):
        e = {"process_group": ["1", group], "time_created_ns": t_ns, "input_sizes": [[numel]],
             "input_dtypes": ["BFloat16"]}
        return {**e, "duration_ms": ms} if ms is not None else e
    entries = [entry("mesh_cp", 5, 100, 1.0),                 # before the window: left out
               entry("mesh_cp", 10, 100, 2.0), entry("mesh_cp", 11, 100, 4.0),
               entry("mesh_fsdp_cp", 12, 50),                 # cp folded into FSDP2's shard group
               entry("meshscale_loss", 13, 1),                # the loss's average: not a dimension's
               entry("mesh_tp", 13, 100, 1.0),                # tp of one rank: its group moves nothing
               entry("default_pg", 14, 10)]                   # fsdp 2 x cp 2 span the world: FSDP2's group
    comm = comm_by_dimension(entries, since_ns=10, steps=2, layout=ParallelLayout(tp=1, fsdp=2, cp=2))
    assert comm["cp"] == {"operations": 1.0, "bytes": 200.0, "seconds": 0.003}
    assert comm["fsdp"] == {"operations": 1.0, "bytes": 60.0, "seconds": None}
    assert set(comm) == {"cp", "fsdp"}
