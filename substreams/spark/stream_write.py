"""The ``substreams`` streaming sink: ``df.writeStream.format("substreams")``.

    (per_url.writeStream.format("substreams")
        .option("configPickle", ship_config(config))   # or .option("config", path)
        .option("stream", "url_counts").option("queryName", "url-counts")
        .option("checkpointLocation", ck).start())

The same write as :class:`~substreams.spark.write.EpochWriter`, through PySpark's Python
Data Source streaming write API instead of ``foreachBatch``: each task of a micro-batch is
one *unit* (its partition id) writing its rows with its own transactional
:class:`~substreams.spark.executor.UnitWriter` (results and the unit's marker in one
transaction; a replay whose marker is at or past the batch writes nothing), and returns the
summaries of the epochs it saw as its commit message.  Spark calls :meth:`commit` on the
driver only once every task committed; it seals the batch's epochs with the batch marker
in one transaction (:class:`~substreams.spark.sink.BatchSink`), or nothing if that marker
is already there (a batch replayed after a restart from the checkpoint).

A task learns its batch id from the local property ``streaming.sql.batchId`` that Spark's
MicroBatchExecution sets on the batch's jobs (the same id :meth:`commit` receives).

The driver's side runs in a Python worker that Spark starts (and reuses) for the commit,
not in the process that started the query, so the BatchSink is kept per worker process
(:func:`_sink`) and never closed: closing would unregister the query's source from the
acker, which could then terminate the units' output times without the driver's seal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.spark import options as source_options
from substreams.spark.executor import check_output
from substreams.spark.operator import Summary
from substreams.spark.sink import BatchSink, ensure_commit_topic
from substreams.spark.write import batch_notes, missing_note_columns, write_unit

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _config(options: Mapping[str, str]) -> Config:
    try:
        return source_options._config(options)
    except SubstreamsError as exc:  # the reader's wording, said of the sink
        raise SubstreamsError(str(exc).replace("substreams source:", "substreams sink:")) from exc


@dataclass(frozen=True)
class SinkOptions:
    """Everything a sink task and its commit need, as picklable values (the validated
    config travels with the writer, as with the reader)."""

    config: Config
    stream: str
    name: str
    bootstrap: str
    key_field: str | None = None

    @property
    def source_id(self) -> str:
        """The query's source id of the output (the same for every restart: it fences)."""
        return f"spark.{self.name}"

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType, overwrite: bool) -> SinkOptions:
        config = _config(options)
        stream = options.get("stream")
        if not stream:
            raise SubstreamsError("substreams sink: option 'stream' (the output stream) is "
                                  "required")
        if stream not in {s.name for s in config.streams}:
            raise SubstreamsError(
                f"substreams sink: option 'stream' names no stream of the config: {stream!r} "
                f"(streams: {', '.join(s.name for s in config.streams)})"
            )
        check_output(config, stream)
        name = options.get("queryName") or options.get("name")
        if not name:
            raise SubstreamsError(
                "substreams sink: option 'queryName' (or 'name') is required: it names the "
                "writer across restarts (its transactional ids and markers derive from it)"
            )
        if not _NAME.match(name):
            raise SubstreamsError(
                f"substreams sink: option 'queryName' must be letters, digits, '.', '_' or "
                f"'-', not {name!r}"
            )
        if overwrite:
            raise SubstreamsError(
                "substreams sink: output mode 'complete' rewrites every result each batch; "
                "use append or update (each epoch's results once)"
            )
        columns = list(schema.fieldNames())
        missing = missing_note_columns(columns)
        if missing:
            raise SubstreamsError(
                f"substreams sink: the DataFrame has no column {', '.join(map(repr, missing))}"
                " (keep the read's notification columns control_offset, control_index and "
                "epoch on every row)"
            )
        fields = config.stream(stream).schema.get("fields", ())
        lacking = [str(f["name"]) for f in fields
                   if f["name"] not in columns and "default" not in f]
        if lacking:
            raise SubstreamsError(
                f"substreams sink: stream '{stream}' needs field(s) {', '.join(lacking)} "
                f"the DataFrame lacks (its columns: {', '.join(columns)})"
            )
        key_field = options.get("keyField") or None
        if key_field is not None and key_field not in columns:
            raise SubstreamsError(
                f"substreams sink: option 'keyField' names no column of the DataFrame: "
                f"{key_field!r}"
            )
        return SinkOptions(
            config=config,
            stream=stream,
            name=name,
            bootstrap=client.resolve_bootstrap(config, options.get("bootstrap")),
            key_field=key_field,
        )


