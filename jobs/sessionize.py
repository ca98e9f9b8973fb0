"""Sessions per user with an inactivity gap: one summary per closed session.

The ``sessions`` substream makes each session its own substream: the acker cuts a user's
clicks from every source into sessions, announced as (user, start) with their last time; the
operator is called once per session, after its last click, with all of its clicks.

    substreams submit -c jobs/substreams.jobs.yaml jobs/sessionize.py
"""

from __future__ import annotations

import time

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.spark import EpochOperator, Row
from substreams.spark.jobcli import job_command, main


class Sessionize(EpochOperator):
    key_field = "user"

    def __init__(self) -> None:
        self.last_emitted = 0

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        assert isinstance(epoch, Keyed) and isinstance(epoch.time, int), f"a session, not {epoch!r}"
        if not rows:
            return []
        # the order key must not go backwards, even if the wall clock does (per task: each
        # executor task has its own copy of the operator and its own output writer)
        self.last_emitted = max(self.last_emitted, int(time.time() * 1000))
        stamps = [int(r["ts"]) for r in rows]
        return [
            {
                "user": epoch.key,
                "session_start": epoch.time,
                "session_end": max(stamps),
                "clicks": len(rows),
                "pages": len({r["url"] for r in rows}),
                "emitted_ms": self.last_emitted,
            }
        ]

    def output_times(self, epoch: Time, output_substreams: object) -> dict[str, Time]:
        return {}  # session summaries are not cut into substreams downstream


def make(config: Config, substream: str) -> Sessionize:
    if config.substream(substream).kind != "session":
        raise SubstreamsError(f"sessionize needs a session substream, '{substream}' is not one")
    return Sessionize()


command = job_command("sessionize", make, "sessions", "session_summaries")

if __name__ == "__main__":
    main(command)
