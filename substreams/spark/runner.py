"""``run(operator, ...)``: a firm-bound streaming query whose operator runs on executors.

The query reads the ``substreams`` source in firm mode with one notification row per epoch
(so an epoch without records is still delivered).  ``foreachBatch`` plans each micro-batch
on the driver and runs it on the executors: the rows are hash-partitioned by notification
(and the operator's ``group_by`` key), sorted within each task, and one Arrow task per
partition (:func:`substreams.spark.executor.run_unit`) groups them, calls the operator and
writes its results exactly once.  Only one small summary row per (task, epoch) comes back
to the driver -- never a record -- from which it seals the output epochs
(:class:`~substreams.spark.sink.BatchSink`) and calls ``on_notification`` once per epoch,
in notification order.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from substreams import metrics
from substreams.config import Config, load_config
from substreams.control.messages import OffsetRange
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.spark.executor import (
    DIRECT_UNITS,
    SUMMARY_FIELDS,
    UnitPlan,
    check_output,
    columnar,
    run_unit,
    run_unit_batches,
)
from substreams.spark.jvm_read import Decoding, jvm_unsupported, unplaced_records
from substreams.spark.jvm_read import records as jvm_records
from substreams.spark.log import worker_logging
from substreams.spark.offsets import ControlScanner, SourceOffset
from substreams.spark.operator import (
    EpochFunction,
    EpochInfo,
    EpochNote,
    EpochOperator,
    Summary,
    as_operator,
    info_rows,
    notifications,
    partition_columns,
    row_order,
    sort_columns,
)
from substreams.spark.options import CONFIG_PICKLE, ship_config
from substreams.spark.sink import BatchSink
from substreams.spark.source import NOTE_COLUMN, note_row

log = logging.getLogger(__name__)

SINGLE_UNIT_RECORDS = 100_000
"""A JVM-path batch announcing at most this many records runs as one unit, without a
shuffle (the latency of small steady-state batches); larger ones use the query's units."""
SUMMARY_DDL = ", ".join(f"{name} {kind}" for name, kind in SUMMARY_FIELDS)


BadRowsTarget = tuple[Config, str, str, str]
"""Where a task's undecodable records go: config, stream, reader name, bootstrap."""


