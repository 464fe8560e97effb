"""What a file, a path, a launcher or a full disk can do to meshscale, generated per class: every case ends with
exit code 2, one line on stderr ('meshscale: error: ...'), no traceback, no file left behind, within a time limit.

Classes: special input paths (pipes, devices, folders, loops, over-long names, odd characters) for every command
that reads a file; outputs on a full file system (a small tmpfs, where this machine may mount one) and through
symlinks; launcher variables; `meshscale launch`'s torchrun options and the ranks' command; hostile result files
of every kind; system and token files; options that contradict each other. Cases run in this process (the `cli`
fixture) except where a real process matters (stdout on a full device, few file descriptors, signals)."""
from __future__ import annotations

import copy
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from test_fuzz_inputs import GOOD_SYSTEM, _listing, assert_refused, sandbox  # noqa: F401 (a fixture)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPORT = FIXTURES / "report"
CASE_TIMEOUT_S = 20
CASE_WALL_S = 10  # what one refused case may take: bad input is found before any work


def refused(cli, folder: Path, *args, before: set[str] | None = None):
    """Run the command and check the refusal (and its time)."""
    before = _listing(folder) if before is None else before
    start = time.monotonic()
    result = cli(*args)
    assert_refused(result, before, folder)
    assert time.monotonic() - start < CASE_WALL_S
    return result


# ---- special input paths ----------------------------------------------------------------------------------
def _make_fifo(d: Path, suffix: str) -> Path:
    os.mkfifo(d / f"pipe{suffix}")
    return d / f"pipe{suffix}"


def _make_loop(d: Path, suffix: str) -> Path:
    (d / f"a{suffix}").symlink_to(d / f"b{suffix}")
    (d / f"b{suffix}").symlink_to(d / f"a{suffix}")
    return d / f"a{suffix}"


def _make_dangling(d: Path, suffix: str) -> Path:
    (d / f"gone{suffix}").symlink_to(d / f"nowhere{suffix}")
    return d / f"gone{suffix}"


def _make_folder(d: Path, suffix: str) -> Path:
    (d / f"folder{suffix}").mkdir()
    return d / f"folder{suffix}"


SPECIAL_PATHS = {"fifo": _make_fifo, "device": lambda d, s: Path("/dev/null"), "zero device": lambda d, s: Path("/dev/zero"),
                 "symlink loop": _make_loop, "dangling link": _make_dangling, "folder": _make_folder,
                 "long name": lambda d, s: d / ("x" * 300 + s), "long path": lambda d, s: d / "/".join(["y" * 200] * 25) / f"r{s}",
                 "newline": lambda d, s: d / f"two\nlines{s}", "missing": lambda d, s: d / f"missing{s}"}
# commands that read a file named by the user: {f} is the file (.json, or .yaml for "(yaml)" readers, .npy for data)
READERS = {
    "report": ("report", "{f}", "--output", "{out}"),
    "compare": ("compare", str(REPORT / "collective.json"), "{f}"),
    "sim --bench": ("sim", "all_reduce", "-s", "hgx-h200", "--gpus", "2", "-e", "1M", "--bench", "{f}"),
    "plan --p2p": ("plan", "all_reduce", "-s", "hgx-h200", "--gpus", "2", "--p2p", "{f}"),
    "predict --from": ("predict", "--model", "resnet50", "--from", "{f}"),
    "predict --p2p": ("predict", "--model", "resnet50", "-s", "hgx-h200", "--gpus", "2", "--p2p", "{f}"),
    "topo -s": ("topo", "-s", "{f}"),
    "topo -s (yaml)": ("topo", "-s", "{f}"),
    "plan -s": ("plan", "all_reduce", "-s", "{f}"),
    "cluster --node (yaml)": ("cluster", "--node", "{f}"),
    "train --data": ("train", "--model", "gpt-tiny", "--data", "{f}", "--steps", "2", "--timing-warmup", "1"),
}
SPECIAL_INPUT_CASES = [(kind, reader) for kind in SPECIAL_PATHS for reader in READERS]


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("kind,reader", SPECIAL_INPUT_CASES, ids=lambda x: x.replace(" ", "-"))
def test_special_input_paths_are_refused_before_opening(cli, sandbox, kind, reader):
    suffix = ".npy" if reader == "train --data" else ".yaml" if reader.endswith("(yaml)") else ".json"
    path = SPECIAL_PATHS[kind](sandbox.parent, suffix)
    args = [a.replace("{f}", str(path)).replace("{out}", str(sandbox / "out")) for a in READERS[reader]]
    refused(cli, sandbox, *args)


