"""Benchmark 4: Spark, epoch seal -> ``on_epoch`` against a watermark + window query.

One ``local[2]`` session runs two streaming queries over the same input stream:

- ``substreams.spark.run(operator, ...)`` with the default trigger: firm mode, one
  ``on_epoch`` call per completed epoch; the latency of epoch e is the wall-clock moment of
  its ``on_epoch`` minus the moment its seal began (the acker runs as its own process);
- Spark's own way, what a user would pick instead of substreams: Spark's Kafka connector
  (``format("kafka")``, read_committed) on the data topic, the envelopes decoded by
  ``substreams.spark.connector.decode_envelopes`` (``mapInPandas`` with the project's Avro
  codec; punctuations dropped), an event time column, ``withWatermark(..., "0 seconds")``
  and a 1-second tumbling ``window`` count in append mode -- the same per-epoch count
  (epoch e's records carry event times in second e).  Its latency for window e is the
  moment ``foreachBatch`` receives the window's row minus the same seal moment.  A
  watermark only passes window e once a record of a later window arrived, which is the
  structural difference being measured.

The producer paces epochs on the firm query (each epoch is published once the previous one
was delivered, plus ``PAUSE_S``), so both queries see the same input at the same times.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from substreams.bench.harness import (
    BenchContext,
    BenchError,
    BenchResult,
    Column,
    Target,
    command_line,
    ms,
    percentile,
    save_figure,
    titled,
)
from substreams.bench.workload import acker_process, close_all, open_publishers


def _no_results(epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return []

NAME = "spark"
PAUSE_S = 0.2
WAIT_S = 60.0


class _Seen:
    """Wall-clock moments at which each epoch became visible, shared with Spark callbacks
    (``foreachBatch`` runs on the driver, in this process)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.cond = threading.Condition()

    def mark(self, epoch: int) -> None:
        with self.cond:
            self.at.setdefault(epoch, time.time())
            self.cond.notify_all()

    def wait(self, epoch: int, timeout: float, check: Callable[[], None] = lambda: None) -> float:
        """When ``epoch`` was seen; ``check`` runs every half second (it raises when the
        query died, so a failure is reported at once instead of after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while epoch not in self.at:
                check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"bench spark: epoch {epoch} not delivered in {timeout} s")
                self.cond.wait(min(left, 0.5))
            return self.at[epoch]


def _alive(query: Any) -> None:
    """Raise if a streaming query stopped (with the first line of its exception)."""
    if not query.isActive:
        exc = query.exception()
        detail = str(exc).strip().splitlines()[0] if exc is not None else "stopped"
        raise BenchError(f"bench spark: query '{query.name}' terminated: {detail[:300]}")


def _wait_consumed(query: Any, rows: int, timeout: float, check: Callable[[], None]) -> None:
    """Block until ``query``'s finished micro-batches have read ``rows`` input rows."""
    deadline = time.monotonic() + timeout
    while sum(int(p["numInputRows"]) for p in query.recentProgress) < rows:
        check()
        if time.monotonic() > deadline:
            raise BenchError(f"bench spark: '{query.name}' read no {rows} rows in {timeout} s")
        time.sleep(0.1)


def run(ctx: BenchContext) -> BenchResult:
    result = BenchResult(NAME, ctx.quick, command_line(), ctx.broker_label)
    result.columns = [
        Column("query", "query"),
        Column("granularity", "records/epoch"),
        Column("samples", "n"),
        Column("p50_ms", "p50 ms", "{:.0f}"),
        Column("p99_ms", "p99 ms", "{:.0f}"),
    ]
    epochs = 9 if ctx.quick else 41  # the first is a warm-up
    granularity = 100
    error: str | None = None
    try:
        firm, windowed = _measure(ctx, epochs, granularity, notes=result.notes)
    except BenchError as exc:  # reported in the table and the JSON, not swallowed
        error = str(exc)
        firm, windowed = [], []
        result.notes.append(f"the run failed: {error}")
        ctx.log(f"[red]{error}[/]")
    for name, samples in (
        ("substreams on_epoch (firm)", firm),
        ("withWatermark + window", windowed),
    ):
        result.rows.append(
            {
                "query": name,
                "granularity": granularity,
                "samples": len(samples),
                "p50_ms": ms(percentile(samples, 50)) if samples else None,
                "p99_ms": ms(percentile(samples, 99)) if samples else None,
                "error": error,
            }
        )
    result.targets = [
        Target(
            "on_epoch p99 below the watermark query's p99",
            "firm < watermark",
            f"{result.rows[0]['p99_ms']} ms vs {result.rows[1]['p99_ms']} ms",
            False
            if error is not None
            else None
            if not (firm and windowed)
            else result.rows[0]["p99_ms"] < result.rows[1]["p99_ms"],
        )
    ]
    result.notes.append(
        "local[2], default trigger of substreams.spark.run; epoch 0 is a warm-up (query "
        "start) and not counted; the watermark query's window e "
        "can only close after a record of epoch e+1 arrives (the last epoch never closes and "
        "is not counted)."
    )
    return result


