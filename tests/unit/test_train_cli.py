"""Bad input to `meshscale train` / `meshscale scale`: one line on stderr, exit code 2, nothing started."""
import sys

import pytest
import torch

from meshscale.cli import main

@pytest.mark.parametrize("argv, message", [
    (["train", "--model", "nope"], "unknown model 'nope'"),
    (["train", "--data", "/no/such/folder"], "/no/such/folder does not exist"),
    (["train", "--mode", "gossip"], "unknown mode 'gossip'"),
    (["scale", "--cpus", "1,3", "--strong", "--global-batch", "16"], "not divisible by 3"),
    (["scale", "--cpus", "1,2", "--weak"], "--weak needs --batch"),
    (["train", "--precision", "fp16", "--mode", "ps-sync"], "use --precision bf16"),
    (["train", "--cuda-graph", "--cpus", "2"], "--cuda-graph needs GPUs"),
    (["train", "--ps-servers", "1", "--cpus", "2"], "needs --mode ps-sync or ps-async"),
    (["train", "--mode", "ps-sync", "--ps-servers", "2", "--cpus", "2"], "at least one worker left"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, cli):
    run = cli(*argv)
    code, err = run.exit_code, run.stderr.strip()
    assert code == 2
    assert err.startswith("meshscale: error: ") and message in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has 8 GPUs")
def test_more_gpus_than_the_machine_has(cli):
    run = cli("scale", "--gpus", "1,8", "--weak", "--batch", "4")
    code, err = run.exit_code, run.stderr.strip()
    assert code == 2 and "--gpus 8: this machine has" in err and "\n" not in err


def _flags(command: str) -> set[str]:
    import typer.main
    from meshscale.cli import app
    params = typer.main.get_command(app).commands[command].params
    return {opt for p in params for opt in (*p.opts, *p.secondary_opts)}


def test_train_and_scale_take_their_options_from_one_declaration():
    from meshscale.train.config import option_fields
    declared = list(option_fields())
    train, scale = _flags("train"), _flags("scale")

    def spellings(f):
        return {flag for declaration in f.flags for flag in declaration.split("/")}
    assert all(spellings(f) <= train for f in declared)
    assert all(spellings(f) <= scale for f in declared if not f.train_only)
    assert not any(spellings(f) & scale for f in declared if f.train_only)
    assert "--model" in scale and "--checkpoint-dir" in train - scale
    assert {"--lr", "--fusion-mb", "--ps-servers", "--timeout-s", "--no-timing"} <= train & scale


class _Started(Exception):
    """Raised instead of starting ranks: carries what the command would have run."""


def _capture(monkeypatch, module, name):
    def stop(*args, **kwargs):
        raise _Started(args)
    monkeypatch.setattr(module, name, stop)


def test_train_options_land_in_their_config_groups(monkeypatch):
    from meshscale.train import runner
    _capture(monkeypatch, runner, "train")
    monkeypatch.setattr(sys, "argv", ["meshscale", "train", "--cpus", "3", "--mode", "allreduce", "--fusion-mb", "2",
                                      "--batch", "4", "--timeout-s", "7", "--no-timing", "--lr", "0.5", "--data", "digits",
                                      "--ps-servers", "0", "--checkpoint-dir", "ck"])
    with pytest.raises(_Started) as started:
        main()
    cfg = started.value.args[0][0]
    assert (cfg.world, cfg.device, cfg.mode, cfg.batch_per_rank, cfg.timeout_s, cfg.timing) == (3, "cpu", "allreduce", 4, 7.0, False)
    assert cfg.allreduce.fusion_mb == 2.0 and cfg.optimizer.base_lr == 0.5 and cfg.checkpoint.dir == "ck"
    assert cfg.eval_data == "digits-test" and cfg.logging.progress  # digits: evaluated on its test split


def test_scale_sweeps_counts_with_its_own_defaults(monkeypatch):
    from meshscale.train import scale
    _capture(monkeypatch, scale, "scale")
    monkeypatch.setattr(sys, "argv", ["meshscale", "scale", "--cpus", "2,1", "--weak", "--batch", "6", "--mode", "ps-async",
                                      "--max-staleness", "2"])
    with pytest.raises(_Started) as started:
        main()
    cfg, worlds, weak, batch = started.value.args[0]
    assert (worlds, weak, batch, cfg.device) == ([1, 2], True, 6, "cpu")
    assert (cfg.steps, cfg.ps.max_staleness) == (30, 2)


def test_train_and_scale_share_one_timing_warm_up_default(monkeypatch):
    from meshscale.train import runner, scale
    from meshscale.train.config import TrainConfig
    _capture(monkeypatch, scale, "scale")
    monkeypatch.setattr(sys, "argv", ["meshscale", "scale", "--cpus", "1", "--weak", "--batch", "6",
                                      "--steps", str(TrainConfig().timing_warmup + 1)])
    with pytest.raises(_Started) as started:
        main()
    assert started.value.args[0][0].timing_warmup == TrainConfig().timing_warmup
    _capture(monkeypatch, runner, "train")
    monkeypatch.setattr(sys, "argv", ["meshscale", "train", "--cpus", "1"])
    with pytest.raises(_Started) as started:
        main()
    assert started.value.args[0][0].timing_warmup == TrainConfig().timing_warmup


@pytest.mark.parametrize("argv", [["train", "--steps", "5", "--timing-warmup", "5"],
                                  ["scale", "--cpus", "1", "--weak", "--batch", "4", "--steps", "3"],
                                  ["scale", "--cpus", "2", "--model", "llama-tiny", "--layouts", "fsdp2", "--steps", "4",
                                   "--timing-warmup", "6"]])
def test_a_warm_up_not_below_steps_is_one_line(argv, cli):
    run = cli(*argv)
    err = run.stderr.strip()
    assert run.exit_code == 2 and "--timing-warmup" in err and "leaves none of the" in err and "\n" not in err
