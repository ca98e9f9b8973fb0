"""The ``substreams`` source on a real broker: firm batches hold exactly the completed
epochs (in notification order), open epochs wait, soft mode streams records as they come."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from substreams.app import DIRECT, Application
from substreams.control.io import read_control
from substreams.control.messages import completions
from substreams.frontier import Time
from substreams.spark.operator import EpochNote, EpochOperator, Row
from substreams.spark.options import ship_config
from substreams.spark.runner import run
from tests.conftest import ConfigFactory
from tests.spark.conftest import publish_windows, wait_for_epochs, window_clicks

pytestmark = pytest.mark.spark

Batch = tuple[int, list[dict[str, Any]]]
WINDOWS = {"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}


def drain(
    spark: SparkSession, config_path: Path | None, substream: str, checkpoint: Path, **options: str
) -> list[Batch]:
    """Run the source with trigger availableNow (everything readable now) into a list."""
    batches: list[Batch] = []
    reader = spark.readStream.format("substreams").option("substream", substream)
    if config_path is not None:
        reader = reader.option("config", str(config_path))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(
            lambda df, bid: batches.append((bid, [r.asDict() for r in df.collect()]))
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "availableNow query did not finish"
    assert query.exception() is None
    return [b for b in batches if b[1]]


def test_firm_batch_holds_exactly_the_completed_windows_in_order(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w = config.substreams[0].name
    ck = tmp_path / "ck"
    with Application(config, mechanisms=DIRECT).publisher(config.streams[0].name, "src") as pub:
        # windows 0, 1, 3 with records, window 2 sealed empty, window 4 published, not sealed
        for window, n in [(0, 12), (1, 7), (2, 0), (3, 9)]:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        for c in window_clicks(4, 5):
            pub.publish(c, key=str(c["user"]))
        pub.flush()
        batches = drain(spark, config.path, w, ck)
        # ... nor lost: sealing it makes them the next batch, from the same checkpoint
        pub.seal(w, 4)
    rows = [r for _, b in batches for r in b]
    assert [r["epoch_int"] for r in rows] == [0] * 12 + [1] * 7 + [3] * 9
    # notification order == control-topic order, and each epoch's rows come sorted by order key
    assert sorted(rows, key=lambda r: (r["control_offset"], r["order_key"])) == rows
    assert all(not r["is_notification"] for r in rows)
    assert {r["user"] for r in rows} == {"u0", "u1", "u2"}
    # the open window's records were neither emitted ...
    assert 4 not in {r["epoch_int"] for r in rows}
    later = drain(spark, config.path, w, ck)
    assert [r["epoch_int"] for _, b in later for r in b] == [4] * 5
    assert later[0][0] > batches[-1][0]


def test_firm_sessions_interleaved_with_open_sessions(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "session", "key": "user", "gap_ms": 1000}],
    )
    s, stream = config.substreams[0].name, config.streams[0].name
    events = [
        ("a", 0),
        ("b", 100),
        ("a", 200),
        ("b", 300),
        ("a", 400),
        ("b", 1200),
        ("a", 1600),
        ("b", 2500),
    ]
    with Application(config, mechanisms=DIRECT).publisher(stream, "src") as pub:
        for user, ts in events:
            pub.watermark(ts)  # event time reached ts: closes sessions ended > gap before
            pub.publish({"user": user, "url": "/", "ts": ts})
        pub.flush()
        notes = [
            n
            for _, r in read_control(config.kafka.bootstrap, config.acker.control_topic(s))
            for n in completions(r.body)
        ]
        assert [n.records for n in notes] == [3, 3]
        batches = drain(spark, config.path, s, tmp_path / "ck", markers="true")
        rows = [r for _, b in batches for r in b]
        records = [(r["epoch_label"], r["ts"]) for r in rows if not r["is_notification"]]
        # the epoch column is the Avro Time as a struct
        assert {r["epoch"].asDict()["key"] for r in rows} == {"a", "b"}
        assert rows[0]["epoch"].asDict() == {"key": "a", "coords": [0], "kind": "int"}
        assert records == [
            ("a@0", 0),
            ("a@0", 200),
            ("a@0", 400),
            ("b@100", 100),
            ("b@100", 300),
            ("b@100", 1200),
        ]
        markers = [
            (r["epoch_key"], r["epoch_int"], r["records"]) for r in rows if r["is_notification"]
        ]
        assert markers == [("a", 0, 3), ("b", 100, 3)]
        # open sessions a@1600 and b@2500 complete later, and only then are read
        pub.watermark(10_000, commit=True)
    later = drain(spark, config.path, s, tmp_path / "ck")
    assert sorted((r["epoch_label"], r["ts"]) for _, b in later for r in b) == [
        ("a@1600", 1600),
        ("b@2500", 2500),
    ]


def test_soft_mode_streams_records_and_notification_rows(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w = config.substreams[0].name
    publish_windows(config, w, [(0, 6), (1, 4)], open_tail=window_clicks(2, 3))
    batches = drain(spark, config.path, w, tmp_path / "ck", mode="soft")
    rows = [r for _, b in batches for r in b]
    records = [r for r in rows if not r["is_notification"]]
    notes = [r for r in rows if r["is_notification"]]
    # soft: the open window's records arrive too, before any notification for them
    assert sorted(r["epoch_int"] for r in records) == [0] * 6 + [1] * 4 + [2] * 3
    assert [
        (n["epoch_label"], n["records"], n["user"])
        for n in sorted(notes, key=lambda n: n["control_offset"])
    ] == [("0", 6, None), ("1", 4, None)]
    assert all(n["sealed_at_ms"] > 0 for n in notes)


def test_firm_source_works_with_the_punctuation_mechanism(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    """The source only reads the control topic: the punctuation aligner's EpochCompletes
    give the same firm batches as the acker's (punctuation records are skipped)."""
    import threading

    from substreams.punctuation.service import PunctuationAligner

    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{**WINDOWS, "mechanism": "punctuations"}],
    )
    w, stream = config.substreams[0].name, config.streams[0].name
    stop = threading.Event()
    aligner = PunctuationAligner(config, w)
    thread = threading.Thread(target=aligner.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with Application(config).publisher(stream, "src") as pub:
            for window, n in [(0, 5), (1, 3), (2, 4)]:
                for c in window_clicks(window, n):
                    pub.publish(c, key=str(c["user"]))
                pub.seal(w, window)
            for c in window_clicks(3, 2):  # open
                pub.publish(c, key=str(c["user"]))
            pub.flush()
            wait_for_epochs(config, w, 3)
            batches = drain(spark, config.path, w, tmp_path / "ck")
    finally:
        stop.set()
        thread.join(10)
        aligner.close()
    rows = [r for _, b in batches for r in b]
    assert [r["epoch_int"] for r in rows] == [0] * 5 + [1] * 3 + [2] * 4


def test_the_job_ships_its_config_and_never_reads_the_files(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    """A config loaded on the driver serves the whole query after its YAML file and schemas
    are deleted: the source (``configPickle``) and ``run`` ship the Config, not a path."""
    config = make_config([{"name": "clicks", "partitions": 2}], [WINDOWS])
    w = config.substreams[0].name
    publish_windows(config, w, [(0, 4), (1, 3)])
    config.path.unlink()
    (config.path.parent / "click.avsc").unlink()
    batches = drain(spark, None, w, tmp_path / "ck", configPickle=ship_config(config))
    assert [r["epoch_int"] for _, b in batches for r in b] == [0] * 4 + [1] * 3

    seen: list[tuple[object, int]] = []

    class Collect(EpochOperator):
        def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
            return []

        def on_notification(self, note: EpochNote) -> None:  # driver side
            seen.append((note.time, note.records))

    run(Collect(), config, w, checkpoint=tmp_path / "ck2", once=True, spark=spark)
    assert seen == [(0, 4), (1, 3)]
