"""A fabric too large to plan or search is refused in one line (exit 2) naming the limit, before the work that
would not return."""
import time

import pytest

from meshscale.simulate.nccl import MAX_NODE_GPUS
from meshscale.simulate.plan import MAX_PLAN_RANKS


def _one_switch(tmp_path, gpus: int):
    lines = [f"name: sw{gpus}", "nodes:", "  - {name: sw, kind: nvswitch}"]
    lines += [f"  - {{name: gpu{i}, kind: gpu, index: {i}, model: NVIDIA H100}}" for i in range(gpus)]
    lines += ["links:"] + [f"  - {{a: gpu{i}, b: sw, kind: nvlink, count: 18, generation: 4}}" for i in range(gpus)]
    path = tmp_path / f"sw{gpus}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("command, gpus, limit", [("sim", MAX_NODE_GPUS + 1, MAX_NODE_GPUS),
                                                  ("plan", MAX_PLAN_RANKS + 1, MAX_PLAN_RANKS)])
def test_too_large_is_one_line_with_the_limit(cli, tmp_path, command, gpus, limit):
    start = time.perf_counter()
    r = cli(command, "all_reduce", "--system", _one_switch(tmp_path, gpus), "-b" if command == "sim" else "--bytes", "1M")
    assert r.exit_code == 2, r.output
    assert f"at most {limit}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert time.perf_counter() - start < 10
