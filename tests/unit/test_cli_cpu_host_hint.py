"""sim and plan on a machine without GPUs and without --system model its CPU workers: the one notice line says so
and names the ways to a GPU prediction (`simulate.fabric._cpu_host_hint`, added once where the fabric resolves
this machine)."""
import pytest

from meshscale.simulate import fabric
from meshscale.topology.discover import Discovery, cpu_topology


@pytest.fixture
def no_gpu(monkeypatch):
    found = Discovery(cpu_topology(2), "no NVIDIA GPU found (test): using 2 CPU workers", cpu_only=True)
    monkeypatch.setattr(fabric, "discover", lambda workers=None: found)


def _notes(stderr):
    return [line for line in stderr.splitlines() if line.strip()]


def test_the_hint_names_both_ways_to_a_gpu_prediction(cli, no_gpu):
    result = cli("sim", "all_reduce")
    assert result.exit_code == 0, result.output
    [line] = _notes(result.stderr)
    assert line.startswith("no NVIDIA GPU found") and "--algo auto" in line and "--system NAME" in line


@pytest.mark.parametrize("args", [("sim", "all_reduce", "--algo", "auto"), ("plan", "all_reduce")])
def test_on_meshscale_schedules_the_hint_names_only_the_system(cli, no_gpu, args):
    """plan shows meshscale's schedules: --algo auto is what it already does."""
    result = cli(*args)
    assert result.exit_code == 0, result.output
    [line] = _notes(result.stderr)
    assert "--algo auto" not in line and "--system NAME" in line


def test_a_named_system_or_a_gpu_machine_gets_no_hint(cli, no_gpu, monkeypatch):
    assert "--system NAME" not in cli("sim", "all_reduce", "--system", "hgx-h200").stderr
    gpus = Discovery(cpu_topology(2), "")  # what discovery answers on a GPU machine: not cpu_only
    monkeypatch.setattr(fabric, "discover", lambda workers=None: gpus)
    assert _notes(cli("sim", "all_reduce").stderr) == []


def test_commands_that_predict_nothing_keep_the_plain_notice(no_gpu):
    _, notice = fabric.resolve_topology(None)
    assert notice == "no NVIDIA GPU found (test): using 2 CPU workers"
