"""What a report page is made of: the results it reads (`Source`), and its sections, each plots with their
verdicts and a table. figures.py and the sections kept in their own modules (pairs_section.py) build them,
html.py renders them."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from meshscale.report.verdicts import Verdict
from meshscale.results import Result


@dataclass
class Source:
    """A result and the short name it goes by in legends (its file name, or meta.label)."""

    label: str
    result: Result


@dataclass
class Plot:
    id: str
    title: str
    svg: str
    verdict: Verdict
    caption: str = ""
    text: str = ""  # preformatted text shown beside the plot (the relation matrix)


@dataclass
class Section:
    title: str
    plots: list[Plot] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""  # under the table: what its figures mean, in one sentence


def slug(*parts: Any) -> str:
    return "plot-" + re.sub(r"[^a-z0-9]+", "-", "-".join(map(str, parts)).lower()).strip("-")
