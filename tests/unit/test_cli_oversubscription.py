"""More CPU worker processes than the cores this process may use is one warning line on stderr, not an error,
printed by the launcher every command's ranks start through (`meshscale.execute.world.oversubscription`), after the
command checked its input: a bad-input error stays one line."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.execute import launcher, world


class Stopped(MeshscaleError):
    pass


@pytest.fixture
def two_cores(monkeypatch):
    """Two usable cores, no torchrun, and the ranks never start: the launcher stops where it would make them."""
    monkeypatch.setattr(world, "usable_cores", lambda: 2)
    monkeypatch.setattr(launcher, "_WARNED", set())
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def stop(*args, **kwargs):
        raise Stopped("stopped before the ranks start")
    monkeypatch.setattr(launcher, "_local_store", stop)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("meshscale: warning:")]


@pytest.mark.parametrize("args", [
    ("train", "--model", "small-cnn", "--cpus", "{n}", "--steps", "6"),
    ("scale", "--model", "small-cnn", "--strong", "--global-batch", "12", "--cpus", "{n}", "--steps", "6"),
    ("bench", "collective", "all_reduce", "--cpus", "{n}", "-b", "1K", "-e", "1K"),
    ("bench", "p2p", "--cpus", "{n}"),
], ids=lambda args: " ".join(args[:2]))
def test_every_command_warns_beyond_the_cores(cli, two_cores, args):
    fits = cli(*(a.format(n=2) for a in args))
    assert _warnings(fits.stderr) == [] and "stopped before the ranks start" in fits.stderr
    over = cli(*(a.format(n=3) for a in args))
    [line] = _warnings(over.stderr)
    assert "3 CPU worker processes" in line and "2 cores" in line, line


def test_a_bad_input_error_stays_one_line(cli, two_cores):
    result = cli("train", "--model", "no-such-model", "--cpus", "3")
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("meshscale: error:"), lines


def test_gpus_and_torchrun_are_not_warned(two_cores, monkeypatch):
    assert world.oversubscription(3, "nccl") == ""
    assert world.oversubscription(2, "gloo") == ""
    assert world.oversubscription(3, "gloo")


def test_usable_cores_reads_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(world.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert world.usable_cores() == 1