def _unit_task(plan: UnitPlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of a batch: Arrow batches in, summaries out."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        # The units' lines ("committed", "already committed") in the executor's stderr.
        worker_logging()
        ctx = TaskContext.get()
        unit = ctx.partitionId() if ctx is not None else 0
        if columnar(plan.operator):  # whole epochs in order (direct, or sorted by epoch)
            sums = run_unit_batches(plan, unit, batches)
        else:
            sums = run_unit(plan, unit, (row for b in batches for row in b.to_pylist()))
        yield from _summary_batches(sums)

    return task


def _placed_unit_task(
    plan: UnitPlan, notes: list[dict[str, Any]], schema: Any, bad: BadRowsTarget,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of a one-unit JVM-read batch: the batch's decoded
    records in (:func:`~substreams.spark.jvm_read.unplaced_records`), those that did not
    decode dead-lettered (``bad``: config, stream, reader name, bootstrap), the others
    matched to ``notes`` and sorted here (:func:`~substreams.spark.jvm_read.placed_table`),
    then the same unit as :func:`_unit_task`'s; summaries out."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        from substreams.spark.jvm_read import bad_rows, dead_letter_rows, placed_table

        worker_logging()
        ctx = TaskContext.get()
        unit = ctx.partitionId() if ctx is not None else 0
        got = list(batches)
        # A dropped record may be one an epoch counted (an acknowledged record this reader
        # cannot decode): the count check would then stop the batch the letter let go on.
        checked = plan if not dead_letter_rows(*bad, bad_rows(got)) else replace(
            plan, verify=False)
        table = placed_table(got, notes, schema, sort_columns(plan.operator.group_by))
        if columnar(plan.operator):
            sums = run_unit_batches(checked, unit, table.to_batches())
        else:
            sums = run_unit(checked, unit, table.to_pylist())
        yield from _summary_batches(sums)

    return task


def _summary_batches(sums: list[Summary]) -> Iterator[Any]:
    """A task's summaries as the Arrow batch ``mapInArrow`` returns (none: no batch)."""
    import pyarrow as pa

    arrow = {"long": pa.int64(), "int": pa.int32(), "string": pa.string(),
             "boolean": pa.bool_()}
    schema = pa.schema([(name, arrow[kind]) for name, kind in SUMMARY_FIELDS])
    if sums:
        yield pa.RecordBatch.from_pylist([asdict(s) for s in sums], schema=schema)


class JvmRead:
    """What the JVM path of a query needs on the driver: the stream, and its writer
    schemas (the schema topic re-read each batch: a publisher registers a new schema
    before its first record, so before any EpochComplete that covers it)."""

    def __init__(
        self, config: Config, substream: str, bootstrap: str, query: str,
        checkpoint: Path | None = None, earliest: bool = True,
    ) -> None:
        """``checkpoint``: the query's, whose offset log gives each batch's control offsets
        (:func:`logged_span`); ``earliest``: the query's first batch starts at the control
        topic's start (the source's ``starting`` option)."""
        from substreams.spark.schema import PayloadLayout

        self.config = config
        self.substream = substream
        self.stream = config.substream(substream).stream
        self.bootstrap = bootstrap
        self.query = query
        self.group_id = f"substreams.spark.{query}.read"
        """Stable: Spark pools executor consumers by (group id, partition)."""
        self.layout = PayloadLayout(config.stream(self.stream))
        self.layout_struct = self.layout.struct()
        self._decoding: Decoding | None = None
        self._schema_seen: int | None = None
        self._consumer: Any = None
        self._control: ControlScanner | None = None
        """The driver's own follower of the control topic (:meth:`batch_notes`)."""
        self.checkpoint = checkpoint
        self.earliest = earliest
        self._arrow: Any = None
        """The source's Arrow schema (made once: :meth:`batch_unplaced`)."""

    def decoding(self) -> Decoding:
        """The writer schemas, the schema topic re-read only when its end moved (one
        watermark request a batch instead of a consumer a batch)."""
        from substreams.streams.evolution import registry

        end = self._schema_end()
        if self._decoding is None or end is None or end != self._schema_seen:
            reg = registry(self.config, self.bootstrap)
            reg.refresh()
            self._decoding = Decoding.of(self.config, self.stream, reg.schemas(self.stream))
            self._schema_seen = end
        return self._decoding

    def _schema_end(self) -> int | None:
        from confluent_kafka import KafkaException, TopicPartition

        from substreams.streams.evolution import schema_topic

        try:
            if self._consumer is None:
                self._consumer = client.consumer(self.bootstrap, self.config)
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(schema_topic(self.config), 0), timeout=10, cached=False)
            return int(high)
        except KafkaException as exc:  # unknown: re-read the topic, as before
            log.debug("schema topic end unknown (%s): re-reading it", exc)
            return None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._control is not None:
            self._control.close()
            self._control = None

    def batch_notes(self, df: DataFrame, batch_id: int) -> list[dict[str, Any]] | None:
        """The batch's notification rows (what collecting ``df`` gives), made on the driver
        without a Spark job: the control records between the batch's start and end
        offsets -- from Spark's offset log (``df``'s plan, else the checkpoint's offset
        files), so a replay names the same epochs -- scanned by a follower kept here, which
        stays at the topic's end between batches.  None when neither shows the offsets
        (the caller collects ``df``)."""
        span = batch_span(df)
        if span is None and self.checkpoint is not None:
            span = logged_span(self.checkpoint, batch_id, self.earliest)
        if span is None:
            log.debug("batch %d: offsets not found: collecting the notes", batch_id)
            return None
        start, end = span
        if self._control is None:
            self._control = ControlScanner(
                self.bootstrap, self.config.acker.control_topic(self.substream),
                self.substream, self.config,
            )
        scanner = self._control
        deadline = Deadline(30.0)
        t0, scans = time.perf_counter(), 0
        while scanner.scanned_to < end and not deadline.passed:
            scanner.scan(start, max_wait=0.5, until=end)  # from where the last batch left it
            scans += 1
        t1 = time.perf_counter()
        notes = scanner.between(start, end)  # re-read from start if the scan fell short
        log.debug("batch notes [%d, %d): %d scans %.0f ms, between %.0f ms", start, end, scans,
                  (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000)
        scanner.forget_before(start)
        names = [*self.layout_struct.fieldNames(), NOTE_COLUMN]
        return [dict(zip(names, note_row(self.layout, n), strict=True)) for n in notes]

    def _local(self, marks: list[Any]) -> tuple[list[OffsetRange], list[dict[str, Any]]]:
        """The ranges of the batch's notification rows ``marks``, and the rows as JSON
        values by column (an absent one null) with ``until_coords`` (a span's end)."""
        notes = [json.loads(r[NOTE_COLUMN]) for r in marks]
        ranges = [OffsetRange(str(a), int(b), int(c), int(d))
                  for n in notes for a, b, c, d in n["ranges"]]
        struct = self.layout_struct
        local = [
            {**{f.name: r[f.name] for f in struct.fields if r[f.name] is not None},
             "epoch": _epoch_dict(r["epoch"]),
             "until_coords": None if n["until"] is None else list(n["until"]["coords"])}
            for r, n in zip(marks, notes, strict=True)
        ]
        return ranges, local

    def _reads(self, ranges: list[OffsetRange]) -> bool:
        return any(r.stream == self.stream and r.end > r.start for r in ranges)

    def batch_unplaced(
        self, spark: SparkSession, marks: list[Any]
    ) -> tuple[DataFrame, list[dict[str, Any]], Any, bool] | None:
        """The batch's records read and decoded in the JVM, not matched to their epochs
        (:func:`~substreams.spark.jvm_read.unplaced_records`), the notification rows
        (:meth:`_local`'s), the source's Arrow schema, and whether every range is of the
        substream's own stream; None when there is nothing to read."""
        from pyspark.sql.pandas.types import to_arrow_schema

        ranges, local = self._local(marks)
        if not self._reads(ranges):
            return None
        recs = unplaced_records(spark, self.config, self.stream, self.substream,
                                self.bootstrap, ranges, self.decoding(), self.group_id)
        if self._arrow is None:
            self._arrow = to_arrow_schema(self.layout_struct)
        return recs, local, self._arrow, all(r.stream == self.stream for r in ranges)

    @property
    def bad_target(self) -> BadRowsTarget:
        """Where the tasks send undecodable records (as the query's reader)."""
        return (self.config, self.stream, f"spark.{self.query}", self.bootstrap)

    def dead_letter(self, spark: SparkSession, marks: list[Any]) -> int:
        """Dead-letter the undecodable records of the batch's ranges, found by a Spark job
        of their own that reads the ranges (only those records reach the driver), or raise
        :class:`~substreams.errors.BadRecordError` under ``on_bad_record: fail``; how many.
        For the reads whose rows are joined to their epochs in the plan (a large batch's,
        ``run_frames``'), where a record of no epoch is dropped."""
        from pyspark.sql import functions as F

        from substreams.spark.jvm_read import dead_letter_rows

        ranges, _ = self._local(marks)
        if not self._reads(ranges):
            return 0
        recs = unplaced_records(spark, self.config, self.stream, self.substream,
                                self.bootstrap, ranges, self.decoding(), self.group_id)
        bad = [(int(r["partition"]), int(r["offset"]), bytes(r["_raw"] or b""), str(r["_bad"]))
               for r in recs.where(F.col("_bad").isNotNull())
               .select("partition", "offset", "_raw", "_bad").collect()]
        return dead_letter_rows(*self.bad_target, bad)

    def batch_rows(self, spark: SparkSession, marks: list[Any]) -> tuple[DataFrame, bool]:
        """The batch's rows as the Python read would give them -- records read and decoded
        in the JVM, then the notification rows ``marks`` (collected from the batch) -- and
        whether every range is of the substream's own stream (counts checkable)."""
        from pyspark.sql.types import ArrayType, LongType, StructField, StructType

        ranges, local = self._local(marks)
        struct = self.layout_struct
        schema = StructType([*struct.fields,
                             StructField("until_coords", ArrayType(LongType()), True)])
        marks_df = local_frame(spark, local, struct)
        if not self._reads(ranges):
            # epochs without records here: nothing to read
            return marks_df, all(r.stream == self.stream for r in ranges)
        rows = jvm_records(
            spark, self.config, self.stream, self.substream, self.bootstrap, ranges, local,
            self.decoding(), self.group_id, lambda: local_frame(spark, local, schema),
        ).unionByName(marks_df)
        return rows, all(r.stream == self.stream for r in ranges)


def _epoch_dict(value: Any) -> dict[str, Any]:
    """An ``epoch`` value (a collected Row, or the source's (key, coords, kind)) as JSON."""
    if hasattr(value, "asDict"):
        return dict(value.asDict())
    key, coords, kind = value
    return {"key": key, "coords": list(coords), "kind": kind}


def local_frame(spark: SparkSession, rows: list[dict[str, Any]], schema: Any) -> DataFrame:
    """``rows`` (JSON values by column name, an absent one null) as a DataFrame of
    ``schema`` over a local relation made in the JVM in one call.  Why not
    ``createDataFrame``: from a Python list it makes a parallelized RDD, whose every use
    (the broadcast of the batch's notes) is a Spark job of its own."""
    from pyspark.sql import functions as F

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    texts = [json.dumps(r) for r in rows]
    jds = spark._jsparkSession.createDataset(texts, jvm.org.apache.spark.sql.Encoders.STRING())
    return DataFrame(jds.toDF(), spark).select(
        F.from_json("value", schema).alias("r")).select("r.*")


def logged_span(location: Path, batch_id: int, earliest: bool) -> tuple[int, int] | None:
    """The control offsets [start, end) of batch ``batch_id`` of the query checkpointed at
    ``location``, from Spark's offset log there: Spark writes a batch's end offsets
    (``offsets/<id>``: a version line, the batch metadata, then the source's offset)
    before running it, and a batch starts where the one before it ended (the first, at
    the source's initial offset: the topic's start when ``earliest``).  Why the files:
    ``foreachBatch`` hands over its batch as a ``LogicalRDD``, whose plan no longer shows
    the streaming scan's offsets (:func:`batch_span`).  None when a file is missing or
    is not this source's offset (the caller collects the notes instead)."""
    end = _logged_control(location, batch_id)
    if end is None:
        return None
    if batch_id == 0:
        return (0, end) if earliest else None
    start = _logged_control(location, batch_id - 1)
    return None if start is None else (start, end)


def _logged_control(location: Path, batch_id: int) -> int | None:
    try:
        lines = (location / "offsets" / str(batch_id)).read_text().splitlines()
        return SourceOffset.from_json(json.loads(lines[2])).control
    except (OSError, IndexError, ValueError, SubstreamsError):
        return None


def batch_span(df: DataFrame) -> tuple[int, int] | None:
    """The control offsets [start, end) of the ``substreams`` source's micro-batch that
    ``df`` (a ``foreachBatch`` argument) reads: its plan's streaming scan carries the
    offsets Spark logged for the batch.  None if the plan has no such scan (e.g. a plan
    shape of another Spark version)."""
    try:
        leaves = df._jdf.queryExecution().logical().collectLeaves()
        for i in range(leaves.size()):
            leaf = leaves.apply(i)
            if leaf.getClass().getSimpleName() != "StreamingDataSourceV2ScanRelation":
                continue
            start, end = leaf.startOffset(), leaf.endOffset()
            if not (start.isDefined() and end.isDefined()):
                return None
            return (SourceOffset.from_json(json.loads(start.get().json())).control,
                    SourceOffset.from_json(json.loads(end.get().json())).control)
    except Exception as exc:  # a py4j error (no such method or class), or not our offset
        log.debug("batch offsets not in the plan (%s)", exc)
    return None


class EpochBatchHandler:
    """The ``foreachBatch`` function (runs on the driver, keeps its sink across batches)."""

    def __init__(
        self,
        operator: EpochOperator,
        config: Config | None,
        output_stream: str | None,
        source_id: str,
        bootstrap: str,
    ) -> None:
        """``config`` may be None only without an ``output_stream`` (no sink to open)."""
        self.operator = operator
        self.config = config
        self.output_stream = output_stream
        self.source_id = source_id
        self.bootstrap = bootstrap
        self.sink: BatchSink | None = None
        self.substream = ""
        self.query_name = source_id
        self.units: int | None = None
        """Tasks of each batch's write stage; fixed for the query's life (see :func:`units`)."""
        self.jvm: JvmRead | None = None
        """Set when the batches hold notification rows only (source option ``read=notes``)
        and the records are read here, by Spark's Kafka source (:meth:`jvm_batch`)."""
        self._last_batch = -1
        self._started = 0.0
        self._ran = 0.0
        """Wall clock of the current batch's start and of its jobs' end (timing logs)."""

    def _sink(self) -> BatchSink | None:
        if self.output_stream is not None and self.sink is None:
            if self.config is None:
                raise SubstreamsError("EpochBatchHandler: an output stream needs a config")
            self.sink = BatchSink(self.config, self.output_stream, self.source_id, self.bootstrap)
        return self.sink

    def plan(self, batch_id: int, units: int, sealed: bool) -> UnitPlan:
        return UnitPlan(
            self.operator, batch_id, units, self.config, self.output_stream,
            self.source_id, self.bootstrap, sealed,
        )

    def _begin(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was sealed before (a replay of finished work)."""
        sink = self._sink()
        sealed = sink is not None and batch_id <= sink.committed
        if batch_id <= self._last_batch or sealed:  # Spark replays a batch it had not committed
            metrics.REWINDS.labels("spark", self.query_name).inc()
        self._last_batch = max(self._last_batch, batch_id)
        return sealed

    def handle(self, batch_id: int, epochs: list[EpochInfo]) -> list[EpochNote]:
        """A batch of ``epochs`` run in this process as one unit (tests drive the handler
        this way without Spark): the same task function as the executors', then the same
        sealing and notifications."""
        sealed = self._begin(batch_id)
        rows = sorted(
            (r for info in epochs for r in info_rows(info)), key=row_order(self.operator.group_by)
        )
        sums = run_unit(self.plan(batch_id, 1, sealed), 0, rows)
        return self.deliver(batch_id, sums, sealed)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        op = self.operator
        self._started = time.time()
        sealed = self._begin(batch_id)
        if self.jvm is not None:
            self._jvm_batch(df, batch_id, sealed, self.jvm)
            return
        if op.group_by is None:
            # Direct: the source's read tasks are the units.  Each holds whole epochs in
            # notification order, records in read order before their notification row --
            # the order sort_columns asks for -- so no shuffle and no sort: one stage.  The
            # split is in Spark's offset log (SourceOffset.tasks): a replay has the same units.
            log.info("batch %d: started (units: the source's tasks%s)", batch_id,
                     ", a replay of a sealed batch" if sealed else "")
            rows = df.mapInArrow(
                _unit_task(self.plan(batch_id, DIRECT_UNITS, sealed)), SUMMARY_DDL
            )
        else:
            units = self.units or int(
                df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1
            )
            log.info("batch %d: started (%d units%s)", batch_id, units,
                     ", a replay of a sealed batch" if sealed else "")
            part = df.repartition(units, *partition_columns(op.group_by)).sortWithinPartitions(
                *sort_columns(op.group_by)
            )
            rows = part.mapInArrow(_unit_task(self.plan(batch_id, units, sealed)), SUMMARY_DDL)
        sums = [Summary(**r.asDict()) for r in rows.collect()]  # summaries, not records
        self._ran = time.time()
        self.deliver(batch_id, sums, sealed)

    def _jvm_batch(self, df: DataFrame, batch_id: int, sealed: bool, jvm: JvmRead) -> None:
        """One batch on the JVM path: ``df`` holds the batch's notification rows (with
        their ranges); the records are read and decoded by Spark and handed to the same
        unit tasks as the Python read's -- in one task that matches them to their epochs
        and sorts them (a small batch), or joined to their epochs in the plan
        (:func:`substreams.spark.jvm_read.records`), shuffled by notification (and key)
        and sorted."""
        op = self.operator
        t0 = time.perf_counter()
        found = jvm.batch_notes(df, batch_id)
        marks: list[Any] = sorted(df.collect() if found is None else found,
                       key=lambda r: (r["control_offset"], r["control_index"]))
        t_notes = time.perf_counter()
        if sealed or not marks:
            if marks:
                log.info("batch %d: started (%d epochs, JVM read, a replay of a sealed batch)",
                         batch_id, len(marks))
            # A replay of a sealed batch writes nothing: its notes come from the rows alone.
            sums = [Summary(int(r["control_offset"]), int(r["control_index"]),
                            str(r["epoch_label"]), True, int(r["records"] or 0),
                            int(r["sealed_at_ms"] or 0), 0, 0, False) for r in marks]
            self._ran = time.time()
            self.deliver(batch_id, sums, sealed)
            return
        # A small batch is one unit in one stage (no shuffle: the read tasks coalesce into
        # one sorted task); a large one is hash-partitioned into the query's units.  The
        # choice depends on the batch's notifications only, so a replay makes the same one.
        total = sum(int(r["records"] or 0) for r in marks)
        single = total <= SINGLE_UNIT_RECORDS
        units = 1 if single else self.units or int(
            df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1)
        log.info("batch %d: started (%d epochs, %d records, JVM read, %d units)", batch_id,
                 len(marks), total, units)
        unplaced = jvm.batch_unplaced(df.sparkSession, marks) if single else None
        if unplaced is not None:
            # One unit: the records' epochs are found, and the batch sorted, in its task --
            # one stage, a plan of the same shape every batch (no notes in it).
            recs, local, arrow, ours = unplaced
            plan = replace(self.plan(batch_id, units, sealed), verify=ours)
            mapped = recs.coalesce(1).mapInArrow(
                _placed_unit_task(plan, local, arrow, jvm.bad_target), SUMMARY_DDL)
            t_plan = time.perf_counter()
        else:
            # A large batch (a backlog): its undecodable records are found by a job of their
            # own, before the units run (the join with the epochs drops them); the count
            # check cannot tell them from an epoch's records then.
            dropped = jvm.dead_letter(df.sparkSession, marks)
            rows, ours = jvm.batch_rows(df.sparkSession, marks)
            ours = ours and not dropped
            placed = rows.coalesce(1) if single else rows.repartition(
                units, *partition_columns(op.group_by))
            part = placed.sortWithinPartitions(*sort_columns(op.group_by))
            plan = replace(self.plan(batch_id, units, sealed), verify=ours)
            mapped = part.mapInArrow(_unit_task(plan), SUMMARY_DDL)
            t_plan = time.perf_counter()
        sums = [Summary(**r.asDict()) for r in mapped.collect()]
        log.debug("batch %d: JVM path: notes %.0f ms, schemas + plan %.0f ms, jobs %.0f ms",
                  batch_id, (t_notes - t0) * 1000, (t_plan - t_notes) * 1000,
                  (time.perf_counter() - t_plan) * 1000)
        self._ran = time.time()
        self.deliver(batch_id, sums, sealed)

    def deliver(self, batch_id: int, sums: list[Summary], sealed: bool) -> list[EpochNote]:
        """Seal the batch's output epochs (its tasks all committed), then notify."""
        op = self.operator
        notes = notifications(sums, int(time.time() * 1000), replayed=sealed)
        log.info(
            "batch %d: %d epochs%s", batch_id, len(notes),
            f" ({notes[0].label} .. {notes[-1].label})" if notes else "",
        )
        t_seal = time.time()
        sink = self.sink
        if sink is not None:
            sink.seal(batch_id, [op.output_times(n.time, sink.output_substreams) for n in notes])
        t_callback = time.time()
        handled = metrics.EPOCHS_HANDLED.labels(self.query_name, self.substream)
        latency = metrics.EPOCH_LATENCY.labels(self.query_name, self.substream)
        for note in notes:
            handled.inc()
            if note.sealed_at_ms > 0:
                latency.observe(note.latency_ms / 1000.0)
            op.on_notification(note)
        self._phases(batch_id, notes, t_seal, t_callback)
        return notes

    def _phases(
        self, batch_id: int, notes: list[EpochNote], t_seal: float, t_callback: float
    ) -> None:
        """One DEBUG line per batch: where the time from the oldest seal went (wall clock,
        ms).  ``to batch`` = seal -> ``foreachBatch`` called (trigger wait, the source's
        ``latestOffset`` and planning); ``jobs`` = the Spark jobs (read, shuffle, units);
        then the driver's seal transaction and the callbacks."""
        sealed = [n.sealed_at_ms for n in notes if n.sealed_at_ms > 0]
        if not sealed or not log.isEnabledFor(logging.DEBUG):
            return
        now = time.time()
        start, ran = self._started or t_seal, self._ran or t_seal
        log.debug(
            "batch %d timings: oldest seal -> batch %.0f ms, jobs %.0f ms, notes %.0f ms, "
            "driver seal %.0f ms, callbacks %.0f ms; seal -> callback %.0f ms",
            batch_id, start * 1000 - min(sealed), (ran - start) * 1000,
            (t_seal - ran) * 1000, (t_callback - t_seal) * 1000, (now - t_callback) * 1000,
            now * 1000 - min(sealed),
        )

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        if self.jvm is not None:
            self.jvm.close()


UNITS_FILE = "substreams-units"


def query_units(location: Path, spark: SparkSession) -> int:
    """The unit count of the query checkpointed at ``location``: recorded there at its
    first start (``spark.sql.shuffle.partitions`` then) and read back at every restart, so
    a replayed batch is cut into the same units whatever the restarted session's settings
    (the units' markers are per task number)."""
    path = location / UNITS_FILE
    if path.is_file():
        return int(path.read_text().strip())
    units = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
    location.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{units}\n")
    tmp.replace(path)
    return units


class _Closes(Protocol):
    def close(self) -> None: ...


class EpochQuery:
    """The running query of :func:`run` (and of :func:`~substreams.spark.frames.run_frames`):
    a :class:`StreamingQuery` (every attribute of it is here) that also releases the output
    publisher of its batch handler when stopped."""

    def __init__(self, query: StreamingQuery, handler: _Closes) -> None:
        self.query = query
        self.handler = handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.handler.close()


def run(
    operator: EpochOperator | EpochFunction,
    config: Config | str | Path,
    substream: str,
    output_stream: str | None = None,
    *,
    checkpoint: str | Path | None = None,
    trigger: str = "0 seconds",
    once: bool = False,
    spark: SparkSession | None = None,
    bootstrap: str | None = None,
    query_name: str | None = None,
    block: bool = True,
    options: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
    read: str = "jvm",
) -> EpochQuery:
    """Run ``operator`` over the completed epochs of ``substream``, on the executors.

    ``operator`` is an :class:`EpochOperator` or a plain function ``fn(epoch, rows) ->
    results``.  ``config`` is a loaded :class:`Config` or the path of ``substreams.yaml``
    (loaded and validated here, once): the Config object itself travels to the tasks, so
    they never read the file.
    ``checkpoint`` (default ``<config dir>/.checkpoints/<query name>``) and ``query_name``
    must stay the same across restarts: they identify the query to Spark and to the output
    writers.  ``once`` processes what is complete now and stops.  With ``block`` the call
    waits for the query to end (Ctrl-C stops it); otherwise it returns the running query.
    ``metrics_port`` serves Prometheus metrics on ``127.0.0.1:<port>/metrics``.
    ``trigger`` defaults to ``0 seconds``: an idle query is paced by the source, whose
    ``latestOffset`` returns as soon as an EpochComplete arrives (at most 50 ms later).
    ``read``: ``jvm`` (default) reads and decodes each batch's records with Spark's own
    Kafka consumers and ``from_avro`` (:mod:`substreams.spark.jvm_read`; the session needs
    :func:`substreams.spark.connector.kafka_connector_conf`'s packages, which
    :func:`substreams.spark.session` and ``substreams submit`` add); ``python`` reads them
    in the source's Python read tasks.  ``jvm`` falls back to ``python``, with a warning,
    where the JVM cannot serve (:func:`substreams.spark.jvm_read.jvm_unsupported`).
    """
    from substreams.spark.lifecycle import die_with_parent, record_user_error

    die_with_parent()
    try:
        return _run(operator, config, substream, output_stream, checkpoint=checkpoint,
                    trigger=trigger, once=once, spark=spark, bootstrap=bootstrap,
                    query_name=query_name, block=block, options=options,
                    metrics_port=metrics_port, read=read)
    except BaseException as exc:
        record_user_error(exc)  # for `substreams submit`, which prints it first
        raise


def _run(
    operator: EpochOperator | EpochFunction,
    config: Config | str | Path,
    substream: str,
    output_stream: str | None,
    *,
    checkpoint: str | Path | None,
    trigger: str,
    once: bool,
    spark: SparkSession | None,
    bootstrap: str | None,
    query_name: str | None,
    block: bool,
    options: Mapping[str, str] | None,
    metrics_port: int | None,
    read: str,
) -> EpochQuery:
    from substreams.spark.session import register, session

    op = as_operator(operator)
    config = _checked_config(config, substream, output_stream)
    server = client.resolve_bootstrap(config, bootstrap)
    name = query_name or f"{type(op).__name__}.{substream}"
    location = Path(checkpoint) if checkpoint else config.path.parent / ".checkpoints" / name
    if spark is None:
        log.info("spark runner: query '%s': starting Spark (the first start takes 10-60 s)",
                 name)
        began = time.monotonic()
        spark = session(f"substreams:{name}")
        log.info("spark runner: query '%s': Spark %s up in %.1f s (master %s)", name,
                 spark.version, time.monotonic() - began, spark.sparkContext.master)
    else:
        spark = register(spark)
    handler = _handler(op, config, substream, output_stream, server, name, location, spark,
                       read, earliest=starts_earliest(options))
    if metrics_port is not None:
        metrics.serve(metrics_port)
    _log_start(name, substream, location)
    return start_firm_query(
        spark, config, substream, server, name, location, handler,
        notes_only=handler.jvm is not None, options=options, once=once, trigger=trigger,
        block=block,
    )


def _checked_config(
    config: Config | str | Path, substream: str, output_stream: str | None
) -> Config:
    """The loaded config, with ``substream`` and the output stream known and writable."""
    if not isinstance(config, Config):
        config = load_config(config)
    config.substream(substream)
    if output_stream is not None:
        config.stream(output_stream)
        check_output(config, output_stream)
    return config


def _handler(
    op: EpochOperator, config: Config, substream: str, output_stream: str | None, server: str,
    name: str, location: Path, spark: SparkSession, read: str, earliest: bool = True,
) -> EpochBatchHandler:
    """The query's ``foreachBatch`` handler, its units fixed and its output registered."""
    handler = EpochBatchHandler(op, config, output_stream, f"spark.{name}", server)
    handler.substream, handler.query_name = substream, name
    handler.units = query_units(location, spark)
    handler.jvm = _jvm_read(spark, config, substream, server, name, read, location, earliest)
    handler._sink()  # the driver's SOURCE registers before any task writes
    return handler


def _jvm_read(
    spark: SparkSession, config: Config, substream: str, server: str, name: str, read: str,
    location: Path, earliest: bool,
) -> JvmRead | None:
    """The JVM read of a query asked to ``read`` in ``jvm`` (None: the Python read), or
    None with a warning where the JVM cannot serve (see :class:`JvmRead` for the rest)."""
    from substreams.spark.session import jvm_read_available, quiet_group_id_warning

    if read not in ("jvm", "python"):
        raise SubstreamsError(f"spark runner: read must be jvm or python, not {read!r}")
    if read == "python":
        return None
    why_not = jvm_unsupported(config, config.substream(substream).stream)
    if why_not is None and not jvm_read_available(spark):
        why_not = ("the session has no Spark Kafka connector and spark-avro (create it with "
                   "substreams.spark.session.session(), or submit with substreams submit)")
    if why_not is not None:
        log.warning("spark runner: query '%s' reads in Python: %s", name, why_not)
        return None
    quiet_group_id_warning(spark)
    return JvmRead(config, substream, server, name, location, earliest)


def starts_earliest(options: Mapping[str, str] | None) -> bool:
    """Whether a query with source ``options`` starts at the control topic's start."""
    return (options or {}).get("starting", "earliest") != "latest"


def _log_start(name: str, substream: str, location: Path) -> None:
    """Count a restart (the checkpoint has commits) and say where the query starts."""
    if (location / "commits").is_dir() and any((location / "commits").iterdir()):
        metrics.RESTARTS.labels("spark", name).inc()  # resumes from its checkpoint
    resumed = (location / "offsets").is_dir()
    log.info(
        "spark runner: query '%s' on substream '%s' starting; checkpoint %s (%s)", name,
        substream, location,
        "exists: Spark resumes from its offsets, a replayed batch's committed work is skipped"
        if resumed else "new: from the control topic's start",
    )


def start_firm_query(
    spark: SparkSession,
    config: Config,
    substream: str,
    server: str,
    name: str,
    location: Path,
    handler: Any,
    *,
    notes_only: bool,
    options: Mapping[str, str] | None,
    once: bool,
    trigger: str,
    block: bool,
) -> EpochQuery:
    """Start the firm ``substreams`` read of ``substream`` into ``handler`` (a
    ``foreachBatch`` function with a ``close``), as :func:`run` and
    :func:`~substreams.spark.frames.run_frames` both do; ``notes_only``: the source hands
    over the epochs' notes and the handler reads their records itself (the JVM read).
    With ``block`` or ``once``, wait for the query to end and release the handler.
    Until the first batch starts, what Spark is doing is logged every
    ``WARM_UP_PROGRESS_S`` (a first batch takes 25-70 s to plan and start on 2 cores)."""
    first = threading.Event()
    reader = (
        spark.readStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config))
        .option("substream", substream)
        .option("mode", "firm")
        .option("markers", "true")
        .option("bootstrap", server)
    )
    if notes_only:
        reader = reader.option("read", "notes")
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.queryName(name.replace(".", "_").replace("-", "_"))
        .option("checkpointLocation", str(location))
        .foreachBatch(_first_batch_seen(handler, first))
    )
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=trigger)
    try:
        query = EpochQuery(writer.start(), handler)
    except BaseException:
        handler.close()
        raise
    _warm_up_progress(query.query, name, first)
    if block or once:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.query.stop()
        finally:
            handler.close()
            log.info("spark runner: query '%s' stopped", name)
    return query


