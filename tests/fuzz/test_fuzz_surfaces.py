"""Generated hostile input for every reader of a file or a typed value, one generator per input kind: NCCL
topology XML, `nvidia-smi topo -m` text, model configs, layouts, Flight Recorder dumps, NCCL logs, Slurm names,
result files, bench io trees and token-file headers.

Each generator mutates a valid input at random (seeded, so a failure repeats) with what a hostile or broken
file holds: huge and negative numbers, numbers as text, text as booleans, other scripts' digits, control
characters, deep nesting, long repetition, truncation, links out of a folder, pipes, sparse files. The
property is the same for every reader: it returns a value of its type within its stated limits, or raises
`MeshscaleError` whose message is one line; nothing else is raised, and each case takes at most
`CASE_CPU_S` of CPU time. Where an independent reader exists (numpy for .npy headers, a grammar for Slurm
names, the product for layouts) what is accepted must agree with it.

The readers are called directly (a few cases end to end through the command line), so the whole file runs in
seconds."""
from __future__ import annotations

import copy
import json
import math
import os
import pickle
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest

from meshscale.errors import MeshscaleError

SEED = 44
CASE_CPU_S = 3.0            # CPU seconds one case may take: bad input is found before any work grows with it
HOSTILE_NUMBERS = [-1, 0, 10 ** 7, 10 ** 12, 2 ** 64, 10 ** 5001, 1.5, float("nan"), float("inf"), -1e308]
HOSTILE_TEXT = ["", " 2", "٢", "²", "1_0", "0x10", "true", "false", "\x1b[2J\x1b]0;title\x07", "a\nb", "<script>x</script>",
                "9" * 5001, "\x00", "NV²", "-0"]
HOSTILE_NUMBER_TEXT = ["-1", "0", "10000000", "1000000000000", str(2 ** 64), "9" * 5001, "1.5", "nan", "inf", "-1e308"]
HOSTILE_VALUES = HOSTILE_NUMBERS + HOSTILE_TEXT + [None, True, False, [], [False], {}, {"a": 1}, [[[[1]]]]]


def outcome(fn, *args):
    """``fn(*args)``: its value, or the MeshscaleError it raised (checked to be one line); within CASE_CPU_S."""
    start = time.process_time()
    try:
        return fn(*args)
    except MeshscaleError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message and len(message) < 4000, message[:500]
        return exc
    finally:
        assert time.process_time() - start < CASE_CPU_S, f"{fn.__name__} took too long"


