"""`meshscale report`: one static index.html from result files. No server, no internet: plots are inline SVG,
the CSS is inline, and there is no script, so the page opens the same from a laptop, a share or an e-mail."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from meshscale.errors import MeshscaleError, one_line
from meshscale.report.figures import sections
from meshscale.report.parts import Source
from meshscale.report.verdicts import is_cpu_run
from meshscale.results import Result, load_result
from meshscale.safe_io import atomic_write, check_path_length

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
.banner { background: #fff4d6; border-left: 4px solid #e0a000; padding: .6em 1em; }
.notes li { margin: .2em 0; }
.plots { display: flex; flex-wrap: wrap; gap: 1em 2em; }
figure { margin: 1em 0; flex: 1 1 520px; min-width: 0; } figcaption { color: #555; font-size: 12px; }
svg.plot { max-width: 100%; height: auto; }
.verdict { padding: .3em .8em; border-left: 4px solid; margin: .4em 0; }
.good { border-color: #2a9d2a; background: #eef9ee; } .warn { border-color: #e0a000; background: #fff8e6; }
.bad { border-color: #d03030; background: #fdeeee; } .info { border-color: #5080c0; background: #eef3fb; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 11px; }
table { border-collapse: collapse; font-size: 12px; display: block; max-width: 100%; overflow-x: auto; }
h1, h2, h3, p, li, figcaption { overflow-wrap: anywhere; }
@media (max-width: 900px) { body { padding: .5em 1em; } figure { flex-basis: 100%; } } td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; }
</style></head>
<body>
<h1>{{ title }}</h1>
<p>{{ subtitle }}</p>
{% if banner %}<p class="banner" id="banner">{{ banner }}</p>{% endif %}
{% if notes %}<ul class="notes" id="notes">{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% for section in sections %}
<section><h2>{{ section.title }}</h2>
<div class="plots">
{% for p in section.plots %}
<figure id="fig-{{ p.id }}">
<h3>{{ p.title }}</h3>
{{ p.svg | safe }}
<p class="verdict {{ p.verdict.level }}">{{ p.verdict.text }}</p>
{% if p.caption %}<figcaption>{{ p.caption }}</figcaption>{% endif %}
{% if p.text %}<details><summary>relation matrix (text)</summary><pre>{{ p.text }}</pre></details>{% endif %}
</figure>
{% endfor %}
</div>
{% if section.table %}<table><tr>{% for k in section.table[0] %}<th>{{ k }}</th>{% endfor %}</tr>
{% for row in section.table %}<tr>{% for v in row.values() %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</table>{% endif %}
{% if section.note %}<p class="note">{{ section.note }}</p>{% endif %}
</section>
{% endfor %}
<h2>Sources</h2>
<table><tr><th>file</th><th>kind</th><th>rows</th><th>created</th><th>host</th><th>software</th><th>NCCL/Gloo knobs</th></tr>
{% for s in sources %}<tr><td>{{ s.label }}</td><td>{{ s.result.kind }}{% if s.result.predicted %} (predicted){% endif %}</td>
<td>{{ s.result.rows | length }}</td><td>{{ s.result.created }}</td><td>{{ s.result.machine.get('hostname', '') }}</td>
<td>{{ software(s.result) }}</td><td>{{ knobs(s.result) }}</td></tr>{% endfor %}
</table>
</body></html>
"""


# A report draws from hundreds of result files of kilobytes each; these bound what a folder can make it read.
MAX_REPORT_FILES = 10_000
MAX_REPORT_BYTES = 256 << 20


def load_sources(paths: list[str | Path], skipped: list[str] | None = None) -> list[Source]:
    """Result files (or directories of them) as labelled sources; a directory contributes every *.json in it
    that is a meshscale result, and each other one is named in ``skipped`` (one line each: the file and why).
    At most `MAX_REPORT_FILES` files and `MAX_REPORT_BYTES` in all, checked before reading."""
    sources, budget = [], _Budget()
    for path in map(Path, paths):
        check_path_length(path, str(path)[:200])
        if path.is_dir():
            found, refused = [], []
            for file in sorted(path.glob("*.json")):
                budget.take(file)
                try:
                    result = load_result(file)
                except MeshscaleError as exc:  # a directory may hold other JSON files
                    refused.append(f"skipped {one_line(str(exc))}")
                    continue
                found.append(Source(_label(file, result), result))
            if not found:
                first = f" ({refused[0].removeprefix('skipped ')})" if refused else ""
                raise MeshscaleError(f"{path}: no meshscale result files (*.json) in this directory; "
                                     f"{len(refused)} refused{first}")
            sources += found
            if skipped is not None:
                skipped += refused
        else:
            budget.take(path)
            result = load_result(path)
            sources.append(Source(_label(path, result), result))
    if not sources:
        raise MeshscaleError("no result files given; pass the JSON files that meshscale commands wrote")
    return sources


class _Budget:
    """Files and bytes a report has read so far, refused past the limits."""

    def __init__(self) -> None:
        self.files = self.total_bytes = 0

    def take(self, path: Path) -> None:
        self.files += 1
        try:
            self.total_bytes += path.stat().st_size if path.is_file() else 0
        except OSError:
            pass  # the reader says why in its own line
        if self.files > MAX_REPORT_FILES or self.total_bytes > MAX_REPORT_BYTES:
            raise MeshscaleError(f"{one_line(str(path))}: a report reads at most {MAX_REPORT_FILES:,} result files "
                                 f"and {MAX_REPORT_BYTES >> 20} MiB in all; give fewer results")


def _label(path: Path, result: Result) -> str:
    return str(result.meta.get("label") or path.stem)


def _software(result: Result) -> str:
    return ", ".join(f"{k} {v}" for k, v in result.software.items() if v and k != "python")


def _knobs(result: Result) -> str:
    return " ".join(f"{k}={v}" for k, v in result.env.items()) or "-"


def render(sources: list[Source], title: str = "meshscale report", notes: list[str] | None = None) -> str:
    """The report page as one HTML string."""
    secs = sections(sources)
    measured = [s.result for s in sources if not s.result.predicted and s.result.kind not in ("sim", "predict")]
    machine: dict[str, Any] = next((r.machine for r in measured if r.machine), {})
    gpus = machine.get("gpus") or []
    subtitle = (f"{machine.get('hostname', 'unknown host')}: " + (f"{len(gpus)} GPUs ({', '.join(sorted(set(gpus)))})"
                if gpus else f"{machine.get('cpu_count', '?')} CPU cores, no GPU")) if machine else "predictions only"
    banner = ""
    if any(is_cpu_run(r.meta, r.machine) for r in measured) and not gpus:
        banner = ("No GPU on this machine: the ranks are CPU worker processes over Gloo and shared memory. "
                  "These figures describe this CPU host, not a GPU interconnect; the reference systems show what GPUs would do.")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(TEMPLATE).render(title=title, subtitle=subtitle, banner=banner, notes=notes or [],
                                            sections=secs, sources=sources, software=_software, knobs=_knobs)


def write_report(sources: list[Source], out_dir: str | Path, title: str = "meshscale report",
                 notes: list[str] | None = None) -> Path:
    """Write ``out_dir/index.html`` and return its path."""
    out = Path(out_dir)
    html = render(sources, title, notes)  # first: a page that cannot be rendered leaves no folder behind
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MeshscaleError(f"{out}: cannot create the report directory ({exc.strerror}); choose another --output") from None
    try:
        return atomic_write(out / "index.html", html)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
