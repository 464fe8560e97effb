"""Calibration takes only measurements of the kind of device it calibrates: a CPU/Gloo run, or another GPU model,
given as --bench or --p2p, is refused in one line naming what it is and what is needed."""
import re
from pathlib import Path

import pytest

from meshscale.results import Result

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _cpu_collective(tmp_path) -> Path:
    rows = [{"collective": "all_reduce", "size_bytes": s, "count": s // 4, "dtype": "float32", "redop": "sum",
             "root": -1, "inplace": True, "time_s": 1e-4 * s / 1024, "algbw_bytes_per_s": 1e7,
             "busbw_bytes_per_s": 1e7, "wrong": 0} for s in (1024, 65536)]
    return Result("bench-collective", rows, meta={"backend": "gloo", "world_size": 2}).save(tmp_path / "cpu.json")


def _cpu_p2p(tmp_path) -> Path:
    rows = [{"src": "worker0", "dst": "worker1", "mode": "unidirectional", "bandwidth_bytes_per_s": 5e9}]
    return Result("bench-p2p", rows, meta={"backend": "gloo", "world_size": 2, "devices": ["worker0", "worker1"]}
                  ).save(tmp_path / "p2p.json")


@pytest.mark.parametrize("command", [("predict", "--model", "resnet50", "--system", "hgx-h200"),
                                     ("sim", "all_reduce", "--system", "hgx-h200", "-e", "1M"),
                                     ("plan", "all_reduce", "--system", "dgx1-v100")])
@pytest.mark.parametrize("flag, make", [("--bench", _cpu_collective), ("--p2p", _cpu_p2p)])
def test_a_cpu_measurement_is_refused_for_a_gpu_system(cli, tmp_path, command, flag, make):
    run = cli(*command, flag, str(make(tmp_path)))
    assert run.exit_code == 2, run.output
    assert re.fullmatch(r"meshscale: error: [^\n]+\n", run.stderr), run.stderr
    assert f"{flag}: measured on 2 CPU worker processes over Gloo" in run.stderr and "GPUs over NCCL" in run.stderr


def test_another_gpu_model_is_refused_and_the_same_one_taken(cli):
    h200 = str(FIXTURES / "p2p_h200x2.json")
    refused = cli("sim", "all_reduce", "--system", "hgx-h100", "-e", "1M", "--p2p", h200)
    assert refused.exit_code == 2 and "NVIDIA H200 over NCCL, but hgx-h100 has H100 SXM" in refused.stderr
    taken = cli("sim", "all_reduce", "--system", "hgx-h200", "-e", "1M", "--p2p", h200)
    assert taken.exit_code == 0, taken.output
