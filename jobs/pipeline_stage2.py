"""Pipeline stage 2: the top urls of each window, from stage 1's ``url_counts``.

It reads the ``url_counts_w`` substream: a window reaches it only once stage 1 has written
all of that window's counts and sealed it, so the ranking is never computed on a partial
window.
"""

from __future__ import annotations

from substreams.config import Config
from substreams.frontier import Time
from substreams.spark import EpochOperator, Row
from substreams.spark.jobcli import job_command, main


class TopUrls(EpochOperator):
    def __init__(self, top: int = 3) -> None:
        self.top = top

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        assert isinstance(epoch, int)
        best = sorted(rows, key=lambda r: (-int(r["clicks"]), str(r["url"])))[: self.top]
        return [
            {"window": epoch, "rank": i + 1, "url": r["url"], "clicks": r["clicks"]}
            for i, r in enumerate(best)
        ]


def make(config: Config, substream: str) -> TopUrls:
    return TopUrls()


command = job_command("pipeline_stage2", make, "url_counts_w", "top_urls")

if __name__ == "__main__":
    main(command)
