"""bench CLI: bad input is one line on stderr and exit code 2; wrong results give exit code 1."""
import pytest

from meshscale.results import Result


@pytest.mark.parametrize("args, message", [
    (["all_gather", "--cpus", "4", "-b", "24", "-e", "24"], "does not split into 4 ranks"),
    (["-b", "2M", "-e", "1M", "--cpus", "2"], "smaller than --min-bytes"),
    (["--op", "xor", "--cpus", "2"], "unknown reduction op"),
    (["--dtype", "float8", "--cpus", "2"], "unknown dtype"),
    (["--gpus", "8"], "--gpus 8: this machine has 0 GPUs"),
    (["alltoal", "--cpus", "2"], "unknown collective"),
    (["--op", "avg", "--cpus", "2"], "--op avg needs NCCL"),
    (["-b", "12Q", "--cpus", "2"], "cannot read size"),
    (["--impl", "nccl", "--cpus", "2"], "--impl nccl calls NCCL directly and needs GPUs"),
    (["--impl", "mpi", "--cpus", "2"], "use native, meshscale or nccl"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    out = cli("bench", "collective", *args)
    code = out.exit_code
    assert code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshscale: error: ") and message in lines[0]


def test_wrong_results_exit_1(monkeypatch, cli):
    row = {"collective": "all_reduce", "size_bytes": 8, "count": 2, "dtype": "float32", "redop": "sum", "root": -1,
           "inplace": True, "time_s": 1e-5, "algbw_bytes_per_s": 8e5, "busbw_bytes_per_s": 8e5, "wrong": 1,
           "bound_busbw_bytes_per_s": None}
    fake = Result("bench-collective", [row], meta={"world_size": 2, "backend": "gloo", "average": 3})
    monkeypatch.setattr("meshscale.bench.collective.bench_collectives", lambda *a, **k: fake)
    out = cli("bench", "collective", "--cpus", "2")
    code = out.exit_code
    assert code == 1 and "wrong" in out.stderr
