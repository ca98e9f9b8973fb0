"""``run_frames(transform, ...)``: a firm-bound query whose epoch work is Spark DataFrame
operations, so records never leave the JVM between the Kafka read and the result.

Each micro-batch's records are read and decoded by Spark (:mod:`substreams.spark.jvm_read`)
into the ``substreams`` source's columns, the batch's notification rows after them
(``is_notification``); ``transform`` turns that DataFrame into results, e.g.

    lambda df: (df.where(~F.col("is_notification"))
                  .groupBy("control_offset", "control_index", "epoch", "user").count())

Results keep the notification columns (``control_offset``, ``control_index``, ``epoch``):
with an ``output_stream`` they are written exactly once by
:class:`~substreams.spark.write.EpochWriter` (units, markers, the driver's seal -- the same
write as :func:`~substreams.spark.runner.run`'s), each epoch of the batch sealed even when
it produced no row.  Without one, ``on_results(df, batch_id)`` gets the result DataFrame
(what to do with it is the job's: write a table, collect a small aggregate).  Either way
``on_notification`` is called on the driver once per epoch, in notification order, after
the batch's results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from substreams import metrics
from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.spark.epochs import struct_time
from substreams.spark.executor import check_output
from substreams.spark.jvm_read import jvm_unsupported
from substreams.spark.operator import EpochNote
from substreams.spark.runner import (
    EpochQuery,
    JvmRead,
    query_units,
    start_firm_query,
    starts_earliest,
)
from substreams.spark.write import NOTE_COLUMNS, EpochWriter, OutputTimes, missing_note_columns

log = logging.getLogger(__name__)

Transform = Callable[[DataFrame], DataFrame]


class FrameBatchHandler:
    """The ``foreachBatch`` function of :func:`run_frames` (on the driver)."""

    def __init__(
        self,
        transform: Transform,
        jvm: JvmRead,
        writer: EpochWriter | None,
        on_results: Callable[[DataFrame, int], None] | None,
        on_notification: Callable[[EpochNote], None] | None,
        query_name: str,
    ) -> None:
        self.transform = transform
        self.jvm = jvm
        self.writer = writer
        self.on_results = on_results
        self.on_notification = on_notification
        self.query_name = query_name
        self._last_batch = -1

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        found = self.jvm.batch_notes(df, batch_id)
        marks: list[Any] = sorted(df.collect() if found is None else found,
                       key=lambda r: (r["control_offset"], r["control_index"]))
        writer = self.writer
        sealed = writer is not None and batch_id <= writer.sink.committed
        if batch_id <= self._last_batch or sealed:
            metrics.REWINDS.labels("spark", self.query_name).inc()
        self._last_batch = max(self._last_batch, batch_id)
        results: dict[tuple[int, int], int] = {}
        if marks and not sealed:
            # its undecodable records: dead-lettered by a job of their own (the rows are
            # joined to their epochs in the plan, which drops a record of no epoch)
            self.jvm.dead_letter(df.sparkSession, marks)
            rows, _ = self.jvm.batch_rows(df.sparkSession, marks)
            out = self.transform(rows)
            for col in missing_note_columns(out.columns):
                raise SubstreamsError(
                    f"run_frames: the transform's result has no column '{col}' (keep the "
                    f"notification columns {NOTE_COLUMNS} on every result row)"
                )
            if writer is not None:
                flags = rows.where(F.col("is_notification")).select(
                    *NOTE_COLUMNS, "is_notification"
                )
                for n in writer(out.unionByName(flags, allowMissingColumns=True), batch_id):
                    results[(n.control_offset, n.control_index)] = n.results
            elif self.on_results is not None:
                self.on_results(out, batch_id)
        now = int(time.time() * 1000)
        handled = metrics.EPOCHS_HANDLED.labels(self.query_name, self.jvm.substream)
        latency = metrics.EPOCH_LATENCY.labels(self.query_name, self.jvm.substream)
        for r in marks:
            ident = (int(r["control_offset"]), int(r["control_index"]))
            note = EpochNote(struct_time(r["epoch"]), ident[0], ident[1], int(r["records"] or 0),
                             int(r["sealed_at_ms"] or 0), now, results.get(ident, 0), sealed)
            handled.inc()
            if note.sealed_at_ms > 0:
                latency.observe(note.latency_ms / 1000.0)
            if self.on_notification is not None:
                self.on_notification(note)
        log.info("batch %d: %d epochs (DataFrame transform)", batch_id, len(marks))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.jvm.close()


def run_frames(
    transform: Transform,
    config: Config | str | Path,
    substream: str,
    output_stream: str | None = None,
    *,
    name: str,
    key_field: str | None = None,
    output_times: OutputTimes | None = None,
    on_results: Callable[[DataFrame, int], None] | None = None,
    on_notification: Callable[[EpochNote], None] | None = None,
    checkpoint: str | Path | None = None,
    trigger: str = "0 seconds",
    once: bool = False,
    spark: SparkSession | None = None,
    bootstrap: str | None = None,
    block: bool = True,
    options: Mapping[str, str] | None = None,
) -> EpochQuery:
    """Run ``transform`` (DataFrame -> DataFrame) over the completed epochs of
    ``substream`` (module doc).  ``name`` identifies the query across restarts, with
    ``checkpoint`` (default ``<config dir>/.checkpoints/<name>``), as :func:`run`'s."""
    from substreams.spark.session import (
        jvm_read_available,
        quiet_group_id_warning,
        register,
        session,
    )

    if not isinstance(config, Config):
        config = load_config(config)
    stream = config.substream(substream).stream
    why_not = jvm_unsupported(config, stream)
    if why_not is not None:
        raise SubstreamsError(f"run_frames: substream '{substream}': {why_not}; use run()")
    if output_stream is not None:
        config.stream(output_stream)
        check_output(config, output_stream)
    server = client.resolve_bootstrap(config, bootstrap)
    location = Path(checkpoint) if checkpoint else config.path.parent / ".checkpoints" / name
    spark = register(spark) if spark is not None else session(f"substreams:{name}")
    if not jvm_read_available(spark):
        raise SubstreamsError(
            "run_frames: the session has no Spark Kafka connector and spark-avro (create it "
            "with substreams.spark.session.session(), or submit with substreams submit)"
        )
    quiet_group_id_warning(spark)
    writer = None
    if output_stream is not None:
        extra: dict[str, Any] = {} if output_times is None else {"output_times": output_times}
        writer = EpochWriter(config, output_stream, name=name, bootstrap=server,
                             key_field=key_field, units=query_units(location, spark), **extra)
    jvm = JvmRead(config, substream, server, name, location, starts_earliest(options))
    handler = FrameBatchHandler(transform, jvm, writer, on_results, on_notification, name)
    return start_firm_query(
        spark, config, substream, server, name, location, handler, notes_only=True,
        options=options, once=once, trigger=trigger, block=block,
    )


__all__ = ["FrameBatchHandler", "run_frames"]
