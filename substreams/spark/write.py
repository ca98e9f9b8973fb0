"""The DataFrame write matching the firm read: a transformed micro-batch to an output stream,
exactly once, with each output epoch sealed after every task's rows are committed.

    source = spark.readStream.format("substreams").option("substream", "clicks_1s")...load()
    per_url = source.where(~F.col("is_notification") | True)...   # ordinary Spark operations
    writer = EpochWriter(config, "url_counts", name="url-counts")
    query = per_url.writeStream.foreachBatch(writer).option("checkpointLocation", ck).start()

The batch DataFrame must keep the notification columns of the read (``control_offset``,
``control_index``, ``epoch``) on every row; rows with ``is_notification`` true (the read's
notification rows, kept through the transformation) are not published but make their epoch
sealed even when it produced no row.  The other columns named like the output stream's
fields are published.  Each Spark task writes its share with its own transactional writer and
marker (:class:`~substreams.spark.executor.UnitWriter`, the same as ``run``'s); the driver
seals the epochs of the batch once the write action returned, i.e. once every task committed.
The streaming sink (``writeStream.format("substreams")``, :mod:`substreams.spark.stream_write`)
runs the same :func:`write_unit` in its tasks and :func:`batch_notes` in its commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from pyspark.sql import DataFrame

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.spark.epochs import format_time, struct_time
from substreams.spark.executor import SUMMARY_FIELDS, UnitWriter, check_output
from substreams.spark.operator import EpochNote, Row, Summary, notifications
from substreams.spark.sink import BatchSink

log = logging.getLogger(__name__)

OutputTimes = Callable[[Time, Sequence[str]], Mapping[str, Time]]


def _same_time(epoch: Time, substreams: Sequence[str]) -> Mapping[str, Time]:
    return {name: epoch for name in substreams}


NOTE_COLUMNS = ("control_offset", "control_index", "epoch")
"""The read's notification columns every written row must keep (an epoch's identity)."""


def missing_note_columns(columns: Sequence[str]) -> list[str]:
    return [c for c in NOTE_COLUMNS if c not in columns]


def _row_digest(values: Mapping[str, Any], key: str | None) -> int:
    data = json.dumps([key, values], sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def write_unit(
    config: Config, stream: str, driver_source: str, bootstrap: str, batch_id: int,
    units: int | None, unit: int, rows: Iterable[Row], key_field: str | None,
) -> list[Summary]:
    """One write task (of :class:`EpochWriter` or of the streaming sink): publish its rows
    once, summarise its epochs.

    The unit's marker records what it wrote (row count and an order-independent digest,
    and ``units`` when the caller knows the task count): a replay that finds the marker at
    its batch but other rows (the partitioning changed between attempts) fails instead of
    writing them twice or losing them."""
    fields = [str(f["name"]) for f in config.stream(stream).schema.get("fields", ())]
    per: dict[tuple[int, int], dict[str, Any]] = {}
    writer: UnitWriter | None = None
    skip: dict[str, Any] | None = None  # the marker's metadata when the batch was written
    count, digest = 0, 0
    try:
        for row in rows:
            ident = (int(row["control_offset"]), int(row["control_index"] or 0))
            entry = per.setdefault(
                ident, {"label": format_time(struct_time(row["epoch"])), "mark": False, "n": 0}
            )
            if row.get("is_notification"):
                entry["mark"] = True
                continue
            if writer is None and skip is None:
                writer = UnitWriter(config, stream, driver_source, unit, bootstrap)
                done, meta = writer.committed()
                if done >= batch_id:
                    skip = meta if done == batch_id else {}
                    log.warning("unit %s: batch %d already committed (marker %d): skipped",
                                writer.source_id, batch_id, done)
                    writer.close()
                    writer = None
            entry["n"] += 1
            values = {f: row.get(f) for f in fields}
            count += 1
            digest = (digest + _row_digest(values, None if key_field is None
                                           else str(row.get(key_field)))) % (1 << 64)
            if writer is not None:
                writer.write([values], key_field, check_order=False)
        if skip:
            _check_replay(skip, batch_id, unit, units, count, digest)
        if writer is not None:
            meta = {"batch": batch_id, "rows": count, "digest": f"{digest:016x}"}
            if units is not None:
                meta["units"] = units
            writer.commit(batch_id, meta)
            log.info("unit %s: batch %d committed (%d results)", writer.source_id, batch_id,
                     count)
            writer.close()
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return [
        Summary(i[0], i[1], e["label"], e["mark"], 0, 0, e["n"], unit, skip is None)
        for i, e in per.items()
    ]


def _check_replay(meta: Mapping[str, Any], batch_id: int, unit: int, units: int | None,
                  count: int, digest: int) -> None:
    """A replayed unit must hold what its committed attempt wrote (module doc)."""
    if units is not None and meta.get("units") not in (None, units):
        raise SubstreamsError(
            f"unit {unit} of batch {batch_id} was committed with {meta.get('units')} units, "
            f"the replay has {units}: the partitioning changed, so exactly-once cannot be "
            "kept (keep the number of write tasks across restarts of a query)"
        )
    recorded = (meta.get("rows"), meta.get("digest"))
    if recorded != (None, None) and recorded != (count, f"{digest:016x}"):
        raise SubstreamsError(
            f"unit {unit} of batch {batch_id} committed {meta.get('rows')} rows (digest "
            f"{meta.get('digest')}); the replay gives it {count} rows (digest {digest:016x}): "
            "the rows of a write task changed between attempts (a non-deterministic "
            "partitioning or transformation), so exactly-once cannot be kept"
        )


class EpochWriter:
    """A ``foreachBatch`` function writing each batch exactly once (module doc).

    ``name`` identifies the writer across restarts (like a query name: the driver's source
    id is ``spark.<name>``).  ``output_times`` maps an input epoch to the times to seal in
    the output's substreams (default: the same time).  ``on_notification`` is called on the
    driver once per epoch of the batch, in notification order, after its seal.  ``units``
    (default: ``spark.sql.shuffle.partitions``) is the number of write tasks per batch: keep
    it across restarts (a replay that finds another count fails rather than duplicate)."""

    def __init__(
        self,
        config: Config,
        stream: str,
        *,
        name: str,
        bootstrap: str | None = None,
        key_field: str | None = None,
        output_times: OutputTimes = _same_time,
        on_notification: Callable[[EpochNote], None] | None = None,
        units: int | None = None,
    ) -> None:
        config.stream(stream)
        check_output(config, stream)
        self.config = config
        self.stream = stream
        self.source_id = f"spark.{name}"
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.key_field = key_field
        self.output_times = output_times
        self.on_notification = on_notification
        self.units = units
        self.sink = BatchSink(config, stream, self.source_id, self.bootstrap)

    def __call__(self, df: DataFrame, batch_id: int) -> list[EpochNote]:
        for col in missing_note_columns(df.columns):
            raise SubstreamsError(
                f"EpochWriter: the DataFrame has no column '{col}' (keep the read's "
                "notification columns on every row)"
            )
        sink = self.sink
        sealed = batch_id <= sink.committed
        units = self.units or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1)
        sums: list[Summary] = []
        if not sealed:
            task = _write_task(
                self.config, self.stream, self.source_id, self.bootstrap, batch_id, units,
                self.key_field,
            )
            ddl = ", ".join(f"{n} {k}" for n, k in SUMMARY_FIELDS)
            part = df.repartition(units, "control_offset", "control_index").sortWithinPartitions(
                "control_offset", "control_index"
            )
            sums = [Summary(**r.asDict()) for r in part.mapInArrow(task, ddl).collect()]
        notes = batch_notes(sums, sealed)
        sink.seal(batch_id, [self.output_times(n.time, sink.output_substreams) for n in notes])
        if self.on_notification is not None:
            for note in notes:
                self.on_notification(note)
        return notes

    def close(self) -> None:
        self.sink.close()


def batch_notes(sums: Sequence[Summary], replayed: bool) -> list[EpochNote]:
    """Every epoch some task saw (rows or its notification row), in order."""
    marks = {(s.control_offset, s.control_index): s for s in sums}
    full = [
        Summary(s.control_offset, s.control_index, s.epoch_label, True, 0, 0, 0, -1, False)
        for s in marks.values()
    ]
    flat = [Summary(**{**asdict(s), "is_notification": False}) for s in sums]
    return notifications(flat + full, int(time.time() * 1000), replayed)


def _write_task(
    config: Config, stream: str, driver_source: str, bootstrap: str, batch_id: int,
    units: int, key_field: str | None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        unit = ctx.partitionId() if ctx is not None else 0
        rows = (row for b in batches for row in b.to_pylist())
        sums = write_unit(config, stream, driver_source, bootstrap, batch_id, units, unit,
                          rows, key_field)
        arrow = {"long": pa.int64(), "int": pa.int32(), "string": pa.string(),
                 "boolean": pa.bool_()}
        schema = pa.schema([(n, arrow[k]) for n, k in SUMMARY_FIELDS])
        if sums:
            yield pa.RecordBatch.from_pylist([asdict(s) for s in sums], schema=schema)

    return task


__all__ = ["EpochWriter", "batch_notes", "missing_note_columns", "write_unit"]
