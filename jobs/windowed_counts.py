"""Tumbling event-time window counts per key, with a firm bound.

Each window is counted once, when it is complete: no watermark delay, no late record lost.
Input: a tumbling substream (default ``clicks_1s``); output: ``window_counts`` rows
``{window, window_start, key, count}``, sealed per window for downstream jobs.

    substreams submit -c jobs/substreams.jobs.yaml jobs/windowed_counts.py -- --once
"""

from __future__ import annotations

from collections import Counter

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.spark import EpochOperator, Row
from substreams.spark.jobcli import job_command, main


class WindowedCounts(EpochOperator):
    """Records per ``key`` in each window of a tumbling substream."""

    key_field = "key"

    def __init__(self, size_ms: int, key: str = "user") -> None:
        self.size_ms = size_ms
        self.key = key

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        assert isinstance(epoch, int), f"a tumbling window index, not {epoch!r}"
        counts = Counter(str(r[self.key]) for r in rows)
        return [
            {"window": epoch, "window_start": epoch * self.size_ms, "key": k, "count": n}
            for k, n in sorted(counts.items())
        ]


def make(config: Config, substream: str) -> WindowedCounts:
    sub = config.substream(substream)
    if sub.kind != "tumbling" or sub.size_ms is None:
        raise SubstreamsError(
            f"windowed_counts needs a tumbling substream, '{substream}' is {sub.kind}"
        )
    return WindowedCounts(sub.size_ms)


command = job_command("windowed_counts", make, "clicks_1s", "window_counts")

if __name__ == "__main__":
    main(command)
