"""``substreams bench report``: the results page's tables and plots, made from the runs' JSON.

Why generated: numbers copied into a page by hand drift from the run they claim to come
from; each run's ``<name>.json`` is the record, so the page's tables and the plots are
rebuilt from it.  A section of bench/README.md between ``<!-- bench report NAME -->`` and
``<!-- end bench report NAME -->`` is replaced by NAME's tables; the rest of the page (what
a benchmark measures and why, the profiles) is prose and stays as written.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

from substreams_bench.harness import BenchResult, Column


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(doc: dict[str, Any], plot: str | None = None) -> str:
    """One run's tables (configurations, then targets with met/missed) as Markdown."""
    result = BenchResult.from_json(doc)
    machine = doc.get("machine", {})
    lines = [
        f"Run: `{result.command}`"
        + (f" on commit {doc['commit']}" if doc.get("commit") else "")
        + f", {doc.get('started_at', '?')}, {result.duration_s:.0f} s, "
        f"{result.broker}; {machine.get('cpus', '?')} CPUs, load {machine.get('loadavg_1m', '?')}"
        + (" (quick)" if result.quick else "")
        + ".",
        "",
    ]
    columns = result.columns or [Column(k, k) for k in (result.rows[0] if result.rows else {})]
    lines += _table(
        [c.header for c in columns],
        [[_cell(row.get(c.key), c.fmt) for c in columns] for row in result.rows],
    )
    if result.targets:
        met = {True: "met", False: "**missed**", None: "n/a"}
        lines += ["", *_table(
            ["target", "limit", "measured", "met"],
            [[t.name, t.limit, t.value, met[t.met]] for t in result.targets],
        )]  # fmt: skip
    if plot:
        lines += ["", f"![bench {result.name}]({plot})"]
    return "\n".join(lines)


def build(results: Path, page: Path | None) -> tuple[str, list[Path]]:
    """Markdown for every ``results/*.json`` (and its plot, redrawn); with ``page``, that page
    with its marked sections replaced (written back).  Returns the text and the plots."""
    sections: dict[str, str] = {}
    plots: list[Path] = []
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        name = doc["name"]
        png = path.with_suffix(".png")
        module = importlib.import_module(f"substreams_bench.{name}")
        import matplotlib

        matplotlib.use("Agg")
        module.plot(BenchResult.from_json(doc), png)
        plots.append(png)
        inside = page is not None and png.resolve().is_relative_to(page.parent.resolve())
        link = png.resolve().relative_to(page.parent.resolve()) if page and inside else png
        sections[name] = markdown(doc, str(link))
    if page is None:
        return "\n\n".join(f"## bench {n}\n\n{text}" for n, text in sections.items()), plots
    text = page.read_text()
    for name, body in sections.items():
        start, end = f"<!-- bench report {name} -->", f"<!-- end bench report {name} -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _m: f"{start}\n{body}\n{end}", text)  # noqa: B023
    page.write_text(text)
    return text, plots