# ---- outputs: symlinks replaced, never written through; a full disk leaves nothing ------------------------
WRITERS = {
    "sim --json": (("sim", "all_reduce", "-s", "dgx1-v100", "-e", "64K", "--json"), ".json"),
    "plan --json": (("plan", "all_reduce", "-s", "dgx1-v100", "--gpus", "2", "--json"), ".json"),
    "plan --schedule": (("plan", "all_reduce", "-s", "dgx1-v100", "--gpus", "2", "--schedule"), ".json"),
    "plan --svg": (("plan", "all_reduce", "-s", "dgx1-v100", "--gpus", "2", "--svg"), ".svg"),
    "topo --output svg": (("topo", "-s", "dgx1-v100", "--format", "svg", "--output"), ".svg"),
    "topo --output png": (("topo", "-s", "dgx1-v100", "--format", "png", "--output"), ".png"),
    "topo --output json": (("topo", "-s", "dgx1-v100", "--format", "json", "--output"), ".json"),
    "cluster --json": (("cluster", "--json"), ".json"),
    "cluster --plot": (("cluster", "--plot"), ".png"),
    "predict --json": (("predict", "--model", "resnet50", "--json"), ".json"),
    "predict --plot": (("predict", "--model", "resnet50", "--plot"), ".svg"),
    "sim --csv": (("sim", "all_reduce", "-s", "dgx1-v100", "-e", "64K", "--csv"), ".csv"),
}


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("link", ["to a file", "dangling", "loop"])
def test_a_symlinked_output_is_replaced_not_followed(cli, sandbox, writer, link):
    words, suffix = WRITERS[writer]
    target = sandbox.parent / f"target{suffix}"
    out = sandbox / f"out{suffix}"
    if link == "to a file":
        target.write_text("keep me\n")
        out.symlink_to(target)
    elif link == "dangling":
        out.symlink_to(sandbox.parent / f"nowhere{suffix}")
    else:
        (sandbox / f"other{suffix}").symlink_to(out)
        out.symlink_to(sandbox / f"other{suffix}")
    result = cli(*words, out)
    assert result.exit_code == 0, result.output[-600:]
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0
    if link == "to a file":
        assert target.read_text() == "keep me\n"
    assert not (sandbox.parent / f"nowhere{suffix}").exists()
    assert not [p for p in sandbox.iterdir() if ".tmp" in p.name]


