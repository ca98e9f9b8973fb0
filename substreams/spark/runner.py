"""``run(operator, ...)``: a firm-bound streaming query that calls an :class:`EpochOperator`.

The query reads the ``substreams`` source in firm mode with one notification row per epoch
(so an epoch without records is still delivered), and ``foreachBatch`` turns each
micro-batch into ``on_epoch`` calls in notification order; results go to the output stream
through :class:`~substreams.spark.sink.BatchSink` (exactly once, see there), after which the
epoch is sealed on the output stream so that a downstream job sees it complete.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from substreams import metrics
from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.spark.operator import EpochInfo, EpochOperator, Row, group_epochs
from substreams.spark.options import CONFIG_PICKLE, ship_config
from substreams.spark.sink import BatchSink

log = logging.getLogger(__name__)


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
        self._last_batch = -1

    def _sink(self) -> BatchSink | None:
        if self.output_stream is not None and self.sink is None:
            if self.config is None:
                raise SubstreamsError("EpochBatchHandler: an output stream needs a config")
            self.sink = BatchSink(self.config, self.output_stream, self.source_id, self.bootstrap)
        return self.sink

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        epochs = group_epochs(r.asDict() for r in df.collect())
        self.handle(batch_id, epochs)

    def handle(self, batch_id: int, epochs: list[EpochInfo]) -> None:
        op = self.operator
        log.info(
            "batch %d: %d epochs%s", batch_id, len(epochs),
            f" ({epochs[0].time!r} .. {epochs[-1].time!r})" if epochs else "",
        )
        sink = self._sink()
        if batch_id <= self._last_batch:  # Spark replays a batch it had not committed
            metrics.REWINDS.labels("spark", self.query_name).inc()
        self._last_batch = max(self._last_batch, batch_id)
        handled = metrics.EPOCHS_HANDLED.labels(self.query_name, self.substream)
        latency = metrics.EPOCH_LATENCY.labels(self.query_name, self.substream)
        results: list[tuple[Row, str | None]] = []
        per_epoch: list[list[Row]] = []
        seals: list[Mapping[str, Time]] = []
        for info in epochs:
            out: list[Row] = []
            for row in info.rows:
                out += list(op.on_record(row) or ())
            info.notified_at_ms = int(time.time() * 1000)
            out += list(op.on_epoch(info.time, info.rows))
            handled.inc()
            if info.sealed_at_ms > 0:
                latency.observe(max(0.0, (info.notified_at_ms - info.sealed_at_ms) / 1000.0))
            per_epoch.append(out)
            key_field = op.key_field
            results += [(r, None if key_field is None else str(r[key_field])) for r in out]
            if sink is not None:
                seals.append(op.output_times(info.time, sink.output_substreams))
        if sink is not None:
            sink.write(batch_id, results, seals)
        for info, out in zip(epochs, per_epoch, strict=True):
            op.after_commit(info, out)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None


def run(
    operator: EpochOperator,
    config: Config | str | Path,
    substream: str,
    output_stream: str | None = None,
    *,
    checkpoint: str | Path | None = None,
    trigger: str = "100 milliseconds",
    once: bool = False,
    spark: SparkSession | None = None,
    bootstrap: str | None = None,
    query_name: str | None = None,
    block: bool = True,
    options: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
) -> StreamingQuery:
    """Run ``operator`` over the completed epochs of ``substream``.

    ``config`` is a loaded :class:`Config` or the path of ``substreams.yaml`` (loaded and
    validated here, once): the Config object itself travels to the source's tasks, so they
    never read the file.
    ``checkpoint`` (default ``<config dir>/.checkpoints/<query name>``) and ``query_name``
    must stay the same across restarts: they identify the query to Spark and to the output
    sink.  ``once`` processes what is complete now and stops.  With ``block`` the call
    waits for the query to end (Ctrl-C stops it); otherwise it returns the running query.
    ``metrics_port`` serves Prometheus metrics on ``127.0.0.1:<port>/metrics``.
    """
    from substreams.spark.session import register, session

    if not isinstance(config, Config):
        config = load_config(config)
    config.substream(substream)
    if output_stream is not None:
        config.stream(output_stream)
    server = client.resolve_bootstrap(config, bootstrap)
    name = query_name or f"{type(operator).__name__}.{substream}"
    location = Path(checkpoint) if checkpoint else config.path.parent / ".checkpoints" / name
    spark = register(spark) if spark is not None else session(f"substreams:{name}")
    handler = EpochBatchHandler(operator, config, output_stream, f"spark.{name}", server)
    handler.substream, handler.query_name = substream, name
    if metrics_port is not None:
        metrics.serve(metrics_port)
    if (location / "commits").is_dir() and any((location / "commits").iterdir()):
        metrics.RESTARTS.labels("spark", name).inc()  # resumes from its checkpoint
    reader = (
        spark.readStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config))
        .option("substream", substream)
        .option("mode", "firm")
        .option("markers", "true")
        .option("bootstrap", server)
    )
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.queryName(name.replace(".", "_").replace("-", "_"))
        .option("checkpointLocation", str(location))
        .foreachBatch(handler)
    )
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=trigger)
    resumed = (location / "offsets").is_dir()
    log.info(
        "spark runner: query '%s' on substream '%s' starting; checkpoint %s (%s)", name,
        substream, location,
        "exists: Spark resumes from its offsets, a batch it replays is skipped by the sink"
        if resumed else "new: from the control topic's start",
    )
    query = writer.start()
    _HANDLERS[query.id] = handler
    if block or once:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        finally:
            stop_handler(query)
            log.info("spark runner: query '%s' stopped", name)
    return query


_HANDLERS: dict[str, EpochBatchHandler] = {}


def stop_handler(query: StreamingQuery) -> None:
    """Release the output publisher of a stopped query (so a new one can acquire it)."""
    handler = _HANDLERS.pop(query.id, None)
    if handler is not None:
        handler.close()


def stop(query: StreamingQuery) -> None:
    """Stop ``query`` and release its publisher."""
    query.stop()
    stop_handler(query)


__all__ = ["EpochBatchHandler", "run", "stop"]
