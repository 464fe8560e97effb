"""Commands that run no GPU work never import torch: `python -X importtime` lists every module a run imported."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _imported(*args: str) -> set[str]:
    """The top-level package of every module `meshscale ARGS` imported (from its -X importtime report)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "80"}
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "meshscale", *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in lines}


@pytest.mark.parametrize("args", [("--version",), ("-h",), ("sim", "all_reduce", "-s", "dgx1-v100", "-e", "1M"),
                                  ("plan", "all_reduce", "-s", "dgx1-v100"),
                                  ("predict", "-s", "dgx1-v100", "--model", "resnet50", "--gpus", "1,8"),
                                  ("cluster", "--nodes", "16"), ("topo", "--system", "dgx1-v100"),
                                  ("systems",)])
@pytest.mark.slow  # a fresh interpreter per command
def test_commands_without_gpu_work_import_no_torch(args):
    imported = _imported(*args)
    assert "meshscale" in imported  # the report is read right
    assert "torch" not in imported


def test_version_and_help_skip_the_graph_libraries():
    imported = _imported("--version") | _imported("-h")
    assert not imported & {"torch", "scipy", "networkx", "numpy", "matplotlib"}


def test_network_names_in_help_are_the_cluster_model_s():
    from meshscale.cli.topology import NETWORKS as SPELLED
    from meshscale.topology.cluster import NETWORKS
    assert SPELLED == NETWORKS
