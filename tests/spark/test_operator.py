"""The operator API end to end: windowed counts through run(), two jobs chained through
Kafka, and exactly-once output across crashes replayed from the Spark checkpoint."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from substreams.app import DIRECT, Application
from substreams.config import Config
from substreams.frontier import Time
from substreams.spark.operator import EpochNote, Row
from substreams.spark.runner import run, stop
from substreams.spark.sink import read_commits
from substreams.streams.listener import Listener
from tests.conftest import ConfigFactory
from tests.spark.conftest import running_acker, wait_for_epochs, window_clicks
from tests.spark.jobs import load_job, out_stream

pytestmark = pytest.mark.spark

WINDOWS = {"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}


def read_stream(config: Config, stream: str) -> list[dict[str, Any]]:
    with Listener(config, stream) as listener:
        return [
            dict(e.payload) for e in listener.entries(idle_timeout=0.7) if hasattr(e, "payload")
        ]


def expected_counts(windows: list[tuple[int, int]]) -> Counter[tuple[int, str]]:
    want: Counter[tuple[int, str]] = Counter()
    for window, n in windows:
        for c in window_clicks(window, n):
            want[(window, str(c["user"]))] += 1
    return want


def test_windowed_counts_chain_into_a_second_job(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [
            {"name": "clicks", "partitions": 2},
            out_stream("url_counts", "url_count.avsc", partitions=2),
            out_stream("top_urls", "top_url.avsc"),
        ],
        [WINDOWS, {"name": "uw", "stream": "url_counts", "kind": "epoch", "field": "window"}],
    )
    w, uw = config.substreams[0].name, config.substreams[1].name
    clicks, url_counts, top_urls = (s.name for s in config.streams)
    stage1, stage2 = load_job("pipeline_stage1"), load_job("pipeline_stage2")
    windows = [(0, 10), (1, 6), (2, 9)]
    # the real acker tracks both the clicks and stage 1's output (its sink is a source)
    with running_acker(config), Application(config).publisher(clicks, "src") as pub:
        for window, n in windows:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        # window 3 is open: neither stage may see it
        for c in window_clicks(3, 4):
            pub.publish(c, key=str(c["user"]))
        pub.flush()
        wait_for_epochs(config, w, 3, timeout=60)
        q1 = run(
            stage1.UrlCounts(),
            config.path,
            w,
            url_counts,
            checkpoint=tmp_path / "s1",
            spark=spark,
            query_name="stage1",
            block=False,
        )
        notes = wait_for_epochs(config, uw, 3, timeout=240)
        run(
            stage2.TopUrls(top=2),
            config.path,
            uw,
            top_urls,
            checkpoint=tmp_path / "s2",
            once=True,
            spark=spark,
            query_name="stage2",
        )
        stop(q1)
    assert [n.time for n in notes[:3]] == [0, 1, 2]
    counts = read_stream(config, url_counts)
    want: Counter[tuple[int, str]] = Counter()
    for window, n in windows:
        for c in window_clicks(window, n):
            want[(window, str(c["url"]))] += 1
    assert {(r["window"], r["url"]): r["clicks"] for r in counts} == dict(want)
    assert len(counts) == len(want)
    top = read_stream(config, top_urls)
    for window, _ in windows:
        ranked = sorted(((-n, u) for (win, u), n in want.items() if win == window))[:2]
        got = sorted((r["rank"], r["url"], r["clicks"]) for r in top if r["window"] == window)
        assert got == [(i + 1, u, -n) for i, (n, u) in enumerate(ranked)]
    assert {r["window"] for r in top} == {0, 1, 2}


class CrashingCounts:
    """WindowedCounts that crashes once, either before its results are committed (in
    on_epoch, on an executor) or after (in on_notification, on the driver, i.e. after the
    results were written and sealed but before Spark records the batch as done)."""

    def __init__(
        self,
        base: Any,
        crash_on_epoch: int | None,
        crash_after: int | None,
        crash_seal: int | None = None,
    ) -> None:
        self.base = base
        self.crash_on_epoch = crash_on_epoch
        self.crash_after = crash_after
        self.crash_seal = crash_seal
        self.seen: list[tuple[Time, bool]] = []

    def make(self) -> Any:
        seen, crash_on, crash_after = self.seen, self.crash_on_epoch, self.crash_after
        crash_seal = self.crash_seal

        class Op(self.base):  # type: ignore[misc, name-defined]
            def output_times(self, epoch: Time, output_substreams: Any) -> Any:
                # the driver, after every task committed and before the seal
                if epoch == crash_seal:
                    raise RuntimeError("crash between the tasks' commits and the seal")
                return super().output_times(epoch, output_substreams)

            def on_notification(self, note: EpochNote) -> None:
                seen.append((note.time, note.replayed))
                if note.time == crash_after:
                    raise RuntimeError("crash after commit")

            def __reduce__(self) -> Any:  # executors need the counting, not the driver's list
                return (_counts_op, (crash_on,))

        return Op(1000)


def _counts_op(crash_on: int | None) -> Any:
    base = load_job("windowed_counts").WindowedCounts

    class Op(base):  # type: ignore[misc, valid-type]
        def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
            if epoch == crash_on:
                raise RuntimeError("crash before commit")
            result: list[Row] = super().on_epoch(epoch, rows)
            return result

    return Op(1000)


def test_exactly_once_output_across_crashes(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}, out_stream("counts", "window_count.avsc")], [WINDOWS]
    )
    w = config.substreams[0].name
    clicks, counts = config.streams[0].name, config.streams[1].name
    job = load_job("windowed_counts")
    ck = tmp_path / "ck"
    published: list[tuple[int, int]] = []

    def attempt(
        crash_on: int | None = None, crash_after: int | None = None, crash_seal: int | None = None
    ) -> list[tuple[Time, bool]]:
        op = CrashingCounts(job.WindowedCounts, crash_on, crash_after, crash_seal)
        try:
            run(
                op.make(),
                config.path,
                w,
                counts,
                checkpoint=ck,
                once=True,
                spark=spark,
                query_name="counts",
            )
        except Exception as exc:  # the query fails with the operator's error
            assert "crash" in str(exc)
        return op.seen

    with Application(config, mechanisms=DIRECT).publisher(clicks, "src") as pub:

        def publish(window: int, n: int) -> None:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
            published.append((window, n))

        publish(0, 5)
        publish(1, 7)
        assert attempt() == [(0, False), (1, False)]  # batch 0
        publish(2, 4)
        publish(3, 6)
        # batch 1 written and sealed, then the driver's callback crashes
        assert attempt(crash_after=3) == [(2, False), (3, False)]
        publish(4, 8)
        # batch 1 is replayed: its units find their markers and write nothing, its seal
        # marker says sealed (notes flagged as replayed); batch 2 crashes on an executor
        assert attempt(crash_on=4) == [(2, True), (3, True)]
        assert attempt() == [(4, False)]  # batch 2 replayed, written once
        publish(5, 6)
        # batch 3: every task commits its results, then the driver dies before sealing
        assert attempt(crash_seal=5) == []
        # the replay's tasks find their markers (results not written again); then sealed
        assert attempt() == [(5, False)]
    rows = read_stream(config, counts)
    got = Counter((r["window"], r["key"]) for r in rows)
    assert all(n == 1 for n in got.values()), f"duplicated results: {got}"
    assert {(r["window"], r["key"]): r["count"] for r in rows} == dict(expected_counts(published))
    assert read_commits(config.kafka.bootstrap, config, counts) == {"spark.counts": 3}


def test_sessionize_emits_one_summary_per_closed_session(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [
            {"name": "clicks", "partitions": 1},
            out_stream("summaries", "session_summary.avsc", order_key="emitted_ms"),
        ],
        [{"name": "s", "stream": "clicks", "kind": "session", "key": "user", "gap_ms": 1000}],
    )
    s, clicks, summaries = config.substreams[0].name, config.streams[0].name, config.streams[1].name
    events = [
        ("a", 0, "/x"),
        ("b", 100, "/x"),
        ("a", 200, "/y"),
        ("a", 400, "/x"),
        ("b", 1200, "/z"),
        ("a", 1600, "/y"),
        ("b", 2500, "/x"),
    ]
    with Application(config, mechanisms=DIRECT).publisher(clicks, "src") as pub:
        for user, ts, url in events:
            pub.watermark(ts)
            pub.publish({"user": user, "url": url, "ts": ts})
        pub.flush()  # a@1600 and b@2500 stay open
        run(
            load_job("sessionize").Sessionize(),
            config.path,
            s,
            summaries,
            checkpoint=tmp_path / "ck",
            once=True,
            spark=spark,
            query_name="sessions",
        )
    rows = read_stream(config, summaries)
    got = [(r["user"], r["session_start"], r["session_end"], r["clicks"], r["pages"]) for r in rows]
    # one summary per closed session (written by the executors, so the output topic holds
    # them in the order their tasks committed); the open sessions a@1600 and b@2500 are not
    # summarised
    assert sorted(got) == [("a", 0, 400, 3, 2), ("b", 100, 100, 1, 1), ("b", 1200, 1200, 1, 1)]
