"""Bad input of every class, generated from valid files and option tables, must end before any work starts:
exit code 2, one line on stderr starting 'meshscale: error:' (typer's own usage error for a value it cannot even
parse as the option's type), no traceback, no hang, and no file left behind."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASE_TIMEOUT_S = 30

GOOD_SYSTEM = {
    "name": "fuzz-box", "gpu_count": 2,
    "nodes": [{"name": "cpu0", "kind": "cpu"}, {"name": "gpu0", "kind": "gpu", "index": 0},
              {"name": "gpu1", "kind": "gpu", "index": 1}],
    "links": [{"a": "gpu0", "b": "gpu1", "kind": "nvlink", "generation": 2, "count": 2},
              {"a": "gpu0", "b": "cpu0", "kind": "pcie", "bandwidth_gb_per_s": 16, "latency_s": 1e-6},
              {"a": "gpu1", "b": "cpu0", "kind": "pcie", "bandwidth_gb_per_s": 16}],
}
NAN, INF = float("nan"), float("inf")
BAD_NUMBERS = [NAN, INF, -INF, -1, 0, 1e-300, 1e300, 1e12, "fast", "12", [1], {"x": 1}, True, None]
BAD_TYPES = [5, "text", [], {}, [5], None, True, 1.5]


# ---- generators ---------------------------------------------------------------------------------------------
def _set(data: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(data)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def system_cases() -> dict[str, dict | bytes | str]:
    cases: dict[str, dict | bytes | str] = {}
    for field in ("bandwidth_gb_per_s", "latency_s", "count", "generation"):
        link = 0 if field in ("count", "generation") else 1
        for value in BAD_NUMBERS:
            if field == "latency_s" and value in (0, 1e-300):
                continue  # a link of no latency is fine
            if field == "count" and value == 1e12:
                value = 10 ** 12  # the hang of ring packing was an integer count
            cases[f"link {field}={value!r}"] = _set(GOOD_SYSTEM, ("links", link, field), value)
    for field in ("index", "memory_bandwidth_bytes_per_s", "numa"):
        for value in (NAN, INF, -5, "zero", [0], 1e300):
            cases[f"gpu {field}={value!r}"] = _set(GOOD_SYSTEM, ("nodes", 1, field), value)
    for key in ("nodes", "links", "name", "defaults", "attrs", "title", "gpu_count"):
        for value in BAD_TYPES:
            if key == "gpu_count" and value in (None,):
                continue
            if key in ("name", "title") and isinstance(value, str):
                continue  # text is what these hold
            if key in ("nodes", "links", "defaults", "attrs", "title") and value in ([], {}, None) and key != "nodes":
                continue  # an empty list/mapping of these is fine
            cases[f"top {key}={value!r}"] = _set(GOOD_SYSTEM, (key,), value)
    for field in ("name", "kind"):
        for value in ([1], {"a": 1}, None, 3.5, "quantum"):
            cases[f"node {field}={value!r}"] = _set(GOOD_SYSTEM, ("nodes", 1, field), value)
            cases[f"link-end {field}={value!r}"] = _set(GOOD_SYSTEM, ("links", 0, "a" if field == "name" else "kind"), value)
    cases["link is a string"] = _set(GOOD_SYSTEM, ("links", 0), "gpu0-gpu1")
    cases["node is a list"] = _set(GOOD_SYSTEM, ("nodes", 0), ["cpu0", "cpu"])
    cases["no gpu"] = {"name": "cpus-only", "nodes": [{"name": "cpu0", "kind": "cpu"}, {"name": "cpu1", "kind": "cpu"}],
                       "links": [{"a": "cpu0", "b": "cpu1", "kind": "qpi", "bandwidth_gb_per_s": 20}]}
    cases["no nodes"] = {"name": "empty"}
    cases["missing link field"] = _set(GOOD_SYSTEM, ("links", 1), {"a": "gpu0", "kind": "pcie"})
    cases["pos not a pair"] = _set(GOOD_SYSTEM, ("nodes", 1, "pos"), [1, NAN])
    cases["non-utf8"] = b"name: \xff\xfe box\nnodes: []\n"
    cases["binary"] = bytes(range(256)) * 4
    cases["empty"] = b""
    cases["deep json"] = "[" * 100_000 + "]" * 100_000
    cases["deep yaml"] = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    cases["deep but parseable"] = {"name": "x", "attrs": json.loads("[" * 60 + "]" * 60)}
    cases["not yaml"] = "name: [unclosed\n"
    cases["yaml scalar"] = "just text\n"
    cases["yaml timestamp key"] = "2020-01-01: 3\nname: x\n"
    return cases


def _collective() -> dict:
    return json.loads((FIXTURES / "report" / "collective.json").read_text())


def result_cases() -> dict[str, dict | bytes | str]:
    good = _collective()
    cases: dict[str, dict | bytes | str] = {}
    for value in ("text", None, 5, [1], [None], ["row"], {"a": 1}):
        cases[f"rows={value!r}"] = _set(good, ("rows",), value)
    for key in ("meta", "machine", "software", "env"):
        for value in ([], "x", 5):
            cases[f"{key}={value!r}"] = _set(good, (key,), value)
    for value in ("nope", 5, None, ["sim"]):
        cases[f"kind={value!r}"] = _set(good, ("kind",), value)
    for field in ("busbw_bytes_per_s", "time_s", "size_bytes"):
        for value in ("fast", NAN, INF, -1.0, [1.0], {"v": 1}, True):
            cases[f"row {field}={value!r}"] = _set(good, ("rows", 0, field), value)
    cases["missing busbw"] = _set(good, ("rows", 0), {k: v for k, v in good["rows"][0].items() if k != "busbw_bytes_per_s"})
    cases["predicted=yes"] = _set(good, ("predicted",), "yes")
    cases["unknown field"] = _set(good, ("extra",), 1)
    cases["no schema"] = {k: v for k, v in good.items() if k != "schema"}
    cases["a list"] = [good]
    cases["non-utf8"] = b'{"schema": "meshscale-result/1", "kind": "\xff"}'
    cases["deep"] = '{"schema": "meshscale-result/1", "kind": "sim", "rows": ' + "[" * 50_000 + "]" * 50_000 + "}"
    cases["not json"] = "{rows: "
    cases["NaN token"] = json.dumps(_set(good, ("rows", 1, "busbw_bytes_per_s"), NAN))
    return cases


def _write(path: Path, content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif path.suffix == ".json":
        path.write_text(json.dumps(content))
    else:
        path.write_text(yaml.safe_dump(content))
    return path


SYSTEM_CASES = system_cases()
RESULT_CASES = result_cases()
# commands that read a system file, cheapest work first (the file must be refused before any of it)
SYSTEM_COMMANDS = [("topo", "-s", "{f}"), ("plan", "all_reduce", "-s", "{f}"), ("sim", "all_reduce", "-s", "{f}", "-e", "1M"),
                   ("cluster", "--node", "{f}", "--nodes", "4")]
RESULT_COMMANDS = {
    "report": ("report", "{f}", "--output", "{out}"),
    "compare-b": ("compare", str(FIXTURES / "report" / "collective.json"), "{f}"),
    "compare-a": ("compare", "{f}", str(FIXTURES / "report" / "collective.json")),
    "sim-bench": ("sim", "all_reduce", "-s", "hgx-h200", "--gpus", "2", "-e", "1M", "--bench", "{f}"),
    "sim-p2p": ("sim", "all_reduce", "-s", "hgx-h200", "--gpus", "2", "-e", "1M", "--p2p", "{f}"),
    "predict-from": ("predict", "--model", "resnet50", "--from", "{f}"),
}

# option tables: command words, option, bad values (text as typed)
NUMERIC_BAD = ["0", "-1", "nan", "inf", "-inf", "1e12", "100000000", "abc", ""]
OPTIONS = [
    (("bench", "collective"), "--iters", NUMERIC_BAD), (("bench", "collective"), "--warmup-iters", ["-1", "nan", "1e12"]),
    (("bench", "collective"), "--factor", ["1", "0", "-2", "nan"]), (("bench", "collective"), "--cpus", NUMERIC_BAD),
    (("bench", "collective"), "--timeout-s", ["0", "-1", "nan", "inf", "1e300"]),
    (("bench", "collective"), "--min-bytes", ["0", "-1", "1e", "nan", "99999999T"]),
    (("bench", "collective"), "--max-bytes", ["-5", "x", "99999999T"]), (("bench", "collective"), "--average", ["4", "-1"]),
    (("bench", "collective"), "--root", ["-1", "nan"]), (("bench", "collective"), "--check", ["-1"]),
    (("bench", "p2p"), "--iters", ["0", "-3", "nan"]), (("bench", "p2p"), "--latency-iters", ["0", "1e9"]),
    (("bench", "p2p"), "--size", ["0", "-1", "big"]), (("bench", "p2p"), "--cpus", ["0", "100000"]),
    (("bench", "p2p"), "--timeout-s", ["0", "nan", "-1"]),
    (("bench", "pairs"), "--size", ["0", "-1", "big"]), (("bench", "pairs"), "--cpus", ["0", "1", "100000"]),
    (("bench", "pairs"), "--iters", ["0", "-1"]), (("doctor",), "--level", ["0", "4", "x"]),
    (("train",), "--lr", ["nan", "inf", "-1", "0"]), (("train",), "--batch", ["0", "-1", "100000000"]),
    (("train",), "--steps", ["0", "-1", "1e20"]), (("train",), "--bucket-cap-mb", ["0", "-1", "nan", "inf"]),
    (("train",), "--fusion-mb", ["0", "-4", "nan"]), (("train",), "--lr-warmup-steps", ["-1"]),
    (("train",), "--timing-warmup", ["-1"]), (("train",), "--checkpoint-every", ["-1", "-100"]),
    (("train",), "--image-size", ["0", "-32", "100000"]), (("train",), "--timeout-s", ["0", "-1", "nan", "inf"]),
    (("train",), "--cpus", ["0", "-1", "100000"]), (("train",), "--ref-batch", ["0", "-1"]),
    (("train",), "--max-staleness", ["-1"]), (("train",), "--ps-servers", ["-1"]),
    (("train",), "--profile-batches", ["0,1", "16,16", "a,b", "-4"]),
    (("scale", "--weak", "--batch", "8"), "--cpus", ["0", "1,1", "2,2", "1,100000", "x"]),
    (("scale", "--weak", "--batch", "8"), "--gpus", ["0", "2,2", "-1"]),
    (("scale", "--weak"), "--batch", ["0", "-1", "100000000"]),
    (("scale", "--strong"), "--global-batch", ["0", "-5", "1e30"]),
    (("tour",), "--cpus", ["0", "-1", "100000", "nan"]), (("tour",), "--timeout-s", ["0", "-1", "nan"]),
    (("cluster",), "--radix", ["0", "1", "-36"]), (("cluster",), "--nodes", ["0", "-1", "1e12"]),
    (("cluster",), "--nics", ["0", "1000"]), (("cluster",), "--oversubscription", ["nan", "0", "0.5", "inf"]),
    (("cluster",), "--levels", ["0", "4"]), (("cluster",), "--nodes-per-leaf", ["0", "-1"]),
    (("predict",), "--gpus", ["2,2", "0", "-1", "1,,x", "100000000"]), (("predict",), "--nodes", ["0", "4,4"]),
    (("predict",), "--batch", ["0", "-1", "100000000"]), (("predict",), "--global-batch", ["0", "-1"]),
    (("predict",), "--dp", ["0", "-1", "x"]), (("predict",), "--seq-len", ["0", "-1"]),
    (("predict",), "--oversubscription", ["nan", "0", "inf"]), (("predict",), "--nics", ["0", "1000"]),
    (("plan", "all_reduce", "-s", "dgx1-v100"), "--devices", ["0,0", "-1", "0,99", "x"]),
    (("plan", "all_reduce", "-s", "dgx1-v100"), "--bytes", ["0", "-1", "1Q"]),
    (("plan", "all_reduce", "-s", "dgx1-v100"), "--gpus", ["0", "1", "99"]),
    (("sim", "all_reduce", "-s", "dgx1-v100"), "--factor", ["1", "0"]),
    (("sim", "all_reduce", "-s", "dgx1-v100"), "--min-bytes", ["0", "x"]),
    (("compare", str(FIXTURES / "report" / "collective.json"), str(FIXTURES / "report" / "collective.json")),
     "--threshold", ["-1", "100", "nan", "inf"]),
]
OPTION_CASES = [(words, option, value) for words, option, values in OPTIONS for value in values]

# commands and their output options: (command words, option, kind) where kind is file, plot or dir
OUTPUTS = [
    (("bench", "collective", "--cpus", "2"), "--json", "file"), (("bench", "p2p", "--cpus", "2"), "--json", "file"),
    (("bench", "p2p", "--cpus", "2"), "--plot", "plot"), (("bench", "pairs", "--cpus", "2"), "--json", "file"), (("plan", "all_reduce", "-s", "dgx1-v100"), "--json", "file"),
    (("plan", "all_reduce", "-s", "dgx1-v100"), "--svg", "plot"), (("plan", "all_reduce", "-s", "dgx1-v100"), "--schedule", "file"),
    (("sim", "all_reduce", "-s", "dgx1-v100"), "--json", "file"), (("topo", "-s", "dgx1-v100"), "--output", "file"),
    (("cluster",), "--json", "file"), (("cluster",), "--plot", "plot"), (("predict",), "--json", "file"),
    (("predict",), "--plot", "plot"), (("train",), "--json", "file"), (("scale", "--weak", "--batch", "8"), "--json", "file"),
    (("scale", "--weak", "--batch", "8"), "--plot", "plot"), (("doctor",), "--json", "file"), (("validate",), "--json", "file"),
    (("report", str(FIXTURES / "report" / "collective.json")), "--output", "dir"), (("tour",), "--output", "dir"),
]
BAD_PLACES = {"missing parent": "nope/deeper/{name}", "parent is a file": "afile/{name}", "proc": "/proc/meshscale-{name}",
              "sys": "/sys/meshscale-{name}"}
BAD_FILE_ONLY = {"a folder": ".", "bad suffix": "chart.txt"}
OUTPUT_CASES = ([(words, option, kind, place) for words, option, kind in OUTPUTS for place in BAD_PLACES
                  if not (kind == "dir" and place == "missing parent")]  # an output folder's parents are made
                + [(words, option, kind, place) for words, option, kind in OUTPUTS if kind != "dir" for place in BAD_FILE_ONLY
                   if place != "bad suffix" or kind == "plot"])


# ---- the checks ---------------------------------------------------------------------------------------------
@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """An empty working folder; ``sandbox.files()`` lists what is in it afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def assert_refused(result, before: set[str], folder: Path) -> None:
    """Exit 2, no traceback, one 'meshscale: error:' line (a value the parser cannot read too: no usage block),
    and the folder holds what it held before."""
    text = result.output
    assert result.exit_code == 2, f"exit {result.exit_code}: {text[-800:]} {result.exception!r}"
    assert "Traceback" not in text and not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(("meshscale: error:", "meshscale ")), lines  # or the launcher's
    assert _listing(folder) == before, f"stray files: {_listing(folder) - before}"