WARM_UP_PROGRESS_S = 5.0
"""How often a query that has not started its first batch says what Spark is doing."""


def _first_batch_seen(
    handler: Callable[[DataFrame, int], None], first: threading.Event
) -> Callable[[DataFrame, int], None]:
    def call(df: DataFrame, batch_id: int) -> None:
        first.set()
        handler(df, batch_id)

    return call


def _warm_up_progress(query: StreamingQuery, name: str, first: threading.Event) -> None:
    """Log, every ``WARM_UP_PROGRESS_S`` until the first batch starts (or the query ends),
    how long it has waited and Spark's own word on it (``query.status``): between
    ``start()`` and the first batch nothing else is printed."""
    began = time.monotonic()

    def watch() -> None:
        while not first.wait(WARM_UP_PROGRESS_S):
            try:
                if not query.isActive:
                    return
                status = query.status.get("message", "")
            except Exception:  # the JVM went away: the query's own error says why
                return
            log.info("spark runner: query '%s': waiting for its first batch (%.0f s; Spark: "
                     "%s)", name, time.monotonic() - began, status)

    log.info("spark runner: query '%s': started; planning its first batch", name)
    threading.Thread(target=watch, name=f"warm-up {name}", daemon=True).start()


def stop(query: EpochQuery | StreamingQuery) -> None:
    """Stop ``query`` (and release its output publisher when it is one of :func:`run`'s)."""
    query.stop()


def stop_handler(query: EpochQuery | StreamingQuery) -> None:
    """Release the output publisher of a stopped (or failed) query of :func:`run`."""
    if isinstance(query, EpochQuery):
        query.handler.close()


__all__ = ["EpochBatchHandler", "EpochQuery", "run", "stop", "stop_handler"]
