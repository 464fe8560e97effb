"""`bench collective` shows each size as it finishes, and Ctrl-C keeps the finished rows in the JSON."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s")
SCRIPT = "import sys; from meshscale.cli import main; sys.argv[0] = 'meshscale'; main()"


@pytest.mark.slow  # the command as a process of its own, stopped mid-sweep
def test_ctrl_c_after_two_sizes_keeps_them_in_the_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "bench", "collective", "all_reduce", "--cpus", "2",
                             "-b", "1K", "-e", "512M", "-f", "2", "-n", "20", "-w", "1", "--json", str(out)],
                            env=dict(os.environ),  # os.environ's, not the C environ readline fills with COLUMNS
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    printed = []
    try:
        for line in proc.stdout:  # rows arrive one by one while the sweep runs
            match = ROW.match(line)
            if match:
                printed.append(int(match.group(1)))
            if len(printed) == 2:
                break
        assert printed == [1024, 2048], printed
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group, as in a terminal
        rest, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2
    assert stderr.strip().splitlines()[-1].startswith("meshscale: error: interrupted (Ctrl-C)"), stderr
    assert "# Avg bus bandwidth" in rest and "# Out of bounds values : 0 OK" in rest, rest
    saved = json.loads(out.read_text())
    assert saved["meta"]["interrupted"] is True
    sizes = [row["size_bytes"] for row in saved["rows"]]
    assert sizes[:2] == printed and sizes == sorted(sizes), sizes
    assert all(row["wrong"] == 0 for row in saved["rows"])
