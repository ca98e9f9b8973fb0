"""A job writing through the ``substreams`` sink, for tests that run it in a subprocess
(SIGKILL of its driver) and in the test's own session: clicks per url and window.

    python tests/spark/sink_job.py CONFIG SUBSTREAM OUTPUT CHECKPOINT NAME [--once]
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from substreams.config import Config
from substreams.spark.options import CONFIG_PICKLE, ship_config

NOTE = ("control_offset", "control_index", "epoch")
DDL = ("control_offset long, control_index int, "
       "epoch struct<key:string,coords:array<bigint>,kind:string>, "
       "is_notification boolean, url string, clicks long")


def count_per_url(batches: Iterator[Any]) -> Iterator[Any]:
    """Clicks per (epoch, url) of one input partition, and the partition's notification
    rows as they are.  Exact without a shuffle: a firm read's task holds whole epochs."""
    import pyarrow as pa

    counts: Counter[tuple[int, int, str]] = Counter()
    epochs: dict[tuple[int, int], Any] = {}
    marks: list[dict[str, Any]] = []
    for b in batches:
        for r in b.to_pylist():
            ident = (r["control_offset"], r["control_index"])
            epochs[ident] = r["epoch"]
            if r["is_notification"]:
                marks.append({**{k: r[k] for k in NOTE}, "is_notification": True})
            else:
                counts[(*ident, str(r["url"]))] += 1
    out = [
        {"control_offset": o, "control_index": i, "epoch": epochs[(o, i)],
         "is_notification": False, "url": url, "clicks": n}
        for (o, i, url), n in counts.items()
    ] + [{**m, "url": None, "clicks": None} for m in marks]
    epoch = pa.struct([("key", pa.string()), ("coords", pa.list_(pa.int64())),
                       ("kind", pa.string())])
    schema = pa.schema([("control_offset", pa.int64()), ("control_index", pa.int32()),
                        ("epoch", epoch), ("is_notification", pa.bool_()),
                        ("url", pa.string()), ("clicks", pa.int64())])
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=schema)


def per_url(spark: SparkSession, config: Config, substream: str, **read: str) -> DataFrame:
    """Clicks per url and window, through an ordinary (stateless) Spark transformation
    that keeps each epoch's notification row (so a window without clicks is still sealed
    downstream).  The sink takes append mode only (Python data sources): no streaming
    aggregation with state, which a firm read does not need."""
    source = (
        spark.readStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config))
        .option("substream", substream)
        .option("markers", "true")
        .options(**read)
        .load()
    )
    return source.mapInArrow(count_per_url, DDL).withColumn("window", F.col("epoch.coords")[0])


def main(argv: list[str]) -> None:
    from substreams.config import load_config
    from substreams.spark.session import session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    path, substream, output, ck, name, *rest = argv
    config = load_config(path)
    spark = session("sink-job", master="local[2]", shuffle_partitions=2)
    query = start(spark, config, substream, output, ck, name, once="--once" in rest)
    print("query started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")


def start(spark: SparkSession, config: Config, substream: str, output: str, ck: str,
          name: str, *, once: bool) -> StreamingQuery:
    """The job's query, started: one epoch per micro-batch into the ``substreams`` sink
    (``once``: what is complete now, then stop).  The test that kills the job's driver
    restarts it with this in its own session."""
    writer = (
        per_url(spark, config, substream, maxEpochsPerTrigger="1")
        .writeStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config))
        .option("stream", output).option("queryName", name).option("keyField", "url")
        .option("checkpointLocation", ck)
    )
    return (writer.trigger(availableNow=True) if once
            else writer.trigger(processingTime="200 milliseconds")).start()


if __name__ == "__main__":
    main(sys.argv[1:])
