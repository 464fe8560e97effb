"""Tables at 80 columns and into a pipe keep every figure whole: the run's figures appear intact in the text."""
import json
import re

import pytest

FIGURE = re.compile(r"-?\d[\d,]*(?:\.\d+)?%?")


def _figures(text: str) -> list[str]:
    return sorted(FIGURE.findall(text))


@pytest.fixture
def narrow(cli, monkeypatch):
    """`meshscale ARGS` at COLUMNS=80 with stdout captured (not a terminal)."""
    monkeypatch.setenv("COLUMNS", "80")
    return cli


def _sim_figures(row: dict) -> list[str]:
    return [str(row["size_bytes"]), f"{row['time_s'] * 1e6:.2f}", f"{row['busbw_bytes_per_s'] / 1e9:.2f}"]


def _predict_figures(row: dict) -> list[str]:
    return [f"{row['throughput_samples_per_s']:,.1f}", f"{row['speedup']:.2f}", f"{row['comm_s'] * 1e3:.1f}"]


# command -> the figures of each JSON row that its text must show whole on one line (None: the width alone)
AT_80 = [(("sim", "all_reduce", "-s", "dgx1-v100", "-b", "1K", "-e", "1G", "-f", "32"), _sim_figures),
         (("predict", "--model", "resnet50", "--gpus", "1,2,4,8"), _predict_figures),
         (("predict", "--model", "resnet50", "--gpus", "1,8", "--compare", "frameworks"), _predict_figures),
         (("systems",), None), (("plan", "all_reduce", "-s", "dgx1-v100"), None), (("validate",), None),
         (("cluster", "--nodes", "124"), None)]


@pytest.mark.parametrize("args, figures", AT_80)
def test_at_80_columns_no_line_is_wider_and_every_figure_is_whole(narrow, tmp_path, args, figures):
    out = tmp_path / "result.json"
    run = narrow(*args, *(("--json", out) if figures else ()))
    assert run.exit_code == 0, run.output
    wide = [line for line in run.stdout.splitlines() if len(line.encode()) > 80]
    assert not wide, wide
    assert "…" not in run.stdout
    lines = [FIGURE.findall(line) for line in run.stdout.splitlines()]
    for row in json.loads(out.read_text())["rows"] if figures else []:
        assert any(all(f in found for f in figures(row)) for found in lines), (figures(row), run.stdout)


def test_systems_at_80_columns_keeps_every_figure_and_names_what_it_left_out(narrow):
    from meshscale.topology import load_catalog
    from meshscale.topology.text import per_gpu_bandwidth
    run = narrow("systems")
    for topology in load_catalog():
        nvlink, pcie = per_gpu_bandwidth(topology)
        line = next(line for line in run.stdout.splitlines() if line.startswith(topology.name + " "))
        assert f"{nvlink / 1e9:.0f}" in line.split() and f"{pcie / 1e9:.1f}" in line.split(), line
    assert "left out at 80 columns: description" in run.stdout