def mutate(value, rng: random.Random, depth: int = 0):
    """``value`` with one node somewhere inside it replaced by a hostile value (or nested deeper, repeated)."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value, key=str))
        out = dict(value)
        out[key] = mutate(value[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        out = list(value)
        k = rng.randrange(len(out))
        out[k] = mutate(out[k], rng, depth + 1)
        return out
    roll = rng.random()
    if roll < 0.1:
        return [value] * rng.choice([2, 1000])
    if roll < 0.15:
        deep = value
        for _ in range(rng.choice([40, 200])):
            deep = [deep]
        return deep
    return copy.deepcopy(rng.choice(HOSTILE_VALUES))


# ---- NCCL topology XML and topo -m text ------------------------------------------------------------------
def _good_system():
    from meshscale.topology import load_system
    return load_system("hgx-h200")


def _foreign(text: str):
    from meshscale.topology.foreign import build, read_nccl_xml, read_topo_text
    sighting = read_nccl_xml(text, "fuzz.xml") if text.lstrip().startswith("<") else read_topo_text(text, "fuzz.txt")
    return build(sighting, "fuzz", "fuzz")


def xml_cases(rng: random.Random, n: int) -> list[str]:
    from meshscale.topology.foreign import to_nccl_xml
    good = to_nccl_xml(_good_system())
    attrs = re.findall(r'(\w+)="([^"]*)"', good)
    cases = []
    for _ in range(n):
        text = good
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.45 and attrs:
                key, value = rng.choice(attrs)
                hostile = rng.choice(HOSTILE_NUMBER_TEXT + HOSTILE_TEXT).replace('"', "'")
                text = text.replace(f'{key}="{value}"', f'{key}="{hostile}"', 1)
            elif roll < 0.6:  # an element repeated: a GPU or a link claimed many times
                m = rng.choice(list(re.finditer(r"<(gpu|nvlink|pci)[^>]*/?>", text)) or [None])
                if m:
                    text = text[:m.end()] + m.group(0) * rng.choice([2, 70, 2000]) + text[m.end():]
            elif roll < 0.7:
                text = text[:rng.randrange(len(text))]
            elif roll < 0.8:
                text = text.replace("<system", "<!DOCTYPE s [<!ENTITY e \"x\">]><system", 1)
            elif roll < 0.9:
                depth = rng.choice([70, 5000])
                text = text.replace("</system>", "<pci>" * depth + "</pci>" * depth + "</system>", 1)
            else:
                k = rng.randrange(len(text))
                text = text[:k] + rng.choice(["&e;", "\x1b", "\ufeff", "]]>", "<", "&#0;"]) + text[k:]
        cases.append(text)
    return cases


def topo_text_cases(rng: random.Random, n: int) -> list[str]:
    from meshscale.topology.foreign import to_topo_text
    good = to_topo_text(_good_system())
    cells = ["X", "NV18", "NV0", "NV-2", "NV99999", "NV²", "SYS", "PIX", "PXB", "PHB", "NODE", "??", "", "NV 2"]
    cases = []
    for _ in range(n):
        lines = good.splitlines()
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            k = rng.randrange(len(lines))
            if roll < 0.5:
                words = lines[k].split("\t") if "\t" in lines[k] else lines[k].split()
                if words:
                    words[rng.randrange(len(words))] = rng.choice(cells + HOSTILE_TEXT[:8])
                lines[k] = "\t".join(words)
            elif roll < 0.65:
                lines.insert(k, lines[k])
            elif roll < 0.8:
                del lines[k]
            else:
                lines[k] = lines[k] + "\tNV4" * rng.choice([1, 100])
        cases.append("\n".join(lines) + "\n")
    many = 1000  # a thousand GPUs claimed, each row full
    cases.append("\t" + "\t".join(f"GPU{i}" for i in range(many)) + "\n" + "".join(
        f"GPU{i}\t" + "\t".join("X" if i == j else "NV1" for j in range(many)) + "\n" for i in range(many)))
    return cases


@pytest.mark.timeout(60)
def test_topology_files_from_other_tools():
    from meshscale.topology.limits import MAX_MACHINE_GPUS
    from meshscale.topology.model import Topology
    rng = random.Random(SEED)
    cases = xml_cases(rng, 40) + topo_text_cases(rng, 40)
    for text in cases:
        got = outcome(_foreign, text)
        if isinstance(got, Topology):
            assert 0 < len(got.gpus()) <= MAX_MACHINE_GPUS
            assert all(link.a != link.b for link in got.links)
    from meshscale.topology.foreign import to_nccl_xml, to_topo_text
    assert all(isinstance(outcome(_foreign, f(_good_system())), Topology) for f in (to_nccl_xml, to_topo_text))


# ---- model configs and layouts -----------------------------------------------------------------------------
GOOD_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 8192, "tie_word_embeddings": False, "rope_theta": 500000.0}


@pytest.mark.timeout(60)
def test_model_configs(tmp_path):
    from meshscale.models.transformer import SHAPE_LIMITS, TransformerConfig, from_hf_config
    rng = random.Random(SEED)
    path = tmp_path / "config.json"
    accepted = 0
    for _ in range(300):
        config = mutate(GOOD_CONFIG, rng)
        if isinstance(config, dict) and rng.random() < 0.2:  # a huge but finite size on one axis
            config[rng.choice(list(GOOD_CONFIG)[1:8])] = rng.choice([10 ** 6, 2 ** 24, 2 ** 31, 10 ** 9])
        try:
            path.write_text(json.dumps(config))
        except ValueError:  # nesting json itself cannot write
            continue
        got = outcome(from_hf_config, path)
        if isinstance(got, TransformerConfig):
            accepted += 1
            assert all(getattr(got, f) <= most for f, (most, _) in SHAPE_LIMITS.items())
            assert isinstance(got.tie_embeddings, bool) and got.d_model % got.heads == 0
            assert got.tie_embeddings is bool(config.get("tie_word_embeddings", False))
    assert accepted > 10  # the mutations leave many configs whole: the reader is not refusing everything


@pytest.mark.timeout(60)
def test_a_config_at_every_limit_is_predicted_quickly(cli, tmp_path):
    from meshscale.models.transformer import SHAPE_LIMITS
    limits = {k: most for k, (most, _) in SHAPE_LIMITS.items()}
    config = {"model_type": "llama", "num_hidden_layers": limits["layers"], "hidden_size": limits["d_model"],
              "num_attention_heads": limits["heads"], "num_key_value_heads": limits["kv_heads"],
              "intermediate_size": limits["ffn_dim"], "vocab_size": limits["vocab_size"],
              "max_position_embeddings": limits["max_seq_len"]}
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(config))
    start = time.process_time()
    result = cli("predict", "--model", path, "-s", "hgx-h200", "--gpus", "8", "--pp", "8", "--micro-batches", "512",
                 "--batch", "512")
    assert result.exit_code == 0, result.output
    path.write_text(json.dumps({**config, "num_hidden_layers": limits["layers"] + 1}))
    result = cli("predict", "--model", path, "-s", "hgx-h200", "--gpus", "8")
    assert result.exit_code == 2 and "limit" in result.stderr and result.stderr.count("\n") == 1
    assert time.process_time() - start < 20


def layout_texts(rng: random.Random, n: int) -> list[str]:
    words = ["dp", "fsdp", "tp", "pp", "cp", "ep", "x", ",", "0", "1", "2", "8", "65536", "65537", "999999", "٢", " ",
             "xx", "\n", "-1"]
    return [("".join(rng.choice(words) for _ in range(rng.randint(0, 12))) if rng.random() < 0.8
             else ",".join(f"fsdp{rng.randint(1, 99)}" for _ in range(rng.choice([10, 65, 1000])))) for _ in range(n)]


def test_layouts():
    from meshscale.models.layout import MAX_LAYOUT_RANKS, check_degrees
    from meshscale.train.parallel.plan import MAX_LAYOUT_DEGREE, MAX_LAYOUTS, parse_layouts
    rng = random.Random(SEED)
    for text in layout_texts(rng, 400):
        got = outcome(parse_layouts, text)
        if isinstance(got, list):
            assert 0 < len(got) <= MAX_LAYOUTS
            keys = [tuple(sorted((k, v) for k, v in d.items() if v > 1)) for d in got]
            assert len(set(keys)) == len(keys)  # no layout twice
            assert all(1 <= v <= MAX_LAYOUT_DEGREE for d in got for v in d.values())
    for _ in range(300):
        degrees = {d: rng.choice([1, 2, 7, 1 << 10, 1 << 16, 1 << 20]) for d in ("dp", "fsdp", "tp", "pp", "cp")}
        got = outcome(check_degrees, degrees)
        assert (got == math.prod(degrees.values())) if isinstance(got, int) else \
            math.prod(degrees.values()) > MAX_LAYOUT_RANKS


# ---- Flight Recorder dumps and NCCL logs --------------------------------------------------------------------
GOOD_DUMP = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
             "entries": [{"process_group": ["0", "default_pg"], "collective_seq_id": k, "profiling_name":
                          "nccl:all_reduce", "input_sizes": [[8, 4]], "state": "completed", "is_p2p": False}
                         for k in range(1, 4)]}


def _evil_pickles() -> list[bytes]:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    return [pickle.dumps(Evil()), pickle.dumps({**GOOD_DUMP, "entries": [Evil()]}), b"cos\nsystem\n(S'x'\ntR.",
            b"\x80\x04" + b"(" * 100_000, b"\x80\x05\x95" + os.urandom(64)]


@pytest.mark.timeout(60)
def test_flight_recorder_dumps(tmp_path):
    from meshscale.report.fr_dump import Dump, read_dump
    rng = random.Random(SEED)
    blobs = _evil_pickles()
    for _ in range(150):
        dump = mutate(GOOD_DUMP, rng)
        try:
            blobs.append(json.dumps(dump).encode() if rng.random() < 0.5 else pickle.dumps(dump))
        except (ValueError, RecursionError, OverflowError):
            continue
    blobs += [b[:rng.randrange(1, len(b))] for b in blobs[:30]]  # truncated
    for k, blob in enumerate(blobs):
        path = tmp_path / f"trace_{k}"
        path.write_bytes(blob)
        got = outcome(read_dump, path)
        if isinstance(got, Dump):
            assert all(isinstance(e.seq, int) and isinstance(e.op, str) for e in got.entries)
    assert not (tmp_path / "pwned").exists()


def nccl_log_cases(rng: random.Random, n: int) -> list[str]:
    def line() -> str:
        roll = rng.random()
        rank, nranks = rng.choice([0, 1, 7, 2 ** 20, 2 ** 64]), rng.choice([1, 2, 8, 2 ** 20, 2 ** 20 + 1, 10 ** 12, 0])
        if roll < 0.5:
            return (f"h{rng.randint(0, 3)}:{rng.randint(1, 9)}:1 [0] NCCL INFO comm 0x{rng.randint(0, 5):x} rank {rank} "
                    f"nranks {nranks} cudaDev 0 busId 1000 - Init COMPLETE")
        if roll < 0.7:
            return f"h:1:1 [0] NCCL WARN {rng.choice(HOSTILE_TEXT)} " + "x" * rng.choice([0, 10, 100_000])
        if roll < 0.85:
            return "h:1:1 [0] NCCL INFO " * rng.choice([1, 1000])
        return rng.choice(HOSTILE_TEXT)
    return ["\n".join(line() for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.timeout(60)
def test_nccl_logs(tmp_path):
    from meshscale.report.fr_dump import MAX_RANKS
    from meshscale.report.why_hung import MAX_WARNINGS, NcclLog, read_nccl_logs
    rng = random.Random(SEED)
    for k, text in enumerate(nccl_log_cases(rng, 150)):
        path = tmp_path / f"job{k}.log"
        path.write_text(text, errors="surrogateescape")
        got = outcome(read_nccl_logs, [path])
        if isinstance(got, NcclLog):
            assert len(got.warnings) <= MAX_WARNINGS + 1
            for line in got.incomplete_init:
                assert int(re.search(r"of ([0-9]+) did", line).group(1)) <= MAX_RANKS and len(line) < 1000


# ---- Slurm names -----------------------------------------------------------------------------------------------
def slurm_names(rng: random.Random, n: int) -> list:
    alphabet = "aZ09._-" + " \t\n\r,[]=#\\\"'$`;:/*?" + "é٢\x00\x1b"
    return [rng.choice([5, None, ["x"]]) if rng.random() < 0.05 else
            "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 20, 64, 65, 300]))) for _ in range(n)]


def test_slurm_names():
    from meshscale.topology.slurm import (SlurmSwitch, SlurmTopology, check_name, parse_topology_conf,
                                          topology_conf)
    rng = random.Random(SEED)
    for name in slurm_names(rng, 500):
        got = outcome(check_name, name, "--slurm-nodes")
        if isinstance(got, str):  # an independent reading of Slurm's hostlist rules: no separator, no space
            assert re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]{0,63}", name), name
            conf = topology_conf(SlurmTopology("tree", (SlurmSwitch(name, nodes=(f"{name}0", f"{name}1")),)))
            assert [s.name for s in parse_topology_conf(conf).switches] == [name]  # no line of its own added


# ---- result files -------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_result_files(tmp_path):
    from meshscale.report.html import load_sources, render
    from meshscale.results import Result, load_result
    fixtures = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "report").glob("*.json"))
    rng = random.Random(SEED)
    accepted, written = [], 0
    for k in range(200):
        data = mutate(json.loads(rng.choice(fixtures).read_text()), rng)
        try:
            text = json.dumps(data)
        except (ValueError, RecursionError):
            continue
        path = tmp_path / f"r{k}.json"
        path.write_text(text)
        written += 1
        got = outcome(load_result, path)
        if isinstance(got, Result):
            accepted.append(path)
    assert accepted and written > len(accepted)
    # a title of markup beside refused files in a folder: escaped, one line per refused file
    folder = tmp_path / "mixed"
    folder.mkdir()
    data = json.loads(fixtures[0].read_text())
    data["meta"]["label"] = "--><script>alert(1)</script><!--"
    (folder / "evil.json").write_text(json.dumps(data))
    refused = [p for p in sorted(tmp_path.glob("r*.json")) if p not in accepted][:3]
    for p in refused:
        (folder / p.name).write_bytes(p.read_bytes())
    skipped: list[str] = []
    page = render(load_sources([folder], skipped))
    assert "<script" not in page and len(skipped) == len(refused) and all("\n" not in line for line in skipped)


# ---- bench io trees -------------------------------------------------------------------------------------------
PNG = None


def _png() -> bytes:
    global PNG
    if PNG is None:
        import io
        from PIL import Image
        out = io.BytesIO()
        Image.new("RGB", (4, 4)).save(out, "PNG")
        PNG = out.getvalue()
    return PNG


def _plant(root: Path, rng: random.Random) -> None:
    """One hostile thing somewhere in the data set at ``root``."""
    folders = [p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()] or [root]
    where = rng.choice(folders)
    name = f"e{rng.randrange(10 ** 6)}"
    roll = rng.random()
    if roll < 0.15:
        (where / name).symlink_to(rng.choice(["/", "/proc/self", "/dev", "/etc", str(root), "..", "nowhere"]))
    elif roll < 0.25:
        (where / f"{name}.jpg").symlink_to(rng.choice(["/etc/passwd", "/dev/zero", "/proc/self/mem", "../x.jpg"]))
    elif roll < 0.35:
        os.mkfifo(where / f"{name}.png")
    elif roll < 0.45:
        with open(where / f"{name}.jpg", "wb") as f:
            f.truncate(1 << 30)  # a sparse gigabyte
    elif roll < 0.55:
        deep = where
        for k in range(rng.choice([5, 40])):
            deep = deep / f"d{k}"
        deep.mkdir(parents=True)
        (deep / "x.png").write_bytes(_png())
    elif roll < 0.65:
        for k in range(rng.choice([10, 3000])):
            (root / f"{name}_{k}").mkdir()
    elif roll < 0.75:
        (where / f"{name}\nline.png").write_bytes(_png())
    else:
        (where / f"{name}.png").write_bytes(_png() if rng.random() < 0.7 else os.urandom(64))


@pytest.mark.timeout(90)
def test_bench_io_trees(tmp_path):
    from meshscale.execute.data_files import MAX_DATASET_DEPTH, SYSTEM_FOLDERS, ImageTree, walk_images
    rng = random.Random(SEED)
    for case in range(40):
        root = tmp_path / f"set{case}"
        for c in range(rng.randint(0, 3)):
            (root / f"class{c}").mkdir(parents=True)
            (root / f"class{c}" / "a.png").write_bytes(_png())
        root.mkdir(exist_ok=True)
        for _ in range(rng.randint(1, 3)):
            _plant(root, rng)
        got = outcome(walk_images, root, 5.0)
        if isinstance(got, ImageTree):
            real = os.path.realpath(root)
            for path, _, size in got.files:
                assert os.path.realpath(path).startswith(real + os.sep) and os.path.isfile(path)
                assert not path.startswith(SYSTEM_FOLDERS) and path.count(os.sep) - real.count(os.sep) <= \
                    MAX_DATASET_DEPTH + 2
    for hostile in ("", "/", "/proc", "/dev/zero", "/sys/kernel"):
        assert isinstance(outcome(walk_images, hostile), MeshscaleError)


def _npy_bytes(rng: random.Random) -> tuple[bytes, np.ndarray]:
    import io
    dtype = np.dtype(rng.choice(["<i1", "<u1", "<i2", ">u2", "<i4", "<u4", "<i8", ">i8", "<f4", "|b1"]))
    array = np.arange(rng.randint(0, 50)).astype(dtype)
    out = io.BytesIO()
    np.lib.format.write_array(out, array if rng.random() < 0.9 else array.reshape(-1, 1),
                              version=rng.choice([(1, 0), (2, 0), (3, 0)]))
    return out.getvalue(), array


@pytest.mark.timeout(60)
def test_token_file_headers_agree_with_numpy(tmp_path):
    from meshscale.execute.data_files import TokenLayout, token_layout
    from meshscale.execute.datasets import _token_ids
    rng = random.Random(SEED)
    path = tmp_path / "tokens.npy"
    for _ in range(150):
        data, _ = _npy_bytes(rng)
        if rng.random() < 0.6:  # a byte or a run of the header changed
            k = rng.randrange(min(len(data), 140))
            data = data[:k] + rng.choice([b"\x00", b"{", b"'", b"(((", b"9" * 30, b"True", b"\xff", b""]) + data[k + 1:]
        path.write_bytes(data)
        got = outcome(token_layout, path)
        if isinstance(got, TokenLayout):  # numpy must read the same ids
            expected = np.load(path, allow_pickle=False)
            ours = _token_ids(path)
            assert expected.ndim == 1 and expected.dtype.kind in "iu" and np.array_equal(ours, expected)
