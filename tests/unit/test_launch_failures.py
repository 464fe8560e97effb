"""How a failed rank's cause reaches `meshscale launch`: what a rank records, torch's agent reads back (its own
`ProcessFailure`), and the launcher's lines put the first failure first, name the ranks stopped after it, and
give ranks that failed alike one line; the folders of launchers killed outright are removed by the next."""
import json
import os
import signal
import tempfile

import pytest

from meshscale.execute.world import ERROR_FILE_ENV, LAUNCHER_REPORTS_ENV, tell_launcher


def test_what_a_rank_records_torchs_agent_reads_back(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    monkeypatch.delenv(LAUNCHER_REPORTS_ENV, raising=False)
    line = "rank 1 on node3 stopped during training step 7 (ddp): no space left"
    assert tell_launcher(line) is False  # plain torchrun: the rank still prints its line
    assert ProcessFailure(local_rank=1, pid=1, exitcode=2, error_file=str(path)).message == line
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]  # written whole, no temporary file left
    monkeypatch.setenv(LAUNCHER_REPORTS_ENV, "1")
    assert tell_launcher(line) is True  # under `meshscale launch` the launcher prints it


def test_a_rank_without_a_launcher_or_a_writable_error_file_prints_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_REPORTS_ENV, "1")
    monkeypatch.delenv(ERROR_FILE_ENV, raising=False)
    assert tell_launcher("x") is False
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "no" / "such" / "folder" / "error.json"))
    assert tell_launcher("x") is False


def _failure(tmp_path, rank: int, exitcode: int, timestamp: int, message=None):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / f"error{rank}.json"
    if message is not None:
        path.write_text(json.dumps(message))
    failure = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(path))
    failure.timestamp = timestamp
    return failure


def test_the_first_failure_comes_first_and_the_ranks_stopped_after_it_say_so(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from meshscale.execute.elastic import failure_lines, rank_failures

    # torch's own @record format (a mapping) and meshscale's (a string) both give the rank's first line
    recorded = {"message": {"message": "RuntimeError: CUDA error: out of memory\nmore",
                            "extraInfo": {"timestamp": "5"}}}
    failures = {0: _failure(tmp_path, 0, -signal.SIGTERM, 9),
                1: _failure(tmp_path, 1, -signal.SIGKILL, 3),
                2: _failure(tmp_path, 2, 2, 5, recorded),
                3: _failure(tmp_path, 3, 2, 6, {"message": "rank 3 on h stopped during step 2: peer gone",
                                                "timestamp": 6})}
    lines = failure_lines(rank_failures(ChildFailedError("meshscale", failures), "h"))
    assert lines == [
        "rank 1 (local 1) on h: killed by SIGKILL, no message from it",
        "rank 0 (local 0) on h: ended by SIGTERM after rank 1 failed (the launcher stops the others)",
        "rank 2 (local 2) on h: exit code 2: RuntimeError: CUDA error: out of memory",
        "rank 3 (local 3) on h: exit code 2: rank 3 on h stopped during step 2: peer gone",
    ]


@pytest.mark.parametrize("first_exit", [-signal.SIGTERM, -signal.SIGKILL])
def test_a_rank_that_fails_first_by_a_signal_is_never_said_to_be_stopped_by_the_launcher(tmp_path, first_exit):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from meshscale.execute.elastic import rank_failures

    failures = {0: _failure(tmp_path, 0, first_exit, 1), 1: _failure(tmp_path, 1, -signal.SIGTERM, 2)}
    first, second = rank_failures(ChildFailedError("meshscale", failures), "h")
    assert first.rank == 0 and first.after_rank is None and "killed by" in first.cause()
    assert second.after_rank == 0


@pytest.mark.parametrize("restart_count, max_restarts, launcher_prints", [("0", "2", False), ("1", "2", False),
                                                                           ("2", "2", True), ("0", "0", True)])
def test_the_launcher_prints_a_ranks_line_only_in_the_agents_last_attempt(tmp_path, monkeypatch, restart_count,
                                                                          max_restarts, launcher_prints):
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "error.json"))
    monkeypatch.setenv(LAUNCHER_REPORTS_ENV, "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart_count)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", max_restarts)
    assert tell_launcher("x") is launcher_prints


def test_ranks_that_failed_alike_share_a_line_and_every_rank_is_named_once(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from meshscale.execute.elastic import failure_lines, rank_failures

    refused = {"message": "unknown collective 'x'; use one of all_reduce", "timestamp": 1}
    # 8 ranks: 3 killed first, 0-2 and 4-6 refused the same option, 7 was stopped by the launcher afterwards
    failures = {r: _failure(tmp_path, r, 2, 2, refused) for r in (0, 1, 2, 4, 5, 6)}
    failures[3] = _failure(tmp_path, 3, -signal.SIGKILL, 1)
    failures[7] = _failure(tmp_path, 7, -signal.SIGTERM, 4)
    lines = failure_lines(rank_failures(ChildFailedError("meshscale", failures), "h"))
    assert lines == ["rank 3 (local 3) on h: killed by SIGKILL, no message from it",
                     "ranks 0-2, 4-6 (local 0-2, 4-6) on h: exit code 2: unknown collective 'x'; use one of all_reduce",
                     "rank 7 (local 7) on h: ended by SIGTERM after rank 3 failed (the launcher stops the others)"]


def test_the_folders_of_launchers_killed_outright_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from meshscale.safe_io import remove_stale_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = gone.stdout.strip()
    dead, live = tmp_path / f"meshscale-launch-{pid}-ab12", tmp_path / f"meshscale-launch-{os.getpid()}-cd34"
    for folder in (dead, live):
        (folder / "run" / "attempt_0" / "0").mkdir(parents=True)
        (folder / "run" / "attempt_0" / "0" / "error.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / f"meshscale-launch-{pid}-link").symlink_to(tmp_path / "elsewhere")
    assert remove_stale_scratch("launch") == 1
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["elsewhere", live.name, f"meshscale-launch-{pid}-link"])
    assert (tmp_path / "elsewhere").is_dir()  # a link is never followed


def test_launch_without_anything_to_run_is_one_line(cli):
    result = cli("launch")
    assert result.exit_code == 2 and "meshscale launch --standalone" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def agent(monkeypatch):
    """torchrun's agent replaced: the commands it would have run on the ranks, none started."""
    from meshscale.execute import elastic
    started = []
    monkeypatch.setattr(elastic, "run_launch", lambda plan, host: started.append(plan.entrypoint_args) or [])
    return started


@pytest.mark.parametrize("command, message", [
    (["train", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["train", "--model", "small-cnn", "--precision", "fp9"], "unknown precision 'fp9'"),
    (["train", "--model", "small-cnn", "--steps", "3", "--timing-warmup", "3"], "--timing-warmup 3"),
    (["scale", "--model", "no-such-model", "--strong", "--global-batch", "8"], "unknown model 'no-such-model'"),
])
def test_launch_refuses_a_bad_command_before_any_rank_starts(cli, agent, tmp_path, monkeypatch, command, message):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = cli("launch", "--standalone", "--nproc-per-node", "2", "--", *command)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], lines
    assert agent == [] and list(tmp_path.iterdir()) == []  # no rank, and no log folder for them


def test_launch_starts_a_good_command(cli, agent, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = cli("launch", "--standalone", "--nproc-per-node", "2", "--", "train", "--model", "small-cnn")
    assert result.exit_code == 0, result.output
    [args] = agent
    assert args[-4:] == ["meshscale", "train", "--model", "small-cnn"]
