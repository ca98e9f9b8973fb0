"""The ``substreams`` Spark streaming source (PySpark's Python Data Source API).

Firm mode: a micro-batch is a range of the substream's control topic; it holds exactly the
records of the epochs whose EpochComplete lies in that range, read from the data offsets the
EpochComplete names, epoch after epoch in notification order.  Records of epochs still open
stay in Kafka until a later batch completes them: nothing is emitted early and nothing lost.
Soft mode: records as they arrive (data offsets) plus one notification row per EpochComplete.

Planning (``latestOffset``/``partitions``) runs in one long-lived Python process on the
driver; ``read`` runs in executor workers on a pickled copy of the reader, so everything a
task needs travels in its :class:`InputPartition` and Kafka clients are opened inside
``read`` only.
"""

from __future__ import annotations

import logging
import time as _time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructField, StructType

from substreams.control.messages import OffsetRange, merge_ranges
from substreams.control.ranges import EpochIndex, read_ranges
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.spark.epochs import epoch_int, epoch_key, epoch_struct, format_time
from substreams.spark.limits import ReadLimits, batch_end
from substreams.spark.log import worker_logging
from substreams.spark.offsets import (
    ControlScanner,
    DataScanner,
    Notification,
    SourceOffset,
)
from substreams.spark.options import SourceOptions
from substreams.spark.schema import PayloadLayout, row
from substreams.streams.badrecords import BadRecords
from substreams.streams.records import Entry

SOURCE_NAME = "substreams"
NOTE_COLUMN = "note"
"""With option ``read=notes``: the column (JSON) holding a notification's data ranges
(``[[stream, partition, start, end], ...]``) and ``until`` (a session's last time, the Avro
``Time`` as a dict, or null)."""
ARROW_BATCH_ROWS = 10_000
"""Rows per Arrow batch a firm read task yields (Spark's default
``spark.sql.execution.arrow.maxRecordsPerBatch``)."""

log = logging.getLogger(__name__)


class EpochsPartition(InputPartition):  # type: ignore[misc]
    """Firm mode: consecutive notifications, read together (one consumer per task)."""

    def __init__(self, notes: Sequence[Notification]) -> None:
        super().__init__(tuple(n.ident for n in notes))
        self.notes = tuple(notes)


class DataPartition(InputPartition):  # type: ignore[misc]
    """Soft mode: data offsets [start, end) of one partition."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition, self.start, self.end = partition, start, end


class NotesPartition(InputPartition):  # type: ignore[misc]
    """Soft mode: the notification rows of the batch."""

    def __init__(self, notes: Sequence[Notification]) -> None:
        super().__init__(tuple(n.ident for n in notes))
        self.notes = tuple(notes)


def _epoch_meta(t: Time) -> tuple[Any, str, int | None, str | None]:
    return epoch_struct(t), format_time(t), epoch_int(t), epoch_key(t)


def _record_meta(t: Time, e: Entry, note: Notification | None) -> tuple[Any, ...]:
    return (
        *_epoch_meta(t),
        e.order_key,
        e.partition,
        e.index,
        None if note is None else note.control_offset,
        None if note is None else note.index,
        None if note is None else note.sealed_at_ms,
        None,
        False,
    )


def _marker_meta(n: Notification) -> tuple[Any, ...]:
    return (
        *_epoch_meta(n.time),
        None,
        None,
        None,
        n.control_offset,
        n.index,
        n.sealed_at_ms,
        n.records,
        True,
    )


def note_json(n: Notification) -> str:
    """The :data:`NOTE_COLUMN` value of ``n``."""
    import json

    from substreams.frontier import time_to_wire

    return json.dumps({
        "ranges": [[r.stream, r.partition, r.start, r.end] for r in n.ranges],
        "until": None if n.until is None else time_to_wire(n.until),
    })


def note_row(layout: PayloadLayout, n: Notification) -> tuple[Any, ...]:
    """The row option ``read=notes`` gives for ``n``: its notification row, then
    :data:`NOTE_COLUMN`."""
    return (*row(layout, None, _marker_meta(n)), note_json(n))


def epoch_batch(
    layout: PayloadLayout,
    schema: Any,
    note: Notification,
    entries: Sequence[Entry],
    marker: bool,
) -> Any:
    """One epoch's rows as one ``pyarrow.RecordBatch`` of ``schema`` (the source's Arrow
    schema): its records in the given order, then its notification row if ``marker`` --
    the same values as the per-row path (:func:`row` of :func:`_record_meta` /
    :func:`_marker_meta`).

    Why columnar: PySpark converts a data source's row tuples to Arrow value by value in
    Python (a converter call per cell, ~16 cells a row); a ``RecordBatch`` goes to the JVM
    as it is, and the per-epoch metadata is one repeated scalar instead of a value per
    row."""
    import pyarrow as pa

    n = len(entries)
    total = n + (1 if marker else 0)
    pad: list[Any] = [None] if marker else []
    fields = list(schema)
    cols: list[Any] = [
        pa.array(col + pad, type=f.type)
        for f, col in zip(fields, layout.columns([e.payload for e in entries]), strict=False)
    ]
    key, coords, kind = epoch_struct(note.time)

    def const(name: str, value: Any) -> Any:
        return pa.repeat(pa.scalar(value, type=schema.field(name).type), total)

    def column(name: str, values: list[Any]) -> Any:
        return pa.array(values, type=schema.field(name).type)

    cols += [
        const("epoch", {"key": key, "coords": coords, "kind": kind}),
        const("epoch_label", format_time(note.time)),
        const("epoch_int", epoch_int(note.time)),
        const("epoch_key", epoch_key(note.time)),
        column("order_key", [e.order_key for e in entries] + pad),
        column("partition", [e.partition for e in entries] + pad),
        column("offset", [e.index for e in entries] + pad),
        const("control_offset", note.control_offset),
        const("control_index", note.index),
        const("sealed_at_ms", note.sealed_at_ms),
        column("records", [None] * n + ([note.records] if marker else [])),
        column("is_notification", [False] * n + ([True] if marker else [])),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def arrow_schema(layout: PayloadLayout) -> Any:
    """The Arrow schema PySpark expects of a ``RecordBatch`` from :meth:`read` (it checks
    equality, nullability included)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(layout.struct(), timezone="UTC")


