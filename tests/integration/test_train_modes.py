"""Data-parallel training on 1, 2 and 4 Gloo ranks: every mode keeps the ranks in lock-step, N ranks equal 1
rank on the same global batch, the parameter server's staleness behaves, and the small CNN learns digits."""
import numpy as np
import pytest

from meshscale.train.config import AllreduceOptions, DebugOptions, OptimizerOptions, PsOptions, SpeedOptions, TrainConfig
from meshscale.train.runner import run

GLOBAL_BATCH = 8
SMALL_BUCKETS = AllreduceOptions(fusion_mb=0.05)  # several buckets, launched in order whatever arrives first
CHECKED = DebugOptions(verify_sync=True, return_params=True)


_CACHE = {}


def _train(mode, world, **kw):
    """Run once per distinct configuration in this module (tests compare against each other's runs)."""
    key = (mode, world, repr(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = _launch(mode, world, **kw)
    return _CACHE[key]


def _launch(mode, world, **kw):
    kw.setdefault("allreduce", SMALL_BUCKETS)
    cfg = TrainConfig(model="small-cnn", data="synthetic", image_size=8, mode=mode, world=world, batch_per_rank=GLOBAL_BATCH // world,
                      steps=4, timing_warmup=1, debug=CHECKED, timeout_s=60, **kw)
    return run(cfg)


@pytest.fixture(scope="module")
def one_rank():
    return _train("ddp", 1)[0]["params"]


@pytest.mark.parametrize("mode", ["ddp", "allreduce", "ps-sync"])
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_stay_identical_and_match_one_rank(mode, world, one_rank):
    out = _train(mode, world)
    assert [o["summary"]["max_param_diff"] for o in out] == [0.0] * world  # checked after every step
    assert not np.array_equal(out[0]["params"], _initial_params())  # it did train
    np.testing.assert_allclose(out[0]["params"], one_rank, rtol=1e-4, atol=1e-6)
    rows = out[0]["rows"]
    assert all(r["comm_s"] >= 0 and r["compute_s"] > 0 for r in rows)


def test_ps_async_with_staleness_0_is_ps_sync_exactly():
    sync = _train("ps-sync", 2)[0]["params"]
    stale0 = _train("ps-async", 2, ps=PsOptions(max_staleness=0))[0]["params"]
    assert np.array_equal(sync, stale0)


def test_bf16_compression_stays_close():
    out = _train("allreduce", 2, allreduce=AllreduceOptions(fusion_mb=SMALL_BUCKETS.fusion_mb, compression="bf16"))
    exact = _train("allreduce", 2)
    assert len(exact[0]["rows"]) == 4
    assert out[0]["summary"]["max_param_diff"] == 0.0
    diff = np.abs(out[0]["params"] - exact[0]["params"]).max()
    assert 0 < diff < 1e-2  # rounded on the wire, but not far off


@pytest.mark.slow  # two runs of 200 steps
def test_small_cnn_learns_digits_and_stale_ps_still_converges():
    common = dict(model="small-cnn", data="digits", eval_data="digits-test", world=2, batch_per_rank=16, steps=200,
                  timing=False, timeout_s=120)
    exact = run(TrainConfig(mode="allreduce", optimizer=OptimizerOptions("adamw", base_lr=0.024), **common))[0]  # lr 3e-3 at global batch 32
    assert exact["summary"]["eval_accuracy"] > 0.8  # chance is 0.1
    stale = run(TrainConfig(mode="ps-async", ps=PsOptions(max_staleness=1),
                            optimizer=OptimizerOptions("adamw", base_lr=0.012), **common))[0]  # stale: gentler
    losses = [r["loss"] for r in stale["rows"]]
    assert np.mean(losses[-20:]) < 0.8 * np.mean(losses[:20])
    assert stale["summary"]["eval_accuracy"] > 0.3
    assert [r["loss"] for r in stale["rows"]] != [r["loss"] for r in exact["rows"]]  # staleness matters


def _initial_params():
    import torch
    from meshscale.train.recipe import resolve
    from meshscale.train.builders import build_model
    spec, _ = resolve(TrainConfig(model="small-cnn", image_size=8))
    torch.manual_seed(0)
    return torch.nn.utils.parameters_to_vector(build_model(spec).parameters()).detach().numpy()


def test_meshscale_schedule_as_the_collective():
    sched = _train("allreduce", 2, allreduce=AllreduceOptions(fusion_mb=SMALL_BUCKETS.fusion_mb, collective="schedule:ring"))
    assert sched[0]["summary"]["max_param_diff"] == 0.0
    np.testing.assert_allclose(sched[0]["params"], _train("allreduce", 2)[0]["params"], rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # inductor compiles in every rank
def test_compiled_model_trains_like_the_eager_one():
    """--compile wraps the compiled model in the exchange (not the other way round): ranks stay identical and the
    parameters match the eager run (inductor reorders float sums: small tolerance)."""
    for mode in ("ddp", "allreduce"):
        compiled, eager = _train(mode, 2, speed=SpeedOptions(compile="default")), _train(mode, 2)
        assert max(o["summary"]["max_param_diff"] for o in compiled) == 0.0
        np.testing.assert_allclose(compiled[0]["params"], eager[0]["params"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("world, servers", [(3, 1), (4, 2)])
def test_dedicated_servers_match_one_rank(world, servers, one_rank):
    """2 workers and 1 or 2 dedicated server ranks train exactly like 1 rank on the same global batch; every
    rank (servers too) holds the same parameters after each step; staleness 0 equals ps-sync."""
    workers = world - servers
    base = dict(model="small-cnn", data="synthetic", image_size=8, world=world, batch_per_rank=GLOBAL_BATCH // workers,
                steps=4, timing_warmup=1, debug=CHECKED, timeout_s=60)
    sync = run(TrainConfig(mode="ps-sync", ps=PsOptions(servers=servers), **base))
    assert max(o["summary"]["max_param_diff"] for o in sync) == 0.0
    np.testing.assert_allclose(sync[0]["params"], one_rank, rtol=1e-5, atol=1e-6)
    if servers == 1:
        stale0 = run(TrainConfig(mode="ps-async", ps=PsOptions(max_staleness=0, servers=servers), **base))
        np.testing.assert_array_equal(stale0[0]["params"], sync[0]["params"])
