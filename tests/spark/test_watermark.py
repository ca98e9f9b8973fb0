"""Firm bound vs Spark's own event-time watermark on the same out-of-order records.

The stream's order key is the arrival sequence (``seq``) and the windows are cut on event
time (``ts``), so event times arrive out of order: window 0 has stragglers that arrive after
window 2's events.  The source seals each window once it knows it is complete.  The firm
query counts every window exactly, as soon as it is sealed; ``withWatermark`` + ``window``
(reading the same Kafka records through the soft-mode source) drops the stragglers as late
and holds back windows until its watermark passes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from substreams.app import DIRECT, Application
from substreams.frontier import Time
from substreams.spark.operator import EpochNote, EpochOperator, Row
from substreams.spark.runner import run
from substreams.streams.publisher import Publisher
from tests.conftest import ConfigFactory

pytestmark = pytest.mark.spark

EVENT_SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "substreams.test",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "ts", "type": "long", "doc": "event time (out of order)"},
        {"name": "seq", "type": "long", "doc": "arrival sequence: the order key"},
    ],
}


class Counts(EpochOperator):
    def __init__(self) -> None:
        self.windows: dict[int, int] = {}

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        assert isinstance(epoch, int)
        return []

    def on_notification(self, note: EpochNote) -> None:  # driver side, once per epoch
        assert isinstance(note.time, int)
        self.windows[note.time] = note.records


def watermark_query(
    spark: SparkSession, config_path: Path, substream: str, checkpoint: Path, out: dict[int, int]
) -> None:
    """Spark's event-time answer: watermark 1 s, 1 s tumbling windows, append mode."""

    def collect(df: DataFrame, _batch: int) -> None:
        for r in df.collect():
            out[int(r["window"]["start"].timestamp() * 1000) // 1000] = int(r["count"])

    source = (
        spark.readStream.format("substreams")
        .option("config", str(config_path))
        .option("substream", substream)
        .option("mode", "soft")
        .load()
    )
    agg = (
        source.where(~F.col("is_notification"))
        .withColumn("event_time", F.timestamp_millis(F.col("ts")))
        .withWatermark("event_time", "1 second")
        .groupBy(F.window("event_time", "1 second"))
        .count()
    )
    query = (
        agg.writeStream.outputMode("append")
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None


def test_firm_bound_keeps_late_records_and_emits_sealed_windows_at_once(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    schema = tmp_path / "event.avsc"
    schema.write_text(json.dumps(EVENT_SCHEMA))
    config = make_config(
        [{"name": "events", "partitions": 2, "schema": str(schema), "order_key": "seq"}],
        [{"name": "w", "stream": "events", "kind": "tumbling", "field": "ts", "size_ms": 1000}],
    )
    w, stream = config.substreams[0].name, config.streams[0].name
    seq = iter(range(10**6))
    truth: dict[int, int] = {}

    def send(pub: Publisher, ts_list: list[int]) -> None:
        for ts in ts_list:
            pub.publish({"user": f"u{ts % 3}", "ts": ts, "seq": next(seq)}, key=f"u{ts % 3}")
            truth[ts // 1000] = truth.get(ts // 1000, 0) + 1

    firm = Counts()
    spark_windows: dict[int, int] = {}
    phases: list[tuple[dict[int, int], dict[int, int]]] = []

    def observe() -> None:
        run(
            firm,
            config.path,
            w,
            None,
            checkpoint=tmp_path / "firm",
            once=True,
            spark=spark,
            query_name="firm",
        )
        watermark_query(spark, config.path, w, tmp_path / "wm", spark_windows)
        phases.append((dict(firm.windows), dict(spark_windows)))

    with Application(config, mechanisms=DIRECT).publisher(stream, "src") as pub:
        send(
            pub,
            list(range(0, 1000, 100)) + list(range(1000, 2000, 125)) + list(range(2000, 3000, 100)),
        )
        pub.flush()  # nothing sealed yet: window 0 still has stragglers on the way
        observe()
        send(pub, [150, 450, 950])  # window 0's stragglers arrive after window 2's events
        send(pub, list(range(3000, 3600, 200)))
        for window in (0, 1, 2, 3):
            pub.seal(w, window)
        observe()

    (firm1, wm1), (firm2, wm2) = phases
    # firm: window 0 is not sealed yet (stragglers on the way): nothing emitted
    assert firm1 == {}
    # watermark (max event time 2.9 s - 1 s): window 0 is closed already, without its stragglers
    assert wm1 == {0: 10}
    # firm: every window exactly, stragglers included, all four as soon as they were sealed
    assert firm2 == truth == {0: 13, 1: 8, 2: 10, 3: 3}
    # watermark: the stragglers were dropped as late, and windows 2 and 3, although complete
    # and sealed, are still held back waiting for the watermark to pass them
    assert wm2 == {0: 10, 1: 8}
    assert wm2[0] < truth[0]
