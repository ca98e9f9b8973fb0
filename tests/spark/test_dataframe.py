"""The DataFrame API: a firm read gives a streaming DataFrame of complete epochs (the epoch a
struct column mirroring the Avro Time); ordinary Spark operations transform it on the
executors; EpochWriter writes each batch exactly once and seals its epochs, so a downstream
firm read sees exactly the expected epochs (jobs chain)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from substreams.app import Application
from substreams.spark.operator import EpochNote
from substreams.spark.options import CONFIG_PICKLE, ship_config
from substreams.spark.write import EpochWriter
from tests.conftest import ConfigFactory
from tests.spark.conftest import running_acker, wait_for_epochs, window_clicks
from tests.spark.jobs import out_stream

pytestmark = pytest.mark.spark

WINDOWS = {"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}


def test_read_transform_write_chains_into_a_downstream_firm_read(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2},
         out_stream("url_counts", "url_count.avsc", partitions=2)],
        [WINDOWS, {"name": "uw", "stream": "url_counts", "kind": "epoch", "field": "window"}],
    )
    w, uw = config.substreams[0].name, config.substreams[1].name
    clicks, url_counts = config.streams[0].name, config.streams[1].name
    windows = [(0, 10), (1, 6), (2, 0), (3, 9)]  # window 2 sealed without records
    want: Counter[tuple[int, str]] = Counter()
    for window, n in windows:
        for c in window_clicks(window, n):
            want[(window, str(c["url"]))] += 1
    notes: list[EpochNote] = []
    writer = EpochWriter(config, url_counts, name="df-url-counts", key_field="url",
                         on_notification=notes.append)

    def per_batch(df: DataFrame, batch_id: int) -> None:
        # ordinary Spark operations on the batch (executors): clicks per url and epoch
        counts = (
            df.where(~F.col("is_notification"))
            .groupBy("control_offset", "control_index", "epoch", "url")
            .agg(F.count("*").alias("clicks"))
            .withColumn("window", F.col("epoch.coords")[0])
        )
        marks = df.where(F.col("is_notification")).select(
            "control_offset", "control_index", "epoch", "is_notification"
        )
        writer(counts.unionByName(marks, allowMissingColumns=True), batch_id)

    with running_acker(config), Application(config).publisher(clicks, "src") as pub:
        for window, n in windows:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        for c in window_clicks(4, 3):  # window 4 stays open: nobody may see it
            pub.publish(c, key=str(c["user"]))
        pub.flush()
        wait_for_epochs(config, w, len(windows), timeout=60)
        source = (
            spark.readStream.format("substreams")
            .option(CONFIG_PICKLE, ship_config(config))
            .option("substream", w)
            .option("markers", "true")
            .load()
        )
        # the epoch is the Avro Time as a struct, not a string
        assert source.schema["epoch"].dataType.simpleString() == (
            "struct<key:string,coords:array<bigint>,kind:string>"
        )
        query = (
            source.writeStream.foreachBatch(per_batch)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300)
        assert query.exception() is None
        writer.close()
        done = wait_for_epochs(config, uw, len(windows), timeout=120)
        # downstream: a firm read of the output substream sees exactly these epochs
        got: list[tuple[int, str, int]] = []
        down = (
            spark.readStream.format("substreams")
            .option(CONFIG_PICKLE, ship_config(config))
            .option("substream", uw)
            .load()
            .writeStream.foreachBatch(
                lambda df, _: got.extend(
                    (int(r["window"]), str(r["url"]), int(r["clicks"])) for r in df.collect()
                )
            )
            .option("checkpointLocation", str(tmp_path / "ck2"))
            .trigger(availableNow=True)
            .start()
        )
        assert down.awaitTermination(300)
    assert [n.time for n in done] == [0, 1, 2, 3]
    assert [n.records for n in done] == [
        len({u for (win, u) in want if win == i}) for i in range(4)
    ]
    assert sorted(got) == sorted((win, u, n) for (win, u), n in want.items())
    assert [n.time for n in notes] == [0, 1, 2, 3]