def _chunks(notes: list[Notification], tasks: int) -> list[list[Notification]]:
    """Contiguous groups of about equal record counts (order across tasks is restored by
    ``control_offset``; contiguity keeps each task's Kafka read compact)."""
    if not notes:
        return []
    tasks = max(1, min(tasks, len(notes)))
    total = sum(max(n.records, 1) for n in notes)
    out: list[list[Notification]] = [[]]
    acc = 0
    for n in notes:
        if out[-1] and acc >= total * len(out) / tasks and len(out) < tasks:
            out.append([])
        out[-1].append(n)
        acc += max(n.records, 1)
    return out


class SubstreamsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets, planning and reading of one query's source.

    Read limits (firm mode): ``maxEpochsPerTrigger`` / ``maxRecordsPerTrigger`` bound a
    batch in whole epochs (:mod:`substreams.spark.limits`).  Spark asks
    :meth:`getDefaultReadLimit` once and passes that limit to :meth:`latestOffset` under a
    processing-time or availableNow trigger, and ``ReadAllAvailable`` when a trigger must
    read everything (``Trigger.Once``): then the options are ignored, as Spark requires."""

    def __init__(self, opts: SourceOptions, layout: PayloadLayout) -> None:
        worker_logging()  # the planner's Python process (the driver side)
        self.opts = opts
        self.layout = layout
        self.control = ControlScanner(
            opts.bootstrap, opts.control_topic, opts.substream, opts.config
        )
        self.data = (
            DataScanner(opts.bootstrap, opts.stream, opts.partitions, opts.config)
            if opts.mode == "soft"
            else None
        )
        self._freeze = False
        self._target: SourceOffset | None = None
        self._available: SourceOffset | None = None
        self.limits = ReadLimits(opts.max_epochs, opts.max_records)

    # -- planning (driver) ----------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        zero = {p: 0 for p in range(self.opts.partitions)} if self.data is not None else None
        start = SourceOffset(0, zero)
        if self.opts.starting == "latest":
            return self._latest(start).to_json()
        return start.to_json()

    def _latest(self, start: SourceOffset) -> SourceOffset:
        control = self.control.latest(start.control)
        if self.data is None:
            return SourceOffset(control)
        ends = self.data.ends(start.data or {})
        # Every record of a notified epoch belongs in this batch or an earlier one.
        for n in self.control.between(start.control, control):
            for r in n.ranges:
                if r.stream == self.opts.stream:
                    ends[r.partition] = max(ends.get(r.partition, 0), r.end)
        return SourceOffset(control, ends)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The limit Spark hands back to :meth:`latestOffset` on every trigger but Once.

        PySpark knows only its built-in ReadLimit types (it rebuilds them by name in the
        planner process), so the limits are carried as ``ReadMaxRows`` (records) or, with
        only an epoch limit, ``ReadMaxFiles`` (epochs: the indivisible unit of a firm batch,
        as a file is of a file source).  Either way any limit other than
        ``ReadAllAvailable`` means "apply both options"."""
        if self.data is not None or self.limits.unlimited:
            return ReadAllAvailable()
        if self.limits.max_records is not None:
            return ReadMaxRows(self.limits.max_records)
        assert self.limits.max_epochs is not None
        return ReadMaxFiles(self.limits.max_epochs)

    def _limits_for(self, limit: ReadLimit) -> ReadLimits:
        if isinstance(limit, ReadAllAvailable) or self.data is not None:
            return ReadLimits()
        epochs, records = self.limits.max_epochs, self.limits.max_records
        if isinstance(limit, ReadMaxRows):
            records = limit.max_rows if records is None else min(records, limit.max_rows)
        elif isinstance(limit, ReadMaxFiles):
            epochs = limit.max_files if epochs is None else min(epochs, limit.max_files)
        return ReadLimits(epochs, records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        t0 = _time.perf_counter()
        begin = SourceOffset.from_json(start)
        latest = self._latest(begin)
        if latest.control > begin.control and log.isEnabledFor(logging.DEBUG):
            seals = [n.sealed_at_ms for n in self.control.between(begin.control, latest.control)
                     if n.sealed_at_ms > 0]
            log.debug(
                "latestOffset: control %d -> %d in %.0f ms; oldest seal %.0f ms ago",
                begin.control, latest.control, (_time.perf_counter() - t0) * 1000,
                _time.time() * 1000 - min(seals) if seals else -1,
            )
        if self._freeze:
            if self._target is None:
                self._target = latest
            latest = self._target
        self._available = latest
        limits = self._limits_for(limit)
        if self.data is None and not limits.unlimited and latest.control > begin.control:
            notes = self.control.between(begin.control, latest.control)
            latest = SourceOffset(batch_end(begin.control, latest.control, notes, limits))
        if self.data is None:
            # The split into tasks goes into the offset log with the end (SourceOffset.tasks);
            # nothing new: the start itself, so that Spark sees no new data.
            latest = (
                SourceOffset(latest.control, tasks=self.opts.max_tasks)
                if latest.control > begin.control else begin
            )
        return latest.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """What was readable at the last :meth:`latestOffset` (before the read limit cut
        it): Spark shows it as the source's ``latestOffset`` in the query progress, so a
        backlog drained in bounded batches is visible there."""
        return None if self._available is None else self._available.to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._freeze = True

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = SourceOffset.from_json(start), SourceOffset.from_json(end)
        notes = self.control.between(begin.control, finish.control)
        if self.data is None:
            tasks = finish.tasks or self.opts.max_tasks  # the logged split on a replay
            return [EpochsPartition(chunk) for chunk in _chunks(notes, tasks)]
        parts: list[InputPartition] = []
        lo, hi = begin.data or {}, finish.data or {}
        for p in range(self.opts.partitions):
            if hi.get(p, 0) > lo.get(p, 0):
                parts.append(DataPartition(p, lo.get(p, 0), hi[p]))
        if notes:
            parts.append(NotesPartition(notes))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        self.control.forget_before(SourceOffset.from_json(end).control)

    def stop(self) -> None:
        self.control.close()
        if self.data is not None:
            self.data.close()

    # -- reading (executors) --------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Firm partitions yield ``pyarrow.RecordBatch`` es, soft ones row tuples (PySpark
        takes either, decided per partition by the first item)."""
        worker_logging()
        if isinstance(partition, EpochsPartition):
            return self._read_epochs(partition.notes)
        if isinstance(partition, DataPartition):
            return self._read_data(partition)
        if isinstance(partition, NotesPartition):
            return iter([row(self.layout, None, _marker_meta(n)) for n in partition.notes])
        raise SubstreamsError(f"substreams source: unknown partition {partition!r}")

    def _read_epochs(self, notes: Sequence[Notification]) -> Iterator[Any]:
        """One ``RecordBatch`` per epoch (:func:`epoch_batch`), in notification order (row
        tuples with ``arrow`` false); with ``read=notes`` only the notification rows."""
        opts = self.opts
        if opts.read == "notes":
            for n in notes:
                yield note_row(self.layout, n)
            return
        schema = arrow_schema(self.layout)
        index: EpochIndex[int] = EpochIndex()
        for i, n in enumerate(notes):
            index.add(n.time, n.until, i)
        hull = merge_ranges([r for n in notes for r in n.ranges if r.stream == opts.stream])
        by_note: dict[int, list[Entry]] = {}
        t0 = _time.perf_counter()
        # undecodable records dead-lettered (delivered before the task returns: at least
        # once, docs/design.md "Bad records"), or the task fails under on_bad_record: fail
        bad = BadRecords(opts.config, f"spark.source:{opts.substream}", bootstrap=opts.bootstrap)
        try:
            entries_read = read_ranges(opts.bootstrap, opts.config, hull, bad=bad)
        finally:
            bad.close()
        log.debug("read task: %d epochs, %d records, consumer + read %.0f ms", len(notes),
                  len(entries_read), (_time.perf_counter() - t0) * 1000)
        for e in entries_read:
            t = e.times.get(opts.substream)
            for i in index.get(t) if t is not None else ():
                by_note.setdefault(i, []).append(e)
        for i, n in enumerate(notes):
            entries = sorted(by_note.get(i, ()), key=lambda e: (e.order_key, e.partition, e.index))
            only_ours = all(r.stream == opts.stream for r in n.ranges)
            # an acknowledged record this reader could not decode (dead-lettered) is missing
            unreadable = bad.within(
                (r.stream, r.partition, r.start, r.end) for r in n.ranges
            ) if bad.dead_lettered else 0
            if opts.verify and only_ours and not (
                    n.records - unreadable <= len(entries) <= n.records):
                raise SubstreamsError(
                    f"substream '{opts.substream}' epoch {format_time(n.time)}: the "
                    f"EpochComplete at control offset {n.control_offset} announces "
                    f"{n.records} records but its ranges hold {len(entries)}"
                )
            if not opts.arrow:
                for e in entries:
                    yield row(self.layout, e.payload, _record_meta(n.time, e, n))
                if opts.markers:
                    yield row(self.layout, None, _marker_meta(n))
            elif entries or opts.markers:
                batch = epoch_batch(self.layout, schema, n, entries, opts.markers)
                # Slices (no copy) of PySpark's own Arrow batch size: what the JVM got before.
                for lo in range(0, batch.num_rows, ARROW_BATCH_ROWS):
                    yield batch.slice(lo, ARROW_BATCH_ROWS)

    def _read_data(self, part: DataPartition) -> Iterator[tuple[Any, ...]]:
        opts = self.opts
        rng = OffsetRange(opts.stream, part.partition, part.start, part.end)
        bad = BadRecords(opts.config, f"spark.source:{opts.substream}", bootstrap=opts.bootstrap)
        try:
            read = read_ranges(opts.bootstrap, opts.config, [rng], bad=bad)
        finally:
            bad.close()
        for e in read:
            t = e.times.get(opts.substream)
            if t is None:
                continue
            yield row(self.layout, e.payload, _record_meta(t, e, None))


class SubstreamsDataSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("substreams").option("config", ...).option("substream", ...)``
    (or ``.option("configPickle", ship_config(config))`` in place of the path); also the
    sink ``df.writeStream.format("substreams").option("stream", ...)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _layout(self) -> tuple[SourceOptions, PayloadLayout]:
        # Parsed once per instance: schema() and streamReader() may both ask.
        cached: tuple[SourceOptions, PayloadLayout] | None = getattr(self, "_parsed", None)
        if cached is None:
            opts = SourceOptions.parse(self.options)
            cached = opts, PayloadLayout(opts.config.stream(opts.stream))
            self._parsed = cached
        return cached

    def schema(self) -> StructType:
        opts, layout = self._layout()
        if opts.read == "notes":
            return StructType([*layout.struct().fields, StructField(NOTE_COLUMN, StringType())])
        return layout.struct()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts, layout = self._layout()
        return SubstreamsStreamReader(opts, layout)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("substreams")``: :mod:`substreams.spark.stream_write`."""
        from substreams.spark.stream_write import stream_writer

        return stream_writer(self.options, schema, overwrite)