# every case runs through topo; the classes that once hung or crashed deeper also through plan, sim and cluster
DEEPER = ("link latency_s=nan", "link count=1000000000000", "link bandwidth_gb_per_s=inf", "link bandwidth_gb_per_s=1e-300",
          "no gpu", "top nodes=5", "non-utf8", "deep json", "link latency_s='fast'")
NEEDS_DEVICES = ("no gpu",)  # drawing or listing a system needs no GPU; running on it does
SYSTEM_RUNS = [(case, command) for case in sorted(SYSTEM_CASES) for command in SYSTEM_COMMANDS
               if (command[0] == "topo" or case in DEEPER) and not (command[0] == "topo" and case in NEEDS_DEVICES)]


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("case,command", SYSTEM_RUNS, ids=lambda x: x if isinstance(x, str) else x[0])
def test_malformed_system_files_are_refused(cli, sandbox, case, command):
    content = SYSTEM_CASES[case]
    suffix = ".json" if case.startswith("deep json") or isinstance(content, dict) and "json" in case else ".yaml"
    path = _write(sandbox.parent / f"system{suffix}", content)
    before = _listing(sandbox)
    args = [a.replace("{f}", str(path)) for a in command]
    assert_refused(cli(*args), before, sandbox)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("command", sorted(RESULT_COMMANDS))
