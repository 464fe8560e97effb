"""benchmarks/train_vs_plain.py's multi-rank comparison, dry run on 2 Gloo ranks under torchrun: both sides train,
and they train the same thing. Both build the model from the same seed and take the same per-rank batch, and the
plain side applies the same plan by hand, so their first two losses agree: other weights or other data on a rank
part the first losses (seen: a seed off by one, or reversed sequences, move the first loss by 2e-3 to 3e-3
relative), a plan that drops or double-counts a shard or a gradient parts the first or the second.

Tolerance: fp32, the same kernels in the same order on both sides; the global loss is averaged in fp32 on
meshscale's side and in float64 on the plain side, a few units in fp32's last place (1.2e-7 relative). 1e-6 leaves
~10x over that, while the losses move by about 3e-3 relative from one step to the next (checked below): another
batch, another step or another init is far outside it."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_vs_plain.py"
RTOL = 1e-6


def _run(args: list[str], nproc: int | None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """The script (under torchrun --standalone: the agent's store takes a free port), killed with its process
    group on timeout."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] \
        if nproc else [sys.executable]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    p = subprocess.Popen([*launch, str(SCRIPT), *args], env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# torchtitan's own checkpointing policy keeps tp's reduce-scatter outputs: another schedule, the same arithmetic
@pytest.mark.slow  # two torchrun runs of two fresh ranks each
@pytest.mark.parametrize("layout, policy", [("fsdp=2", "meshscale"), ("tp=2", "meshscale"), ("tp=2", "torchtitan")])
def test_two_ranks_train_both_sides_from_the_same_first_loss(layout, policy):
    done = _run(["--dry-run", "--layout", layout, "--plain-checkpointing", policy, "--timeout-s", "60"], nproc=2)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    first = [r["first_losses"] for r in rows if "first_losses" in r]
    assert len(first) == 1   # rank 0 alone prints
    ours, plain = first[0]["meshscale"], first[0]["plain"]
    assert ours[0] == pytest.approx(plain[0], rel=RTOL)
    assert ours[1] == pytest.approx(plain[1], rel=RTOL)
    assert abs(ours[1] - ours[0]) > 100 * RTOL * ours[0]   # a step moves the loss far beyond the tolerance
    rounds = [r for r in rows if "round" in r]
    assert [r["round"] for r in rounds] == [0, 1] and all(r["ranks"] == 2 for r in rounds)
    for r in rounds:   # both sides ran; the ratio is their throughputs'
        assert r["meshscale_tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["meshscale_tokens_per_s"] / r["plain_tokens_per_s"])
        assert r["meshscale_tokens_per_s_per_rank"] == pytest.approx(r["meshscale_tokens_per_s"] / 2)
    summary = [line for line in done.stdout.splitlines() if line.startswith(f"llama {layout.replace('=', '')}")
               and "on 2 CPU ranks" in line]
    assert len(summary) == 1 and "meshscale / plain throughput" in summary[0]


@pytest.mark.parametrize("layout, says", [("tp=2", "the world has 1"), ("cp=2", "no plain counterpart")])
def test_a_layout_it_cannot_run_is_one_line_and_exit_2(layout, says):
    done = _run(["--dry-run", "--layout", layout], nproc=None, timeout_s=60)
    assert done.returncode == 2
    assert done.stderr.startswith("train_vs_plain: error: ") and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