@pytest.mark.timeout(60)
def test_a_symlinked_training_log_is_replaced_not_followed(cli, sandbox):
    target = sandbox.parent / "elsewhere.jsonl"
    target.write_text("keep me\n")
    (sandbox / "log.jsonl").symlink_to(target)
    result = cli("train", "--steps", "2", "--timing-warmup", "1", "--batch", "2", "--log", sandbox / "log.jsonl")
    assert result.exit_code == 0, result.output[-600:]
    assert target.read_text() == "keep me\n" and not (sandbox / "log.jsonl").is_symlink()
    assert len((sandbox / "log.jsonl").read_text().splitlines()) == 2


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    """A 64 KiB tmpfs filled up, where this machine lets the tests mount one (root in a container); else skip."""
    where = tmp_path_factory.mktemp("full")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        try:
            with open(where / "pad", "wb") as f:
                while True:
                    f.write(b"\0" * 512)
                    f.flush()
        except OSError:  # full
            pass
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_full_disk_leaves_no_partial_output(cli, sandbox, full_disk, writer):
    words, suffix = WRITERS[writer]
    before = _listing(full_disk)
    result = cli(*words, full_disk / f"out{suffix}")
    assert result.exit_code == 2, result.output[-600:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("meshscale: error:") and "Traceback" not in result.output
    assert _listing(full_disk) == before


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_a_second_output_failing_removes_the_first(cli, sandbox, full_disk):
    before = _listing(sandbox)
    result = cli("plan", "all_reduce", "-s", "dgx1-v100", "--gpus", "2", "--schedule", sandbox / "s.json", "--svg", full_disk / "p.svg")
    assert result.exit_code == 2 and _listing(sandbox) == before


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("option", ["--log", "--checkpoint-dir"])
def test_training_files_on_a_full_disk(cli, sandbox, full_disk, option):
    before = _listing(full_disk)
    where = full_disk / ("log.jsonl" if option == "--log" else "ckpt")
    result = cli("train", "--steps", "400", "--timing-warmup", "1", "--batch", "2", option, where)
    assert result.exit_code == 2, result.output[-600:]
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    left = _listing(full_disk) - before
    if option == "--log":  # whole lines only, or nothing
        assert left <= {"log.jsonl"}
        if left:
            assert (full_disk / "log.jsonl").read_text().endswith("}\n")
            (full_disk / "log.jsonl").unlink()
    else:
        assert not left, left


# ---- launcher variables -----------------------------------------------------------------------------------
GOOD_LAUNCHER = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "LOCAL_RANK": "0"}
BAD_LAUNCHER = {"RANK": ["abc", "-1", "2", "1.5", ""], "WORLD_SIZE": ["0", "two", "99999999", "-2"],
                "MASTER_ADDR": ["", "no.such.host.invalid", "a b", "x" * 300],
                "MASTER_PORT": ["99999", "0", "http", "-1", ""], "LOCAL_RANK": ["x", "-1", "5"]}