def _measure(
    ctx: BenchContext,
    epochs: int,
    granularity: int,
    windowed: bool = True,
    notes: list[str] | None = None,
) -> tuple[list[float], list[float]]:
    from pyspark.sql import functions as F

    from substreams.spark import EpochOperator, run
    from substreams.spark.connector import decode_envelopes, kafka_connector_conf
    from substreams.spark.runner import stop
    from substreams.spark.session import session

    sub = {"name": "ep", "stream": "s0", "kind": "epoch", "field": "batch", "mechanism": "acker"}
    config = ctx.config([("s0", 2)], [sub])
    stream = config.streams[0].name
    substream = config.substreams[0].name
    firm_seen, window_seen = _Seen(), _Seen()

    class Probe(EpochOperator):
        def on_epoch(self, epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return []

        def on_notification(self, note: Any) -> None:  # on the driver, once per epoch
            if isinstance(note.time, int):
                firm_seen.mark(note.time)

        def __reduce__(self) -> Any:  # the executors' copy needs nothing of the driver's
            from substreams.spark.operator import FunctionOperator

            return (FunctionOperator, (_no_results,))

    def on_windows(df: Any, batch_id: int) -> None:
        for row in df.collect():
            window_seen.mark(int(row["window"].start.timestamp()))

    # Before the session: Spark's Kafka connector must be in spark.jars.packages when the
    # JVM starts (fetched into ~/.m2 by Maven once; Ivy resolves it from there).
    connector: dict[str, str] = kafka_connector_conf(progress=ctx.log) if windowed else {}
    if connector and notes is not None:
        notes.append(
            "the watermark query reads the data topic with Spark's Kafka connector "
            f"({connector['spark.jars.packages']}, read_committed)"
        )
    acker = contextlib.ExitStack()
    acker.enter_context(acker_process(config, ctx.bootstrap))
    ctx.log("starting Spark local[2] ...")
    spark = session("substreams-bench", master="local[2]", shuffle_partitions=4, **connector)
    queries: list[Any] = []
    t0s: dict[int, float] = {}
    try:
        queries.append(
            run(
                Probe(),
                config.path,
                substream,
                spark=spark,
                bootstrap=ctx.bootstrap,
                block=False,
                checkpoint=ctx.workdir / "ckpt-firm",
            )
        )
        # The baseline reads Kafka as a user without substreams would: Spark's connector.  The
        # envelope is Avro framed by substreams: decode_envelopes runs the project's own codec
        # in mapInPandas rather than from_avro (no second JVM package, the writer fingerprint
        # checked, punctuations told from data).
        soft = (
            None
            if not windowed
            else (
                decode_envelopes(
                    spark.readStream.format("kafka")
                    .option("kafka.bootstrap.servers", ctx.bootstrap)
                    .option("subscribe", stream)
                    .option("startingOffsets", "earliest")
                    .option("includeHeaders", "true")
                    # Publishers write in transactions: see only committed records, as the
                    # substreams side does.
                    .option("kafka.isolation.level", "read_committed")
                    .load(),
                    config.stream(stream),
                )
                .withColumn("event_time", (F.col("ts") / 1000).cast("timestamp"))
                .withWatermark("event_time", "0 seconds")
                .groupBy(F.window("event_time", "1 second"))
                .count()
            )
        )
        if soft is not None:
            queries.append(
                soft.writeStream.outputMode("append")
                .option("checkpointLocation", str(ctx.workdir / "ckpt-window"))
                .foreachBatch(on_windows)
                .start()
            )

        def check() -> None:
            for q in queries:
                _alive(q)

        (pub,) = open_publishers(config, stream, ["src0"], ctx.bootstrap)
        try:
            # Not ctx.track(): it deletes the configuration's topics after every item, which
            # here would pull the data and control topics from under the running queries.
            for epoch in range(epochs + 1):
                for r in range(granularity):
                    pub.publish({"ts": epoch * 1000 + r, "batch": epoch, "body": "x" * 100})
                pub.flush()
                t0s[epoch] = time.time()
                pub.seal(substream, epoch)
                firm_seen.wait(epoch, WAIT_S, check)
                if epoch == 0 and windowed:
                    # The warm-up covers both queries' start: the watermark query's first
                    # batches (Kafka consumer, Python workers, state store) take seconds,
                    # and a backlog left from them would be counted against every epoch.
                    _wait_consumed(queries[1], granularity, WAIT_S, check)
                time.sleep(PAUSE_S)
            # the last window closes only on a later record: one more, in a later second
            pub.publish({"ts": (epochs + 2) * 1000, "batch": epochs + 2, "body": ""})
            pub.flush()
            if windowed:
                with contextlib.suppress(BenchError):
                    window_seen.wait(epochs, WAIT_S, lambda: _alive(queries[1]))
        finally:
            close_all([pub])
            del pub
    finally:
        for q in queries:
            with contextlib.suppress(Exception):
                stop(q)
        acker.close()
    # epoch 0 is the warm-up: it waits for both queries' first micro-batches
    firm = [firm_seen.at[e] - t0s[e] for e in range(1, epochs) if e in firm_seen.at]
    window = [window_seen.at[e] - t0s[e] for e in range(1, epochs) if e in window_seen.at]
    return firm, window


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    rows: Sequence[dict[str, Any]] = result.rows
    if rows:
        names = [r["query"] for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["p50_ms"] or 0 for r in rows], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [r["p99_ms"] or 0 for r in rows], 0.4, label="p99")
        ax.set_xticks(list(x), names, fontsize=8)
        ax.set_ylabel("seal → result visible (ms)")
        ax.legend()
    else:
        ax.text(
            0.5,
            0.5,
            "\n".join(result.notes) or "no data",
            ha="center",
            va="center",
            wrap=True,
            fontsize=8,
        )
        ax.set_axis_off()
    ax.set_title(titled("Spark: epoch notification latency", result))
    save_figure(fig, path)
