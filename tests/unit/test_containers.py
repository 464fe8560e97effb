"""The Dockerfile and the Slurm script: the image keeps the NGC torch and installs what pyproject lists; the
batch script composes the right `meshscale launch` lines (checked with stand-in srun/meshscale commands)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_uses_ngc_torch_and_every_other_dependency():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM nvcr\.io/nvidia/pytorch:\$\{NGC_TAG\}", text, re.M)
    assert re.search(r"^ARG NGC_TAG=\d\d\.\d\d-py3$", text, re.M)
    assert "pip install --no-cache-dir --no-deps ." in text
    for knob in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"):
        assert knob in text
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {re.split(r"[<>=!\[ ]", d)[0].lower() for d in deps} - {"torch"}
    installed = re.search(r'RUN pip install --no-cache-dir (.*?) \\\n', text).group(1)
    have = {re.split(r"[<>=!\[ ]", d.strip('"'))[0].lower() for d in installed.split()}
    assert have == wanted, f"Dockerfile installs {sorted(have)}, pyproject needs {sorted(wanted)}"


@pytest.mark.parametrize("nodes, counts", [(4, [1, 2, 4]), (3, [1, 2, 3]), (1, [1])])
def test_sbatch_runs_collectives_on_all_nodes_and_scales_over_node_counts(tmp_path, nodes, counts):
    if not shutil.which("bash"):
        pytest.fail("bash is needed to test the Slurm script")
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    hosts = [f"node{i:02d}" for i in range(nodes)]
    stubs = {
        "scontrol": "printf '%s\\n' " + " ".join(hosts),
        "srun": 'echo "srun $*" >> "$LOG"; while [ "${1#--}" != "$1" ]; do shift; done; "$@"',
        "meshscale": 'echo "meshscale $*" >> "$LOG"',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=str(log), SLURM_JOB_ID="42",
               SLURM_JOB_NODELIST="ignored-by-the-stub", OUT=str(tmp_path / "out"))
    done = subprocess.run(["bash", str(ROOT / "scripts" / "slurm" / "meshscale.sbatch")], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    launches = [c for c in calls if c.startswith("meshscale launch ")]
    assert all("--rdzv-backend=c10d --rdzv-endpoint=node00:29500" in c and " -- " in c for c in launches)
    collective = [c for c in launches if " -- bench collective " in c]
    assert len(collective) == 1 and f"--nnodes={nodes} " in collective[0]
    trains = [c for c in launches if " -- train " in c]
    assert [int(re.search(r"--nnodes=(\d+)", c).group(1)) for c in trains] == counts
    sruns = [c for c in calls if c.startswith("srun") and "meshscale launch" not in c]
    node_lists = [re.search(r"--nodelist=(\S+)", c).group(1) for c in calls if c.startswith("srun --nodes") and "--ntasks-per-node" in c]
    assert node_lists[-1] == ",".join(hosts[: counts[-1]])
    assert calls[-1].startswith("meshscale report") and sruns
