"""`substreams bench report` rebuilds a results page's marked section from a run's JSON (the
table, the targets with met/missed, the redrawn plot) and leaves the rest of the page as is."""

from __future__ import annotations

import json
from pathlib import Path

from substreams_bench.report import build

RUN = {
    "name": "framing",
    "quick": False,
    "command": "substreams bench framing --out bench/runs",
    "broker": "none",
    "commit": "abc1234",
    "started_at": "2026-11-25T15:00:00Z",
    "duration_s": 10.9,
    "machine": {"cpus": 2, "loadavg_1m": 0.5},
    "rows": [{"path": "publisher: data envelope", "hand_us": 4.05, "converter_us": 17.6,
              "speedup": 4.35}],
    "columns": [
        {"key": "path", "header": "hot path", "fmt": "{}"},
        {"key": "speedup", "header": "speedup", "fmt": "{:.2f}x"},
    ],
    "targets": [
        {"name": "hand framing pays", "limit": ">= 1.5x", "value": "4.35x", "met": True},
        {"name": "made up", "limit": "<= 1", "value": "2", "met": False},
    ],
}  # fmt: skip


def test_report_replaces_the_marked_section_and_redraws_the_plot(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "framing.json").write_text(json.dumps(RUN))
    page = tmp_path / "README.md"
    page.write_text(
        "# Benchmarks\nprose stays\n<!-- bench report framing -->\nold table\n"
        "<!-- end bench report framing -->\nafter\n"
    )
    text, plots = build(runs, page)
    assert page.read_text() == text
    assert plots == [runs / "framing.png"] and plots[0].stat().st_size > 0
    assert "old table" not in text and text.startswith("# Benchmarks\nprose stays\n")
    assert text.endswith("<!-- end bench report framing -->\nafter\n")
    assert "on commit abc1234" in text
    assert "| publisher: data envelope | 4.35x |" in text
    assert "| hand framing pays | >= 1.5x | 4.35x | met |" in text
    assert "| made up | <= 1 | 2 | **missed** |" in text
    assert "![bench framing](runs/framing.png)" in text
