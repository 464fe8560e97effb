"""The report page in a real browser (Debian's headless chromium): it loads with no console errors, every plot
is present and laid out with a size, nothing is wider than the window at 1400 and at 800 px, every plot's legend
has at most six entries, and a screenshot per width lands in artifacts/. CI installs chromium; without it
these tests fail (they must not silently pass)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from meshscale.report.html import load_sources, write_report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "report"
ARTIFACTS = ROOT / "artifacts"
WIDTHS_PX = (1400, 800)  # a desktop window and a narrow one (half a screen, a tablet)
MAX_LEGEND_ENTRIES = 6
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]

# Injected into a copy of the page: collects script errors and measures every plot once the body is parsed,
# then writes both into the DOM, where --dump-dom can read them.
PROBE = """<script>window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e.type)), true);</script>"""
PROBE_END = """<script>(function () {
  const plots = Array.from(document.querySelectorAll('svg.plot, img.plot')).map(el => {
    const r = el.getBoundingClientRect();
    return {id: el.id, width: r.width, height: r.height};
  });
  const width = document.documentElement.clientWidth;
  const wide = Array.from(document.body.querySelectorAll('*')).filter(el => {
    for (let up = el.parentElement; up; up = up.parentElement) {  // inside a scrolling box is no overflow
      if (['auto', 'scroll'].includes(getComputedStyle(up).overflowX)) return false;
    }
    return el.getBoundingClientRect().right > width + 1;
  }).map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : ''));
  const pre = document.createElement('pre');
  pre.id = 'meshscale-probe';
  pre.textContent = JSON.stringify({errors: window.__errors, plots: plots, width: width,
                                    scroll_width: document.documentElement.scrollWidth, wide: wide.slice(0, 10)});
  document.body.appendChild(pre);
})();</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium is not installed: run `apt-get install -y chromium` (CI installs it); "
                    "the report's browser test cannot run without it")
    return path


def run_browser(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=90)


def check_page(index: Path, tmp_path: Path, screenshot_name: str) -> dict:
    """Open ``index`` in chromium; assert no console errors, no remote assets, every plot drawn with a size;
    save a screenshot under artifacts/. Returns the probe's findings."""
    html = index.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the page references a remote asset"
    expected_ids = re.findall(r'<(?:svg|img) id="([^"]+)" class="plot"', html)
    assert expected_ids, "the page has no plot"
    assert len(set(expected_ids)) == len(expected_ids), "plot ids repeat"

    legends = {i: int(n) for i, n in re.findall(r'<svg id="([^"]+)" class="plot" role="img" data-legend-entries="(\d+)"', html)}
    assert sorted(legends) == sorted(re.findall(r'<svg id="([^"]+)" class="plot" role="img"', html))
    long = {i: n for i, n in legends.items() if n > MAX_LEGEND_ENTRIES}
    assert not long, f"legends of more than {MAX_LEGEND_ENTRIES} entries: {long}"

    ARTIFACTS.mkdir(exist_ok=True)
    stem = Path(screenshot_name).stem
    for width in WIDTHS_PX:
        shot = ARTIFACTS / f"{stem}-{width}.png"
        shot.unlink(missing_ok=True)
        done = run_browser([f"--screenshot={shot}", f"--window-size={width},4000", index.as_uri()],
                           tmp_path / f"profile-shot-{width}")
        console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
        assert not console, f"console messages while loading the page: {console}"
        assert shot.exists() and shot.stat().st_size > 10_000, f"no screenshot written: {done.stderr[-2000:]}"

    probe_page = index.with_name("probe.html")
    probe_page.write_text(html.replace("<head>", "<head>" + PROBE, 1).replace("</body>", PROBE_END + "</body>", 1))
    try:
        for width in WIDTHS_PX:
            dumped = run_browser([f"--window-size={width},4000", "--dump-dom", probe_page.as_uri()],
                                 tmp_path / f"profile-probe-{width}")
            match = re.search(r'<pre id="meshscale-probe">(.*?)</pre>', dumped.stdout, re.S)
            assert match, f"the probe did not run: {dumped.stderr[-2000:]}"
            found = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&")
                               .replace("&lt;", "<").replace("&gt;", ">"))
            assert found["errors"] == [], f"script errors on the page: {found['errors']}"
            drawn = {p["id"]: p for p in found["plots"]}
            assert sorted(drawn) == sorted(expected_ids)
            empty = [i for i, p in drawn.items() if p["width"] < 50 or p["height"] < 50]
            assert not empty, f"plots laid out with no size at {width} px: {empty}"
            assert found["width"] <= width and found["scroll_width"] <= found["width"] and not found["wide"], \
                f"wider than the {width} px window: page {found['scroll_width']} px, elements {found['wide']}"
    finally:
        probe_page.unlink()
    return found


