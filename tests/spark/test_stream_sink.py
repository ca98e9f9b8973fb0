"""The streaming sink ``df.writeStream.format("substreams")``: a firm read, an ordinary
Spark aggregation, and the sink chain into an output stream whose acker substream announces
each window once with exactly its records; a query stopped mid-stream and restarted from its
checkpoint writes every result exactly once; bad options fail naming the option."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from substreams.app import Application
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.spark.options import CONFIG_PICKLE, ship_config
from substreams.spark.stream_write import SinkOptions
from substreams.streams.publisher import Publisher
from tests.applied import acks_applied
from tests.conftest import ConfigFactory
from tests.spark.conftest import (
    output_epochs,
    output_rows,
    running_acker,
    wait_for_epochs,
    window_clicks,
)
from tests.spark.jobs import out_stream
from tests.spark.sink_job import per_url

pytestmark = pytest.mark.spark

WINDOWS = {"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}


def make(make_config: ConfigFactory) -> Config:
    return make_config(
        [{"name": "clicks", "partitions": 2},
         out_stream("url_counts", "url_count.avsc", partitions=2)],
        [WINDOWS, {"name": "uw", "stream": "url_counts", "kind": "epoch", "field": "window"}],
        # a stopped query is restarted within this: its seals are waited for, not evicted
        acker={"source_timeout_ms": 600_000},
    )


def publish(pub: Publisher, config: Config, windows: list[tuple[int, int]],
            one_by_one: bool = False) -> Counter[tuple[int, str]]:
    """Clicks of each window, then its seal; window 99 stays open (nobody may see it: the
    caller keeps ``pub`` open, as closing it would let the acker end its times).
    ``one_by_one``: wait for each window's EpochComplete before the next, so that each has
    its own control record (a batch never splits one)."""
    want: Counter[tuple[int, str]] = Counter()
    w = config.substreams[0].name
    for k, (window, n) in enumerate(windows):
        for c in window_clicks(window, n):
            pub.publish(c, key=str(c["user"]))
            want[(window, str(c["url"]))] += 1
        pub.seal(w, window)
        if one_by_one:
            pub.flush()
            wait_for_epochs(config, w, k + 1, timeout=60)
    for c in window_clicks(99, 3):
        pub.publish(c, key=str(c["user"]))
    pub.flush()
    return want


def clicks_per_url(spark: SparkSession, config: Config, **read: str) -> DataFrame:
    return per_url(spark, config, config.substreams[0].name, **read)


def start(df: DataFrame, config: Config, ck: Path, **trigger: Any) -> StreamingQuery:
    return (
        df.writeStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config))
        .option("stream", config.streams[1].name)
        .option("queryName", "url-counts")
        .option("keyField", "url")
        .option("checkpointLocation", str(ck))
        .trigger(**trigger)
        .start()
    )


def check_output(config: Config, want: Counter[tuple[int, str]], windows: list[int]) -> None:
    """Every result exactly once with its count; every window announced once, in order,
    with exactly its results (a window without clicks: sealed with none)."""
    uw, url_counts = config.substreams[1].name, config.streams[1].name
    notes = wait_for_epochs(config, uw, len(windows), timeout=120)
    rows = output_rows(config, url_counts)
    seen = Counter((int(r["window"]), str(r["url"])) for r in rows)
    dup = {k: n for k, n in seen.items() if n > 1}
    assert not dup, f"results written more than once: {dup}"
    assert {(int(r["window"]), str(r["url"])): int(r["clicks"]) for r in rows} == dict(want)
    assert [n.time for n in notes] == windows
    per_window = Counter(win for win, _ in want)
    assert [n.records for n in notes] == [per_window[i] for i in windows]


def test_sink_chains_a_read_and_an_aggregation_into_an_announced_output(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make(make_config)
    windows = [(0, 10), (1, 6), (2, 0), (3, 9)]  # window 2 sealed without clicks
    clicks = config.streams[0].name
    with running_acker(config), Application(config).publisher(clicks, "src") as pub:
        want = publish(pub, config, windows)
        wait_for_epochs(config, config.substreams[0].name, len(windows), timeout=60)
        query = start(clicks_per_url(spark, config), config, tmp_path / "ck", availableNow=True)
        assert query.awaitTermination(300)
        assert query.exception() is None
        check_output(config, want, [w for w, _ in windows])
        # nothing more: the open window 99 was not announced (the sink's acks all applied)
        acks_applied(config)
        assert len(output_epochs(config, config.substreams[1].name)) == len(windows)


def test_restart_from_the_checkpoint_after_a_stop_mid_stream_writes_once(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make(make_config)
    windows = [(w, 3 + w % 4) for w in range(6)]
    uw = config.substreams[1].name
    ck = tmp_path / "ck"
    clicks = config.streams[0].name
    with running_acker(config), Application(config).publisher(clicks, "src") as pub:
        want = publish(pub, config, windows, one_by_one=True)
        # one window per batch, stopped once two windows are out: the rest is replayed
        # (or first written) by the restarted query
        first = start(clicks_per_url(spark, config, maxEpochsPerTrigger="1"), config, ck,
                      processingTime="200 milliseconds")
        wait_for_epochs(config, uw, 2, timeout=300)
        first.stop()
        done = len(output_epochs(config, uw))
        assert done < len(windows), "the first query wrote everything: nothing was restarted"
        again = start(clicks_per_url(spark, config, maxEpochsPerTrigger="1"), config, ck,
                      availableNow=True)
        assert again.awaitTermination(300)
        assert again.exception() is None
        check_output(config, want, [w for w, _ in windows])


SCHEMA = StructType([
    StructField("control_offset", LongType()),
    StructField("control_index", LongType()),
    StructField("epoch", StringType()),
    StructField("window", LongType()),
    StructField("url", StringType()),
    StructField("clicks", LongType()),
])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stream": None}, "option 'stream' (the output stream) is required"),
        ({"stream": "nope"}, "option 'stream' names no stream of the config: 'nope'"),
        ({"queryName": None}, "option 'queryName' (or 'name') is required"),
        ({"queryName": "a b"}, "option 'queryName' must be letters"),
        ({"keyField": "user"}, "option 'keyField' names no column of the DataFrame: 'user'"),
        ({CONFIG_PICKLE: None}, "substreams sink: option 'config' (path of substreams.yaml)"),
        ({CONFIG_PICKLE: "xx"}, "substreams sink: option 'configPickle' is not a shipped"),
    ],
)
def test_bad_options_name_the_option(
    make_config: ConfigFactory, change: dict[str, str | None], message: str
) -> None:
    config = make(make_config)
    good = {CONFIG_PICKLE: ship_config(config), "stream": config.streams[1].name,
            "queryName": "q"}
    options = {k: v for k, v in {**good, **change}.items() if v is not None}
    with pytest.raises(SubstreamsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SinkOptions.parse(options, SCHEMA, overwrite=False)


def test_bad_columns_and_complete_mode_are_refused(make_config: ConfigFactory) -> None:
    config = make(make_config)
    good = {CONFIG_PICKLE: ship_config(config), "stream": config.streams[1].name,
            "queryName": "q"}
    assert SinkOptions.parse(good, SCHEMA, overwrite=False).source_id == "spark.q"
    no_epoch = StructType([f for f in SCHEMA.fields if f.name != "epoch"])
    with pytest.raises(SubstreamsError, match="no column 'epoch'"):
        SinkOptions.parse(good, no_epoch, overwrite=False)
    no_clicks = StructType([f for f in SCHEMA.fields if f.name != "clicks"])
    with pytest.raises(SubstreamsError, match=r"needs field\(s\) clicks"):
        SinkOptions.parse(good, no_clicks, overwrite=False)
    with pytest.raises(SubstreamsError, match="output mode 'complete'"):
        SinkOptions.parse(good, SCHEMA, overwrite=True)


def test_a_bad_option_fails_the_query_start_with_its_message(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make(make_config)
    df = clicks_per_url(spark, config)
    with pytest.raises(Exception, match="option 'stream' names no stream of the config"):
        query = (
            df.writeStream.format("substreams")
            .option(CONFIG_PICKLE, ship_config(config))
            .option("stream", "nope").option("queryName", "q")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        query.awaitTermination(120)
        raise AssertionError(str(query.exception()))


def test_a_replayed_batch_writes_nothing_twice_and_other_rows_fail(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink's tasks and commit called as Spark calls them, with a crash between the
    units' commits and the driver's: deterministic, no Spark session."""
    from pyspark.sql import Row as SparkRow

    from substreams.spark import stream_write
    from substreams.spark.epochs import epoch_struct

    config = make(make_config)
    uw, url_counts = config.substreams[1].name, config.streams[1].name
    options = {CONFIG_PICKLE: ship_config(config), "stream": url_counts,
               "queryName": "replayed", "keyField": "url"}

    def rows(window: int, *urls: str) -> list[SparkRow]:
        base = {"control_offset": window, "control_index": 0, "epoch": epoch_struct(window)}
        return [SparkRow(**base, window=window, url=u, clicks=1, is_notification=False)
                for u in urls] + [
            SparkRow(**base, window=window, url=None, clicks=None, is_notification=True)]

    def task(batch: int, unit: int, data: list[SparkRow]) -> Any:
        monkeypatch.setattr(stream_write, "_task_batch_id", lambda: (batch, unit))
        return stream_write.stream_writer(options, SCHEMA, False).write(iter(data))

    with running_acker(config):
        # batch 0: both units commit, then the driver "crashes" before its commit
        task(0, 0, rows(0, "/a", "/b"))
        task(0, 1, rows(0, "/c"))
        # the replay: unit 0 finds its marker and writes nothing, the driver seals
        msgs = [task(0, 0, rows(0, "/a", "/b")), task(0, 1, rows(0, "/c"))]
        assert [s.written for m in msgs for s in m.summaries] == [False, False]
        stream_write.stream_writer(options, SCHEMA, False).commit(msgs, 0)
        # batch 0 replayed once more after its seal: nothing written, nothing sealed
        again = [task(0, 0, rows(0, "/a", "/b")), task(0, 1, rows(0, "/c"))]
        stream_write.stream_writer(options, SCHEMA, False).commit(again, 0)
        # batch 1, then a replay of it whose unit 0 got other rows: refused
        msgs = [task(1, 0, rows(1, "/a")), task(1, 1, rows(1))]
        stream_write.stream_writer(options, SCHEMA, False).commit(msgs, 1)
        with pytest.raises(SubstreamsError, match="unit 0 of batch 1 committed 1 rows"):
            task(1, 0, rows(1, "/a", "/z"))
        notes = wait_for_epochs(config, uw, 2, timeout=60)
        rows_out = output_rows(config, url_counts)
        stream_write.close_sinks()
        acks_applied(config)  # every ack applied: a third epoch would be out by now
        epochs = output_epochs(config, uw)
    assert sorted((int(r["window"]), str(r["url"])) for r in rows_out) == [
        (0, "/a"), (0, "/b"), (0, "/c"), (1, "/a")]
    assert [(n.time, n.records) for n in notes] == [(0, 3), (1, 1)]
    assert len(epochs) == 2
