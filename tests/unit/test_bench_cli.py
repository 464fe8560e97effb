"""bench CLI: bad input is one line on stderr and exit code 2; wrong results give exit code 1."""
import pytest

from meshscale.errors import MeshscaleError
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
    # the one --algo vocabulary, where the implementation can run it
    (["--algo", "fastest", "--cpus", "2"], "unknown --algo 'fastest'; use one of nccl, auto, ring"),
    (["--algo", "ring", "--cpus", "2"], "--algo ring with --impl native"),
    (["--algo", "nccl", "--impl", "meshscale", "--cpus", "2"], "--algo nccl with --impl meshscale"),
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
    assert out.exit_code == 1 and "wrong" in out.stderr


def _spec_of(monkeypatch, cli, command, *args):
    """The spec `bench <command>` hands to the benchmark (stopped there with a one-line error)."""
    seen = {}

    def fake(spec, world, timeout_s, **_):
        seen["spec"] = spec
        raise MeshscaleError("stopped by the test")
    name = "meshscale.bench.collective.bench_collectives" if command == "collective" else "meshscale.bench.p2p.bench_p2p"
    monkeypatch.setattr(name, fake)
    out = cli("bench", command, "--cpus", "2", *args)
    assert out.exit_code == 2 and "stopped by the test" in out.stderr
    return seen["spec"]


@pytest.mark.parametrize("args, expected", [
    ([], {"average": 1, "check": True, "cuda_graph": False}),  # nccl-tests' defaults: mean over ranks, checked
    (["-a", "3"], {"average": 3}),
    (["-c", "0"], {"check": False}),
    (["--check", "1"], {"check": True}),
    (["--no-check"], {"check": False}),
    (["-G", "1"], {"cuda_graph": True}),
    (["--cuda-graph", "0"], {"cuda_graph": False}),
    (["-G", "5"], {"cuda_graph": True}),
    (["-b", "8", "-e", "64", "-f", "8", "-o", "max", "-d", "int32", "-n", "3", "-w", "1"],
     {"sizes_bytes": [8, 64], "ops": ("max",), "dtypes": ("int32",), "iters": 3, "warmup_iters": 1}),
    (["-d", "half,bfloat16,double", "-o", "min,prod"], {"dtypes": ("float16", "bfloat16", "float64"), "ops": ("min", "prod")}),
    (["-d", "all", "-o", "all"], {"dtypes": ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"),
                                  "ops": ("sum", "prod", "min", "max", "avg")}),
    (["-b", "1K", "-e", "4K", "-i", "1K"], {"sizes_bytes": [1024, 2048, 3072, 4096]}),
    (["-z", "1", "-C", "1"], {"blocking": True, "cpu_time": True}),
])
def test_nccl_tests_short_flags(monkeypatch, cli, args, expected):
    spec = _spec_of(monkeypatch, cli, "collective", *args)
    assert {k: getattr(spec, k) for k in expected} == expected


def test_timeout_is_nccl_tests_T(monkeypatch, cli):
    seen = {}

    def fake(spec, world, timeout_s, **_):
        seen["timeout_s"] = timeout_s
        raise MeshscaleError("stopped by the test")
    monkeypatch.setattr("meshscale.bench.collective.bench_collectives", fake)
    cli("bench", "collective", "--cpus", "2", "-T", "7")
    assert seen["timeout_s"] == 7


def test_p2p_size(monkeypatch, cli):
    assert _spec_of(monkeypatch, cli, "p2p", "--size", "1M").size_bytes == 1 << 20


@pytest.mark.parametrize("args, message", [
    (["collective", "-g", "8"], "--gpus 8: this machine has 0 GPUs"),
    (["p2p", "-g", "8"], "--gpus 8: this machine has 0 GPUs"),
    (["collective", "-c", "-1", "--cpus", "2"], "--check and --cuda-graph take 0"),
    (["collective", "-m", "4", "--cpus", "2"], "--agg-iters"),
    (["collective", "-d", "int8", "--cpus", "2"], "unknown dtype"),
    (["collective", "--format", "csv", "--cpus", "2"], "unknown format"),
])
def test_short_gpus_and_bad_counts(cli, args, message):
    out = cli("bench", *args)
    assert out.exit_code == 2 and message in out.stderr
