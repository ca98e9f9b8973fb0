"""Pipeline stage 1: clicks per url and window, written to ``url_counts``.

Each window's counts are sealed on ``url_counts`` (substream ``url_counts_w``, epoch = window
index), so stage 2 receives the window exactly when stage 1 has finished it: two Spark jobs
chained through Kafka with a firm bound end to end.
"""

from __future__ import annotations

from collections import Counter

from substreams.config import Config
from substreams.frontier import Time
from substreams.spark import EpochOperator, Row
from substreams.spark.jobcli import job_command, main


class UrlCounts(EpochOperator):
    key_field = "url"

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        assert isinstance(epoch, int)
        counts = Counter(str(r["url"]) for r in rows)
        return [{"window": epoch, "url": u, "clicks": n} for u, n in sorted(counts.items())]


def make(config: Config, substream: str) -> UrlCounts:
    return UrlCounts()


command = job_command("pipeline_stage1", make, "clicks_1s", "url_counts")

if __name__ == "__main__":
    main(command)
