"""Checkpoint and resume continue the same loss sequence; a killed worker stops the run with a clear message
and leaves the last checkpoint intact."""
import json
import time

import pytest
import torch

from meshscale.errors import MeshscaleError
from meshscale.execute import WorkerError
from meshscale.train import checkpoint
from meshscale.train.config import CheckpointOptions, DebugOptions, LogOptions, OptimizerOptions, PsOptions, TrainConfig
from meshscale.train.runner import run


def _cfg(tmp_path, name, mode, steps, resume=False, every=0, **kw):
    return TrainConfig(model="gpt-tiny", mode=mode, world=2, batch_per_rank=2, steps=steps, timing_warmup=1,
                       optimizer=OptimizerOptions(warmup_steps=3), deterministic=True, timeout_s=30,
                       checkpoint=CheckpointOptions(str(tmp_path / name), every, resume), **kw)


def _gpt_tiny_keys() -> set[str]:
    """The weights' names of the model the runs train, as its module has them."""
    from meshscale.models.registry import get_model
    from meshscale.train.builders import build_model
    return set(build_model(get_model("gpt-tiny")).state_dict())


# ps-async with staleness carries the most state (owned shard, its optimizer, pulls in flight)
# and with a dedicated server rank (world 2 = 1 worker + 1 server), whose state lives only on the server
@pytest.mark.parametrize("mode, extra", [("ps-async", {"ps": PsOptions(max_staleness=1)}),
                                         ("ps-async", {"ps": PsOptions(max_staleness=1, servers=1)})])
def test_resume_continues_the_same_losses(tmp_path, mode, extra):
    whole = run(_cfg(tmp_path, "a", mode=mode, steps=8, **extra))[0]["rows"]
    run(_cfg(tmp_path, "b", mode=mode, steps=4, **extra))
    assert checkpoint.latest_step(tmp_path / "b") == 4
    resumed = run(_cfg(tmp_path, "b", mode=mode, steps=8, resume=True, **extra))[0]
    assert resumed["summary"]["first_step"] == 4
    assert [r["step"] for r in resumed["rows"]] == [4, 5, 6, 7]
    assert [r["loss"] for r in resumed["rows"]] == [r["loss"] for r in whole[4:]]


def test_killed_worker_stops_the_run_and_keeps_the_checkpoint(tmp_path):
    log = tmp_path / "steps.jsonl"
    cfg = _cfg(tmp_path, "c", mode="ddp", steps=50, every=4, debug=DebugOptions(fault_step=6),
               logging=LogOptions(jsonl=str(log)))
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 died .* during training step 6"):
        run(cfg)
    assert time.monotonic() - start < cfg.timeout_s
    assert checkpoint.latest_step(cfg.checkpoint.dir) == 4
    state = checkpoint.load(cfg.checkpoint.dir, 0, 2)
    assert state["step"] == 4 and set(state["model"]) == _gpt_tiny_keys()
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps[:6] == list(range(6))  # everything logged before the failure is there


def test_a_checkpoint_is_tensors_and_json(tmp_path):
    run(_cfg(tmp_path, "d", mode="ddp", steps=2))
    folder = tmp_path / "d" / "step-00000002"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank0.pt", "rank1.json", "rank1.pt"]
    tensors = torch.load(folder / "rank0.pt", weights_only=True)  # loads without unpickling any object
    assert isinstance(tensors["rng"]["torch"], torch.Tensor) and set(tensors["model"]) == _gpt_tiny_keys()
    meta = json.loads((folder / "rank1.json").read_text())
    assert (meta["step"], meta["world"]) == (2, 2) and len(meta["rng"]["numpy"]["keys"]) == 624


def test_a_garbled_latest_marker_is_a_clear_error(tmp_path):
    (tmp_path / "latest").write_text("../../etc\n")
    with pytest.raises(MeshscaleError, match="should hold a step number"):
        checkpoint.load(tmp_path, 0, 2)