@pytest.mark.parametrize("case", sorted(RESULT_CASES))
def test_malformed_result_files_are_refused(cli, sandbox, case, command):
    path = _write(sandbox.parent / "result.json", RESULT_CASES[case])
    before = _listing(sandbox)
    args = [a.replace("{f}", str(path)).replace("{out}", str(sandbox / "report")) for a in RESULT_COMMANDS[command]]
    assert_refused(cli(*args), before, sandbox)


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_negative_busbw_for_the_fit_is_refused(cli, sandbox):
    data = _collective()
    for row in data["rows"]:
        row["busbw_bytes_per_s"] = -abs(row["busbw_bytes_per_s"])
    path = _write(sandbox.parent / "negative.json", data)
    before = _listing(sandbox)
    assert_refused(cli("sim", "all_reduce", "-s", "hgx-h200", "--gpus", "2", "-e", "1M", "--bench", path), before, sandbox)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("words,option,value", OPTION_CASES, ids=lambda x: x if isinstance(x, str) else "-".join(x)[:24])
def test_out_of_range_options_are_refused(cli, sandbox, words, option, value):
    before = _listing(sandbox)
    assert_refused(cli(*words, option, value), before, sandbox)


@pytest.mark.timeout(CASE_TIMEOUT_S)
@pytest.mark.parametrize("words,option,kind,place", OUTPUT_CASES, ids=lambda x: x if isinstance(x, str) else "-".join(x)[:24])
def test_unwritable_outputs_are_refused_before_the_work(cli, sandbox, words, option, kind, place):
    (sandbox / "afile").write_text("a file, not a folder\n")
    name = {"file": "out.json", "plot": "out.png", "dir": "report"}[kind]
    target = {**BAD_PLACES, **BAD_FILE_ONLY}[place].format(name=name)
    before = _listing(sandbox)
    assert_refused(cli(*words, option, target), before, sandbox)


@pytest.mark.timeout(CASE_TIMEOUT_S)
def test_resume_with_steps_not_beyond_the_checkpoint_is_refused(cli, sandbox):
    checkpoints = sandbox / "ckpt"
    (checkpoints / "step-00000030").mkdir(parents=True)
    (checkpoints / "latest").write_text("30\n")
    before = _listing(sandbox)
    result = cli("train", "--checkpoint-dir", checkpoints, "--resume", "--steps", "10")
    assert_refused(result, before, sandbox)
    assert "step 30" in result.stderr


def test_the_suite_covers_a_few_hundred_cases():
    total = len(SYSTEM_CASES) + len(RESULT_CASES) * len(RESULT_COMMANDS) + len(OPTION_CASES) + len(OUTPUT_CASES)
    assert total >= 300, total