class UnitSummaries(WriterCommitMessage):  # type: ignore[misc]
    """A task's commit message: one summary per epoch it saw."""

    def __init__(self, unit: int, batch_id: int, summaries: Sequence[Summary]) -> None:
        self.unit = unit
        self.batch_id = batch_id
        self.summaries = list(summaries)


# Process-wide: Spark reuses this Python worker across batches; the sink (its transactional
# producer, fenced by a new one) lives as long as the worker, not as one batch's call.
_SINKS: dict[tuple[str, str, str], BatchSink] = {}


def _sink(opts: SinkOptions, fresh: bool = False) -> BatchSink:
    """The query's BatchSink in this (reused) commit worker; ``fresh``: a new one, whose
    start fences the old and re-reads the last committed batch marker."""
    key = (opts.source_id, opts.stream, opts.bootstrap)
    sink = _SINKS.get(key)
    if sink is None or fresh:
        sink = BatchSink(opts.config, opts.stream, opts.source_id, opts.bootstrap)
        _SINKS[key] = sink
    return sink


def close_sinks() -> None:
    """Close this process's BatchSinks (unregistering their sources): for a process that
    commits no more batches of any query, e.g. a test that called :meth:`commit` itself."""
    while _SINKS:
        _SINKS.popitem()[1].close()


def _task_batch_id() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    raw = None if ctx is None else ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if ctx is None or raw is None:
        raise SubstreamsError(
            f"substreams sink: no '{BATCH_ID_PROPERTY}' in the task's context (the sink "
            "writes streaming micro-batches only)"
        )
    return int(raw), ctx.partitionId()


class SubstreamsStreamWriter(DataSourceStreamWriter):  # type: ignore[misc]
    """Executors: :meth:`write` (one unit per task); driver: :meth:`commit` (the seals)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> UnitSummaries:
        batch_id, unit = _task_batch_id()
        o = self.opts
        rows = (r.asDict(recursive=True) for r in iterator)
        sums = write_unit(o.config, o.stream, o.source_id, o.bootstrap, batch_id, None, unit,
                          rows, o.key_field)
        return UnitSummaries(unit, batch_id, sums)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sums: list[Summary] = []
        for m in messages:
            if not isinstance(m, UnitSummaries) or m.batch_id != batchId:
                raise SubstreamsError(
                    f"substreams sink: batch {batchId}: a task's commit message is {m!r}, "
                    "not its summaries of this batch"
                )
            sums.extend(m.summaries)
        try:
            self._seal(_sink(self.opts), sums, batchId)
        except Exception:
            # A fenced or broken producer (another worker took over the source id): a new
            # one fences it and re-reads the marker, so sealing again cannot seal twice.
            log.exception("sink '%s': batch %d: sealing failed; retrying with a new "
                          "producer", self.opts.source_id, batchId)
            self._seal(_sink(self.opts, fresh=True), sums, batchId)

    def _seal(self, sink: BatchSink, sums: list[Summary], batch_id: int) -> None:
        notes = batch_notes(sums, batch_id <= sink.committed)
        written = sink.seal(batch_id, [{s: n.time for s in sink.output_substreams}
                                       for n in notes])
        log.info("sink '%s': batch %d: %s %d epoch(s) (%d results)", sink.source_id, batch_id,
                 "sealed" if written else "a replay of a sealed batch:", len(notes),
                 sum(n.results for n in notes))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The units that committed keep their markers: the batch's replay skips them.
        done = sum(1 for m in messages if m is not None)
        log.warning("sink '%s': batch %d aborted (%d of %d tasks had committed); it is "
                    "sealed when the query replays it", self.opts.source_id, batchId, done,
                    len(messages))


def stream_writer(options: Mapping[str, str], schema: StructType, overwrite: bool
                  ) -> SubstreamsStreamWriter:
    """What :meth:`SubstreamsDataSource.streamWriter` returns (options checked first).

    Spark calls it on the driver when the query starts, before any task: the commit topic
    the units' markers go to must exist by then (idempotent; also run before each commit)."""
    opts = SinkOptions.parse(options, schema, overwrite)
    ensure_commit_topic(opts.config, opts.stream, opts.bootstrap)
    return SubstreamsStreamWriter(opts)


__all__ = [
    "SinkOptions", "SubstreamsStreamWriter", "UnitSummaries", "close_sinks", "stream_writer",
]