def test_fixture_report_renders_in_chromium(tmp_path):
    sources = load_sources([FIXTURES])
    index = write_report(sources, tmp_path / "report")
    found = check_page(index, tmp_path, "report-fixtures.png")
    ids = {p["id"] for p in found["plots"]}
    # one figure per kind of figure the fixtures hold
    assert any(i.startswith("plot-topology") for i in ids)
    assert sum(i.startswith("plot-p2p") for i in ids) == 3  # bandwidth of two modes, latency
    collectives = {r["collective"] for s in sources if s.result.kind == "bench-collective" for r in s.result.rows}
    assert {f"plot-busbw-{c.replace('_', '-')}" for c in collectives} <= ids
    assert {"plot-scaling-this-machine-weak", "plot-scaling-this-machine-strong"} <= ids


def test_broken_page_is_caught(tmp_path):
    """The check itself can fail: a page whose script throws is reported."""
    index = tmp_path / "index.html"
    index.write_text('<!DOCTYPE html><html><head></head><body><svg id="plot-x" class="plot" width="100" height="100">'
                     '</svg><script>undefinedFunction();</script></body></html>')
    with pytest.raises(AssertionError, match="console|script errors"):
        check_page(index, tmp_path, "report-broken.png")


def test_overflowing_page_and_long_legend_are_caught(tmp_path):
    """The width and legend checks can fail: a plot wider than the window, then a plot of seven legend entries."""
    index = tmp_path / "index.html"
    wide = '<svg id="plot-x" class="plot" role="img" data-legend-entries="2" width="{}" height="100"></svg>'
    index.write_text(f"<!DOCTYPE html><html><head></head><body>{wide.format(1000)}</body></html>")
    with pytest.raises(AssertionError, match="wider than the 800 px window"):
        check_page(index, tmp_path, "report-wide.png")
    index.write_text(f"<!DOCTYPE html><html><head></head><body>{wide.format(100).replace('2', '7', 1)}</body></html>")
    with pytest.raises(AssertionError, match="legends of more than 6 entries"):
        check_page(index, tmp_path, "report-legend.png")


def test_tour_report_renders_in_chromium(tmp_path):
    """The README's first command: a (fast) tour on this machine leaves a page that passes the browser check."""
    from meshscale.app.tour import TourSettings, run_tour
    from meshscale.results import load_result

    outcome = run_tour(tmp_path / "tour", TourSettings(fast=True))
    statuses = {s.name: s.status for s in outcome.stages}
    assert statuses["discover"] == "done" and "failed" not in statuses.values(), outcome.stages
    assert load_result(tmp_path / "tour" / "tour.json").kind == "tour"
    for s in outcome.stages:
        if s.status == "done" and s.name not in ("discover", "predict"):
            assert (tmp_path / "tour" / f"{s.name}.json").exists()
    found = check_page(outcome.index, tmp_path, "report.png")
    assert any(p["id"].startswith("plot-topology") for p in found["plots"])
    assert "<h2>Doctor: " in outcome.index.read_text()
    page = outcome.index.read_text()
    import torch
    if not torch.cuda.is_available():
        assert "No GPU on this machine" in page  # said plainly at the top