LAUNCHER_CASES = [(name, value) for name, values in BAD_LAUNCHER.items() for value in values]
LAUNCHED = {"train": ("train", "--steps", "2", "--timing-warmup", "1", "--batch", "2"),
            "bench": ("bench", "collective", "all_reduce", "-e", "1K"),
            "scale": ("scale", "--weak", "--batch", "2", "--steps", "2", "--timing-warmup", "1")}


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("command", sorted(LAUNCHED))
@pytest.mark.parametrize("name,value", LAUNCHER_CASES)
def test_bad_launcher_variables_are_one_line(cli, sandbox, monkeypatch, command, name, value):
    for key, good in GOOD_LAUNCHER.items():
        monkeypatch.setenv(key, good)
    monkeypatch.setenv(name, value)
    result = refused(cli, sandbox, *LAUNCHED[command])
    assert name in result.stderr or "launcher" in result.stderr


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("missing", ["MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK"])
def test_a_missing_launcher_variable_is_named(cli, sandbox, monkeypatch, missing):
    for key, good in GOOD_LAUNCHER.items():
        monkeypatch.setenv(key, good)
    monkeypatch.delenv(missing)
    result = refused(cli, sandbox, *LAUNCHED["train"])
    assert missing in result.stderr


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_no_peer_at_the_rendezvous_is_one_line_within_the_timeout(cli, sandbox, monkeypatch):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, good in {**GOOD_LAUNCHER, "RANK": "1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, good)
    result = refused(cli, sandbox, *LAUNCHED["train"], "--timeout-s", "1")
    assert "rank 1" in result.stderr and str(port) in result.stderr


# ---- `meshscale launch`: torchrun's options and the ranks' command ----------------------------------------
BAD_TORCHRUN = {"--nnodes": ["0", "abc", "3:2", "-1", "1:0", ""], "--nproc-per-node": ["0", "-2", "abc", ""],
                "--max-restarts": ["-1", "x"], "--monitor-interval": ["-1", "0", "nan", "x"],
                "--start-method": ["nope"], "--redirects": ["9", "x:1"], "--local-ranks-filter": ["a,b"],
                "--shutdown-timeout": ["-1", "x"], "--logs-specs": ["nosuch"], "--rdzv-conf": ["=x", "a"]}
PROGRAM_OPTIONS = ["-m", "--module", "--no-python", "--run-path"]
BAD_COMMANDS = {"none": [], "unknown": ["nosuch"], "itself": ["launch", "--standalone", "--", "train"],
                "bad option value": ["train", "--steps", "-3"], "an option": ["--steps"]}
TRAIN_COMMAND = ["train", "--steps", "2", "--timing-warmup", "1"]


def _launch_refused(cli, sandbox, monkeypatch, *args):
    import tempfile
    tmp = sandbox / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the launcher's log folder would go here
    before = _listing(sandbox)
    start = time.monotonic()
    result = cli("launch", *args)
    assert_refused(result, before, sandbox)
    assert time.monotonic() - start < CASE_WALL_S


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("separated", [True, False], ids=["with --", "without --"])
@pytest.mark.parametrize("option,value", [(o, v) for o, values in BAD_TORCHRUN.items() for v in values])
def test_bad_torchrun_options_are_one_line(cli, sandbox, monkeypatch, option, value, separated):
    _launch_refused(cli, sandbox, monkeypatch, "--standalone", option, value, *(["--"] if separated else []),
                    *TRAIN_COMMAND)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("option", PROGRAM_OPTIONS)
def test_torchrun_options_that_name_another_program_are_refused(cli, sandbox, monkeypatch, option):
    _launch_refused(cli, sandbox, monkeypatch, "--standalone", option, "--", *TRAIN_COMMAND)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("case", sorted(BAD_COMMANDS))
def test_a_bad_command_for_the_ranks_is_refused_before_any_rank_starts(cli, sandbox, monkeypatch, case):
    _launch_refused(cli, sandbox, monkeypatch, "--standalone", "--nproc-per-node", "2", "--", *BAD_COMMANDS[case])


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_a_word_before_the_separator_is_refused(cli, sandbox, monkeypatch):
    _launch_refused(cli, sandbox, monkeypatch, "--standalone", "stray", "--", *TRAIN_COMMAND)


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_an_unknown_option_of_the_ranks_command_is_one_usage_error(cli, sandbox, monkeypatch):
    _launch_refused(cli, sandbox, monkeypatch, "--standalone", "--", "train", "--no-such-option")


# ---- hostile result files ---------------------------------------------------------------------------------
HOSTILE_VALUES = {"text": "two", "list": [1], "mapping": {"a": 1}, "huge": 1e300, "negative": -1}
# (fixture, where, key) -> the values of HOSTILE_VALUES a reader cannot use there
HOSTILE_FIELDS = {
    ("collective", "meta", "world_size"): ("text", "list", "mapping", "negative"),
    ("collective", "meta", "spec"): ("list", "text"),
    ("p2p", "machine", "gpus"): ("text", "mapping", "huge", "negative"),
    ("scale", "machine", "gpus"): ("list",),  # a list of numbers: GPU names are text
    ("collective", "row", "busbw_bytes_per_s"): ("huge", "text", "list", "negative"),
    ("collective", "row", "collective"): ("list", "mapping", "huge"),
    ("collective", "row", "inplace"): ("list", "mapping"),
    ("collective", "row", "root"): ("list", "mapping"),
    ("sim", "row", "algorithm"): ("list", "mapping", "negative"),
    ("p2p", "row", "src"): ("list", "mapping", "huge"),
    ("p2p", "row", "dst"): ("list", "mapping"),
    ("p2p", "row", "mode"): ("list", "mapping"),
    ("scale", "row", "mode"): ("list", "mapping"),
    ("scale", "row", "throughput_samples_per_s"): ("huge", "negative", "text"),
    ("predict", "row", "world_size"): ("text", "huge", "negative"),
}
ZERO_CASES = [("scale", "row", "throughput_samples_per_s"), ("predict", "row", "throughput_samples_per_s")]
RESULT_READERS = {
    "collective": ["report", "compare"], "sim": ["report", "compare"], "predict": ["report", "compare"],
    "p2p": ["report", "compare", "plan --p2p", "predict --p2p"], "scale": ["report", "compare", "predict --from"],
}


def _hostile(fixture: str, where: str, key: str, value) -> dict:
    data = json.loads((REPORT / f"{fixture}.json").read_text())
    target = data["rows"][0] if where == "row" else data.setdefault(where, {})
    target[key] = copy.deepcopy(value)
    return data


HOSTILE_CASES = ([(f, w, k, v, r) for (f, w, k), values in HOSTILE_FIELDS.items() for v in values
                  for r in RESULT_READERS[f]]
                 + [(f, w, k, "zero", r) for f, w, k in ZERO_CASES for r in RESULT_READERS[f]])


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("fixture,where,key,value,reader", HOSTILE_CASES, ids=lambda x: str(x))
def test_hostile_result_files_are_refused_before_rendering(cli, sandbox, fixture, where, key, value, reader):
    path = sandbox.parent / "hostile.json"
    path.write_text(json.dumps(_hostile(fixture, where, key, 0 if value == "zero" else HOSTILE_VALUES[value])))
    args = [a.replace("{f}", str(path)).replace("{out}", str(sandbox / "out")) for a in READERS[reader]]
    if reader == "compare":
        args = ["compare", str(REPORT / f"{fixture}.json"), str(path)]
    refused(cli, sandbox, *args)


@pytest.mark.timeout(60)
def test_text_that_looks_like_tex_is_drawn_as_text(cli, sandbox):
    system = copy.deepcopy(GOOD_SYSTEM)
    system["name"] = "dollar$box"
    system["nodes"][1]["name"] = "$\\foo{$"
    system["links"][0]["a"] = system["links"][1]["a"] = "$\\foo{$"
    path = sandbox.parent / "dollar.yaml"
    path.write_text(yaml.safe_dump(system))
    data = json.loads((REPORT / "collective.json").read_text())
    data["meta"]["label"] = "$\\foo{$"
    (sandbox.parent / "label.json").write_text(json.dumps(data))
    for args in (("topo", "-s", path, "--format", "svg", "--output", "t.svg"), ("topo", "-s", path, "--format", "png",
                 "--output", "t.png"), ("plan", "all_reduce", "-s", path, "--svg", "p.svg"),
                 ("report", sandbox.parent / "label.json", "--output", "r")):
        result = cli(*args)
        assert result.exit_code == 0, (args, result.output[-600:])


# ---- system files: names, and systems without GPUs -----------------------------------------------------------
@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("bad", ["gpu\n0", "gpu\x000", "gpu\r0", "g" * 300])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_node_names_of_more_than_one_line_are_refused(cli, sandbox, bad, suffix):
    system = copy.deepcopy(GOOD_SYSTEM)
    system["nodes"][1]["name"] = system["links"][0]["a"] = system["links"][1]["a"] = bad
    path = sandbox.parent / f"names{suffix}"
    path.write_text(json.dumps(system) if suffix == ".json" else yaml.safe_dump(system))
    refused(cli, sandbox, "topo", "-s", path)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("fmt", ["matrix", "json", "svg", "png"])
def test_a_system_without_gpus_can_be_shown(cli, sandbox, fmt):
    path = sandbox.parent / "cpus.yaml"
    path.write_text(yaml.safe_dump({"name": "cpus-only", "nodes": [{"name": "cpu0", "kind": "cpu"}, {"name": "cpu1", "kind": "cpu"}],
                                    "links": [{"a": "cpu0", "b": "cpu1", "kind": "qpi", "bandwidth_gb_per_s": 20}]}))
    extra = ("--output", f"cpus.{fmt}") if fmt in ("svg", "png") else ()
    result = cli("topo", "-s", path, "--format", fmt, *extra)
    assert result.exit_code == 0, result.output[-600:]


# ---- cluster files (validated on the issue 26 branch) -------------------------------------------------------
CLUSTER_BAD = {"nodes": ["abc", float("nan"), 2.5, 0, 100_000_000], "nics": ["many", 0], "node": [["a"]],
               "oversubscription": [float("inf"), 0], "gpudirect": ["no"], "radix": [0], "nodes_per_leaf": [0]}
CLUSTER_CASES = [(key, value) for key, values in CLUSTER_BAD.items() for value in values]


# (was xfail until cluster files went through the same checks as the options)
@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("key,value", CLUSTER_CASES, ids=str)
@pytest.mark.parametrize("command", ["topo", "cluster"])
def test_cluster_file_values_are_refused(cli, sandbox, key, value, command):
    entry = {"node": "dgx1-v100", "nodes": 4, key: value}
    path = sandbox.parent / "cluster.yaml"
    path.write_text(yaml.safe_dump({"cluster": entry}))
    refused(cli, sandbox, *((command, "-s", path) if command == "topo" else (command, "--system", path)))


# ---- token files ------------------------------------------------------------------------------------------
def _npy_header_broken(path: Path) -> None:
    np.save(path, np.arange(100, dtype=np.int32))
    data = path.read_bytes()
    path.write_bytes(data[:20] + b"{{{(" + data[24:])


TOKEN_FILES = {
    "objects.npy": lambda p: np.save(p, np.array([{"a": 1}, 2], dtype=object), allow_pickle=True),
    "pickle.npy": lambda p: p.write_bytes(pickle.dumps([1, 2, 3])),
    "floats.npy": lambda p: np.save(p, np.arange(5000, dtype=np.float32)),
    "bools.npy": lambda p: np.save(p, np.ones(5000, dtype=bool)),
    "2d.npy": lambda p: np.save(p, np.zeros((100, 100), dtype=np.int32)),
    "negative.npy": lambda p: np.save(p, -np.arange(5000, dtype=np.int64)),
    "header.npy": _npy_header_broken,
    "truncated.npy": lambda p: p.write_bytes(b"\x93NUMPY\x01\x00"),
    "empty.npy": lambda p: p.write_bytes(b""),
    "odd.bin": lambda p: p.write_bytes(b"\x01" * 4001),
    "empty.bin": lambda p: p.write_bytes(b""),
    "data.json": lambda p: p.write_text('{"tokens": [1, 2, 3]}'),
    "data.txt": lambda p: p.write_text("1 2 3\n"),
}


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("name", sorted(TOKEN_FILES))
def test_unusable_token_files_are_refused(cli, sandbox, name):
    path = sandbox.parent / name
    TOKEN_FILES[name](path)
    refused(cli, sandbox, "train", "--model", "gpt-tiny", "--data", path, "--steps", "2", "--timing-warmup", "1")


# ---- options and states that contradict each other ------------------------------------------------------------
CONTRADICTIONS = {
    "warmup = steps": ("train", "--steps", "5", "--timing-warmup", "5"),
    "warmup > steps": ("train", "--steps", "3", "--timing-warmup", "10"),
    "scale warmup > steps": ("scale", "--weak", "--batch", "2", "--steps", "5"),
    "eval nosuch": ("train", "--eval", "nosuch", "--steps", "2", "--timing-warmup", "1"),
    "eval a token file for images": ("train", "--eval", "tokens.npy", "--steps", "2", "--timing-warmup", "1"),
    "tour fast and full": ("tour", "--fast", "--full"),
    "root beyond the ranks (sim)": ("sim", "broadcast", "-s", "dgx1-v100", "--root", "99", "-e", "1M"),
    "root beyond the ranks (sim, 2 gpus)": ("sim", "reduce", "-s", "dgx1-v100", "--gpus", "2", "--root", "2", "-e", "1M"),
    "root beyond the ranks (plan)": ("plan", "broadcast", "-s", "dgx1-v100", "--root", "8"),
}


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_contradicting_options_are_refused_before_the_work(cli, sandbox, case):
    np.save(sandbox.parent / "tokens.npy", np.arange(100, dtype=np.int32))
    args = [str(sandbox.parent / a) if a == "tokens.npy" else a for a in CONTRADICTIONS[case]]
    refused(cli, sandbox, *args)


def _checkpoint(folder: Path, step: int, record_step: int | None = None, world: int = 1) -> None:
    (folder / f"step-{step:08d}").mkdir(parents=True)
    (folder / "latest").write_text(f"{step}\n")
    (folder / f"step-{step:08d}" / "rank0.json").write_text(json.dumps(
        {"step": step if record_step is None else record_step, "world": world, "rng": {}}))
    import torch
    torch.save({"model": {"nosuch.weight": torch.zeros(2)}, "exchange": {}}, folder / f"step-{step:08d}" / "rank0.pt")


CHECKPOINTS = {"beyond --steps": dict(step=999_999), "record disagrees": dict(step=3, record_step=999_999),
               "no RNG states": dict(step=3), "another world": dict(step=3, world=4)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_checkpoints_that_cannot_continue_are_one_line(cli, sandbox, case):
    folder = sandbox / "ckpt"
    _checkpoint(folder, **CHECKPOINTS[case])
    refused(cli, sandbox, "train", "--checkpoint-dir", folder, "--resume", "--steps", "10", "--timing-warmup", "1",
            "--batch", "2")


# ---- a real process: stdout, descriptors, signals ----------------------------------------------------------
def _meshscale(*args, **kwargs) -> subprocess.CompletedProcess:
    script = "import sys; from meshscale.cli import main; sys.argv[0] = 'meshscale'; main()"
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=60, **kwargs)


@pytest.mark.timeout(120)
def test_stdout_on_a_full_device_and_few_descriptors(tmp_path):
    with open("/dev/full", "w") as full:
        script = "import sys; from meshscale.cli import main; sys.argv[0] = 'meshscale'; main()"
        done = subprocess.run([sys.executable, "-c", script, "systems"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "No space" in done.stderr, done.stderr[-600:]

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    done = _meshscale("train", "--steps", "2", "--timing-warmup", "1", "--batch", "2", preexec_fn=few_files, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "ulimit" in done.stderr, done.stderr[-600:]
    assert not list(tmp_path.iterdir())


def test_scratch_files_of_dead_processes_are_removed(tmp_path, monkeypatch):
    from meshscale import safe_io
    monkeypatch.setattr(safe_io.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(safe_io.tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"meshscale-rows-{dead.stdout.strip()}-abcd.jsonl"
    alive = tmp_path / f"meshscale-rows-{os.getppid()}-abcd.jsonl"
    stale.write_text("")
    alive.write_text("")
    mine = safe_io.scratch_file("rows", ".jsonl")
    assert not stale.exists() and alive.exists() and mine.exists()
    safe_io.release_scratch(mine)
    assert not mine.exists()


@pytest.mark.timeout(60)
def test_sigterm_removes_scratch_files(tmp_path):
    script = ("import sys, time; from meshscale import safe_io; p = safe_io.scratch_file('rows', '.jsonl'); "
              "print(p, flush=True); time.sleep(30)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        path = Path(proc.stdout.readline().strip())
        assert path.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM  # the signal still ends the process as it would have
        assert not path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_new_classes_hold_a_few_hundred_cases():
    total = (len(SPECIAL_INPUT_CASES) + 3 * len(WRITERS) * 2 + len(LAUNCHER_CASES) * len(LAUNCHED) + len(HOSTILE_CASES)
             + len(TOKEN_FILES) + len(CONTRADICTIONS) + len(CHECKPOINTS) + len(CLUSTER_CASES) * 2)
    assert total >= 300, total


def test_yaml_numbers_with_an_exponent_are_numbers(tmp_path):
    from meshscale.topology import load_system, to_dict
    text = yaml.safe_dump(GOOD_SYSTEM).replace("bandwidth_gb_per_s: 16\n", "bandwidth_bytes_per_s: {}\n", 1)
    (tmp_path / "e.yaml").write_text(text.format("25e9").replace("latency_s: 1.0e-06", "latency_s: 1e-6"))
    (tmp_path / "plain.yaml").write_text(text.format("25000000000").replace("latency_s: 1.0e-06", "latency_s: 0.000001"))
    assert to_dict(load_system(str(tmp_path / "e.yaml"))) == to_dict(load_system(str(tmp_path / "plain.yaml")))


@pytest.mark.timeout(90)
def test_another_models_checkpoint_is_one_line(cli, sandbox):
    folder = sandbox / "ckpt"
    first = cli("train", "--model", "small-cnn", "--steps", "2", "--timing-warmup", "1", "--batch", "2",
                "--checkpoint-dir", folder)
    assert first.exit_code == 0, first.output[-600:]
    result = refused(cli, sandbox, "train", "--model", "gpt-tiny", "--steps", "4", "--timing-warmup", "1", "--batch",
                     "2", "--checkpoint-dir", folder, "--resume")
    assert "another model" in result.stderr


# ---- Flight Recorder dumps and NCCL logs (why-hung) ---------------------------------------------------------
WHY_HUNG_VALUES = {"null": None, "text": "two", "list": [1], "mapping": {"a": 1}, "huge": 1e300, "negative": -1,
                   "true": True, "5001 digits": "9" * 5001, "escape": "\x1b[2J\x1b]0;t\x07"}
# (where, key): values the reader takes there; every other value is refused in one line naming the field
WHY_HUNG_FIELDS = {("dump", "version"): (), ("dump", "pg_config"): (), ("dump", "entries"): (),
                   ("entry", "collective_seq_id"): (), ("entry", "profiling_name"): ("text", "escape"),
                   ("entry", "process_group"): ("text", "escape"), ("entry", "state"): (),
                   ("entry", "input_sizes"): (), ("entry", "is_p2p"): ("true",), ("group", "ranks"): ("list",)}
WHY_HUNG_CASES = [(w, k, v) for (w, k) in WHY_HUNG_FIELDS for v in WHY_HUNG_VALUES]


def _good_dump() -> dict:
    entry = {"process_group": ["0", "default_pg"], "collective_seq_id": 1, "profiling_name": "nccl:all_reduce",
             "input_sizes": [[8]], "state": "completed", "is_p2p": False}
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
            "entries": [entry]}


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("where,key,value", WHY_HUNG_CASES, ids=lambda x: str(x).replace(" ", "-"))
def test_why_hung_dump_fields(cli, sandbox, where, key, value):
    dump = _good_dump()
    target = {"dump": dump, "entry": dump["entries"][0], "group": dump["pg_config"]["0"]}[where]
    target[key] = WHY_HUNG_VALUES[value]
    folder = sandbox.parent / "dumps"
    folder.mkdir()
    for name, data in (("trace_0.json", json.dumps(dump).encode()), ("trace_1", pickle.dumps(dump))):
        (folder / name).write_bytes(data)
        if value in WHY_HUNG_FIELDS[(where, key)]:
            result = cli("why-hung", folder)
            assert result.exit_code == 0 and "\x1b" not in result.stdout, result.output
        else:
            result = refused(cli, sandbox, "why-hung", folder)
            assert key in result.stderr
        (folder / name).unlink()


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("kind", sorted(set(SPECIAL_PATHS) - {"missing"}))
@pytest.mark.parametrize("role", ["dump", "nccl log"])
def test_why_hung_special_files_are_refused_unread(cli, sandbox, kind, role):
    folder = sandbox.parent / "dumps"
    folder.mkdir()
    (folder / "trace_0.json").write_text(json.dumps(_good_dump()))
    path = SPECIAL_PATHS[kind](sandbox.parent, ".log")
    if role == "nccl log":
        refused(cli, sandbox, "why-hung", folder, "--nccl-log", path)
    elif path.parent == sandbox.parent and not path.name.startswith(("two", "x" * 300)):
        path.rename(folder / "trace_1.json")  # a pipe, link or folder where a rank's dump belongs
        result = cli("why-hung", folder)
        assert result.exit_code in (0, 2) and result.stderr.count("\n") <= 1, result.output