def test_a_stated_width_that_fits_changes_nothing_but_the_frame(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    wide = cli("sim", "all_reduce", "-s", "dgx1-v100", "-e", "4K").stdout
    assert "float32" in wide and "in every row" not in wide and "left out" not in wide


def test_fit_table_drops_one_valued_columns_before_labels_and_never_a_figure():
    from rich.console import Console
    from rich.table import Table
    from meshscale.cli.output import fit_table
    table = Table()
    for name, justify in (("size", "right"), ("type", "right"), ("time us", "right"), ("note", "left")):
        table.add_column(name, justify=justify)
    for i in range(3):
        table.add_row(str(1024 << i), "float32", f"{12345.67 * (i + 1):.2f}", f"a long label of many words, number {i}")
    console = Console(width=200, file=open("/dev/null", "w"), force_terminal=True)
    for width in (200, 60, 40, 24, 5):
        fitted = fit_table(table, width, console)
        kept = [str(c.header).replace("\n", " ") for c in fitted.columns]
        assert {"size", "time us"} <= set(kept)  # figures stay, however narrow
        if "note" not in kept:  # a label goes only once the one-valued columns have gone
            assert "type" not in kept and "in every row: type float32" in str(fitted.caption)
    assert fit_table(table, 200, console) is table


def _shows(figure: str, value: float) -> bool:
    """``figure`` is ``value`` rounded to the decimals it shows (nccl-tests drops decimals as figures grow)."""
    decimals = len(figure.partition(".")[2])
    return abs(float(figure) - value) <= 0.5 * 10 ** -decimals + 1e-9


@pytest.mark.parametrize("args", [("all_reduce", "-b", "1K", "-e", "64K", "-f", "8"),
                                  ("all_reduce", "broadcast", "-b", "1K", "-e", "1K", "-d", "all", "-o", "all")])
def test_bench_lines_at_80_columns_hold_every_time_whole(narrow, tmp_path, args):
    out = tmp_path / "bench.json"
    result = narrow("bench", "collective", *args, "--cpus", "2", "-n", "2", "-w", "1", "--json", out)
    assert result.exit_code == 0, result.output
    assert not [line for line in result.stdout.splitlines() if len(line.encode()) > 80]
    lines = [line.split() for line in result.stdout.splitlines() if not line.startswith("#")]
    rows = json.loads(out.read_text())["rows"]
    for row in rows:  # the line of its size, in its series' block, shows its time
        assert any(words[0] == str(row["size_bytes"]) and any(_shows(w, row["time_s"] * 1e6) for w in words
                                                               if FIGURE.fullmatch(w)) for words in lines), row
    series = [line for line in result.stdout.splitlines() if line.startswith("# all_reduce: type")]
    assert len(series) == len({(r["dtype"], r["redop"]) for r in rows if r["collective"] == "all_reduce"})


def test_scale_samples_per_s_whole_at_80_columns(narrow, tmp_path):
    out = tmp_path / "scale.json"
    result = narrow("scale", "--cpus", "1", "--weak", "--batch", "8", "--model", "small-cnn", "--steps", "2", "--timing-warmup", "1",
                    "--json", out)
    assert result.exit_code == 0, result.output
    for row in json.loads(out.read_text())["rows"]:
        figure = f"{row['throughput_samples_per_s']:,.1f}"
        assert result.stdout.count(figure) >= 2, (figure, result.stdout)  # the streamed line and the table


def test_csv_beside_json_holds_the_same_rows(cli, tmp_path):
    import csv
    result = cli("sim", "all_reduce", "-s", "dgx1-v100", "-b", "1K", "-e", "1M", "-f", "32",
                 "--json", tmp_path / "sim.json", "--csv", tmp_path / "sim.csv")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "sim.json").read_text())["rows"]
    with open(tmp_path / "sim.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 3
    for row, line in zip(rows, table):
        assert int(line["size_bytes"]) == row["size_bytes"]
        assert float(line["time_s"]) == row["time_s"]
    assert f"wrote {tmp_path / 'sim.csv'}" in result.stdout


def test_save_csv_header_is_the_union_of_the_rows_keys(tmp_path):
    from meshscale.results import Result
    path = Result("scale", [{"a": 1, "times_s": [0.5, 0.25]}, {"a": 2, "b": None, "c": "x"}]).save_csv(tmp_path / "r.csv")
    assert path.read_text().splitlines() == ["a,times_s,b,c", '1,"[0.5, 0.25]",,', "2,,,x"]


@pytest.mark.parametrize("command", [("bench", "collective"), ("bench", "p2p"), ("sim",), ("scale",), ("predict",),
                                     ("validate",)])
def test_every_row_writing_command_offers_csv(cli, command):
    assert "--csv" in cli(*command, "--help").stdout


INTERNAL = re.compile(r"seed ?0\d\d|DOMAIN|\b[A-Z]+\.md\b|meshscale\.[a-z_]+\.[a-z_]+")


@pytest.mark.parametrize("args", [("systems",), ("cluster", "--nodes", "124"), ("predict", "--model", "resnet50"),
                                  ("topo", "--system", "pcie-4gpu")])
def test_sources_are_named_by_title_not_internal_labels(cli, args):
    out = cli(*args)
    assert out.exit_code == 0, out.output
    assert not INTERNAL.search(out.output), INTERNAL.search(out.output)


def _layout_cells(text: str) -> list[str]:
    """The layout column of a --search table, each row's folded lines joined: the text under "layout" up to
    "ckpt", for the lines from one ranked row (its "#") to the next."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if re.search(r"\blayout\b.*\bckpt\b", line))
    start, end = lines[header].index("layout"), lines[header].index("ckpt")
    cells: list[list[str]] = []
    for line in lines[header + 2:]:
        rank, layout = line[:start].strip(), line[start:end].strip()
        if not (rank.isdigit() or not rank and layout):
            break  # the lines under the table
        if rank:
            cells.append([])
        cells[-1].append(layout)
    return [" ".join(parts) for parts in cells]


@pytest.mark.slow  # a --search of every layout of 64 GPUs
@pytest.mark.parametrize("columns", ["80", "60"])
def test_a_narrow_search_table_keeps_every_rows_layout(cli, monkeypatch, tmp_path, columns):
    monkeypatch.setenv("COLUMNS", columns)
    out = tmp_path / "search.json"
    run = cli("predict", "--model", "llama3-70b", "--system", "hgx-h100", "--gpus", "64", "--search", "--top", "6",
              "--json", out)
    assert run.exit_code == 0, run.output
    rows = json.loads(out.read_text())["rows"][:6]
    assert _layout_cells(run.stdout) == [row["layout"] for row in rows], run.stdout
    assert "left out" in run.stdout and "layout" not in run.stdout.split("left out")[1].split("\n")[0]
    if columns == "80":  # what fits at 80 is printed within 80 (columns one space apart), its caption too
        lines = run.stdout.splitlines()
        table = lines[:next(i for i, line in enumerate(lines) if "left out at 80 columns" in line) + 1]
        assert max(len(line) for line in table) <= 80, run.stdout


def test_fit_table_folds_the_columns_named_as_identity_and_leaves_out_the_others():
    from rich.console import Console
    from rich.table import Table
    from meshscale.cli.output import fit_table
    table = Table()
    for name, justify in (("n", "right"), ("name", "left"), ("kind", "left"), ("time us", "right"), ("note", "left")):
        table.add_column(name, justify=justify)
    for i in range(3):
        table.add_row(str(i), f"a long name of many words {i}", f"kind {i} of many words", f"{1234.5 * i:.1f}",
                      f"a long note of many words, number {i}")
    console = Console(width=200, file=open("/dev/null", "w"), force_terminal=True)
    for width in (60, 40, 20):
        fitted = fit_table(table, width, console, identity=("name", "kind"))
        kept = [str(c.header).replace("\n", " ") for c in fitted.columns]
        assert {"n", "name", "kind", "time us"} <= set(kept) and "note" not in kept
    kept = [str(c.header) for c in fit_table(table, 20, console).columns]  # unnamed: only the first is kept
    assert "name" not in kept and "n" in kept


def test_fit_table_closes_the_gaps_and_breaks_headers_before_printing_wide():
    from rich.console import Console
    from rich.table import Table
    from meshscale.cli.output import fit_table
    table = Table()
    for name in ("layout", "batch/rank", "tokens/s/GPU", "step ms", "MFU"):
        table.add_column(name, justify="left" if name == "layout" else "right")
    table.add_row("tp2 fsdp8 pp2", "4", "1,021", "2,006.3", "44.7%")
    console = Console(width=200)
    for width, gaps in ((60, 3), (50, 1), (42, 1)):
        fitted = fit_table(table, width, console, identity=("layout",))
        text = Console(width=width, record=True, file=open("/dev/null", "w"))
        text.print(fitted)
        lines = text.export_text().splitlines()
        assert max(len(line.rstrip()) for line in lines) <= width, lines
        words = "\n".join(lines).split()
        assert {"tp2", "fsdp8", "pp2", "2,006.3", "1,021"} <= set(words)  # the identity (folded) and figures whole
        assert (fitted.padding[1] == 1) == (gaps == 3)  # one space apart only where three did not fit


def test_every_commands_summary_is_one_line_at_80_columns(cli, monkeypatch):
    """`meshscale -h` and `meshscale bench -h` list each command on one line of an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    for group, names in (([], ("topo", "train", "predict", "why-hung", "bench")), (["bench"], ("collective", "pairs"))):
        text = cli(*group, "-h").stdout
        panel = text.split("Commands")[1].splitlines()[1:]
        panel = panel[:next(i for i, line in enumerate(panel) if line.startswith("╰"))]
        assert all(len(line) <= 80 for line in text.splitlines())
        starts = [line[2:].split()[0] for line in panel]  # every line starts with a command's name
        assert set(names) <= set(starts) and all(not line[2:4].isspace() for line in panel), panel
