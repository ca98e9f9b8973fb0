"""Benchmark 4: Spark, substreams' firm queries against Spark's Kafka source + ``withWatermark``.

Two parts, in one run:

(a) Throughput and driver memory over a backlog.  N records (default 5M) in event-time
order, published once (``publish_many``, the control records written by the publisher
itself: ``DIRECT``, no acker, since the input is not what is measured) into one stream
with two tumbling substreams over the same records: 50 windows (``win50``) and 500 windows
(``win500``, epochs 10x smaller).  Then, each in its own Python process with its own
``local[2]`` JVM (so that each peak and each CPU count belongs to one query), over the same
backlog with trigger availableNow, windowed counts per key:

- ``jvm-df``: ``substreams.spark.frames.run_frames`` with a DataFrame count (the JVM read
  path, the work never leaving the JVM), results written exactly once to an output stream;
- ``jvm-arrow``: ``substreams.spark.run`` with an :class:`ArrowEpochOperator` on the JVM
  read path, on ``win50`` and ``win500`` (``maxEpochsPerTrigger`` =
  :data:`EPOCHS_PER_BATCH`: a batch grows with the epoch);
- ``python``: the same operator on the Python read path (``read="python"``);
- ``watermark-avro``: Spark's Kafka source, ``from_avro``, ``withWatermark(..., "0
  seconds")``, ``groupBy(window(1 s), key).count()`` in append mode (what a Spark user
  writes), results collected in ``foreachBatch``;
- ``watermark-pandas``: the same with the decode in ``mapInPandas`` (the project's codec).

records per CPU-second = N / CPU time of the query's process tree (driver, JVM, Python
workers) from query start to end.  Driver peak RSS = the peak resident set (``VmHWM``) of
the driver's Python process plus that of its JVM.

(b) Latency at steady state.  One ``local[2]`` session runs three streaming queries over
the same input stream: ``substreams.spark.run(operator, ...)`` with the default trigger
and the JVM read (one ``on_epoch`` per completed epoch; the latency of epoch e is the
wall-clock moment of its driver callback minus the moment its seal began, the acker in its
own process), and the two watermark queries above with a 1-second window count (their
latency for window e: the moment ``foreachBatch`` receives the window's row minus the same
seal moment; a watermark only passes window e once a record of a later window arrived).

The producer paces epochs on the firm query (each epoch is published once the previous one
was delivered, plus ``PAUSE_S``), so all queries see the same input at the same times.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from substreams.spark.operator import ArrowEpochOperator, EpochOperator
from substreams_bench.harness import (
    BODY_BYTES,
    BenchContext,
    BenchError,
    BenchResult,
    Column,
    Target,
    command_line,
    ms,
    percentile,
    process_cpu_ticks,
    save_figure,
    titled,
)
from substreams_bench.workload import acker_process, close_all, open_publishers


def _no_results(epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return []

NAME = "spark"
PAUSE_S = 0.2
WAIT_S = 60.0
SMOKE_JAVA_OPTIONS = "-Xss16m -XX:TieredStopAtLevel=1"
"""``--smoke``'s JVM compiles with C1 only: its queries are each a batch or two, over
before C2's compilations would pay back the CPU they take (a third off the first query's
seconds on the loaded 2-core machine).  ``-Xss16m`` as :func:`substreams.spark.session`
sets it."""
SLOW_MACHINE = {"spark.python.authenticate.socketTimeout": "180s"}
"""Spark waits 15 s by default for a Python worker it starts to connect back; on a loaded
2-core machine importing pyspark took longer and failed the query ("Python worker failed
to connect back")."""


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
        Column("part", "part"),
        Column("query", "query"),
        Column("windows", "windows"),
        Column("granularity", "records/epoch"),
        Column("records_per_s", "records/s", "{:,.0f}"),
        Column("batches", "batches"),
        Column("cpu_s", "CPU s", "{:,.0f}"),
        Column("records_per_cpu_s", "rec/CPU s", "{:,.0f}"),
        Column("driver_peak_mb", "driver peak MB", "{:,.0f}"),
        Column("tree_peak_mb", "tree peak MB", "{:,.0f}"),
        Column("correct", "counts ok"),
        Column("samples", "n"),
        Column("p50_ms", "p50 ms", "{:.0f}"),
        Column("p99_ms", "p99 ms", "{:.0f}"),
    ]
    windows = SMOKE_WINDOWS if ctx.smoke else QUICK_WINDOWS if ctx.quick else WINDOWS
    n = ctx.records or (QUICK_RECORDS if ctx.quick else RECORDS)
    if n % windows[1]:
        raise BenchError(f"bench spark: --records {n} is not a multiple of {windows[1]}")
    with contextlib.ExitStack() as stack:
        shared = stack.enter_context(_smoke_session(ctx)) if ctx.smoke else None
        if ctx.part in (None, "a"):
            result.rows += _throughput(ctx, result, n, windows, shared)
        if ctx.part is None:
            ctx.reset()  # part (b) on a broker without the backlog
        if ctx.part in (None, "b"):
            result.rows += _latency(ctx, result, shared)
    result.targets = targets(result.rows)
    if ctx.part in (None, "a"):
        result.notes.append(
            ("part (a): --smoke: every query in the bench process, in the one local[2] "
             "session that part (b) then uses too, its JVM compiling with C1 only (the "
             "peaks and CPU seconds are not per query), " if ctx.smoke else
             "part (a): each query in its own process and local[2] JVM, ")
            + "trigger availableNow "
            "over the same backlog; the firm queries with maxEpochsPerTrigger="
            f"{QUICK_EPOCHS_PER_BATCH if ctx.quick else EPOCHS_PER_BATCH}; "
            "driver peak MB = VmHWM of the driver's Python process + VmHWM of its JVM (local "
            "mode: the executors are JVM threads); tree peak MB = the sampled (200 ms) peak of "
            "the summed RSS of the driver, its JVM and the Python workers; 'counts ok' = every "
            "window came out and the counts add up to the records; CPU s = CPU time of the "
            "query's process tree (driver, JVM, Python workers) from query start to end, "
            "sampled every 200 ms (robust to the machine's other load, unlike records/s)."
        )
    if ctx.part in (None, "b"):
        result.notes.append(
            "part (b): local[2], default trigger of substreams.spark.run; epoch 0 is a warm-up "
            "(query start) and not counted; the watermark query's window e can only close "
            "after a record of epoch e+1 arrives (the last epoch never closes and is not "
            "counted)."
        )
    return result


@contextlib.contextmanager
def _smoke_session(ctx: BenchContext) -> Iterator[Any]:
    """``--smoke``'s one local[2] session for both parts, in the bench process: a smoke
    run checks the outputs, and every further JVM, driver and set of Python workers cost
    tens of seconds of start-up on the loaded 2-core machine."""
    from substreams.spark.connector import kafka_connector_conf

    ctx.log("--smoke: starting the one Spark local[2] session of both parts ...")
    spark = _session({"label": "smoke", "connector": kafka_connector_conf(progress=ctx.log),
                      "conf": {"spark.driver.extraJavaOptions": SMOKE_JAVA_OPTIONS}})
    try:
        yield spark
    finally:
        spark.stop()


def _latency(ctx: BenchContext, result: BenchResult, spark: Any = None) -> list[dict[str, Any]]:
    # The first is a warm-up; --smoke measures one epoch (a sample per query, not a rate).
    epochs = 2 if ctx.smoke else 9 if ctx.quick else 41
    granularity = 100
    error: str | None = None
    marks: dict[str, list[float]] = {}
    try:
        firm, marks = _measure(ctx, epochs, granularity, notes=result.notes, spark=spark)
    except BenchError as exc:  # reported in the table and the JSON, not swallowed
        error = str(exc)
        firm = []
        result.notes.append(f"part (b) failed: {error}")
        ctx.log(f"[red]{error}[/]")
    rows = []
    for name, path, samples in (
        ("substreams on_epoch (firm, JVM read)", "firm", firm),
        ("Kafka + from_avro + withWatermark + window", "watermark-avro",
         marks.get("watermark-avro", [])),
        ("Kafka + mapInPandas decode + withWatermark + window", "watermark-pandas",
         marks.get("watermark-pandas", [])),
    ):
        rows.append(
            {
                "part": "b",
                "query": name,
                "path": path,
                "granularity": granularity,
                "samples": len(samples),
                "p50_ms": ms(percentile(samples, 50)) if samples else None,
                "p99_ms": ms(percentile(samples, 99)) if samples else None,
                "error": error,
            }
        )
    return rows


def _path(rows: Sequence[dict[str, Any]], path: str, windows: int | None = None
          ) -> dict[str, Any] | None:
    """The first row of ``path`` (part (a)'s query kind, part (b)'s query) and size."""
    for r in rows:
        if r.get("path") == path and (windows is None or r.get("windows") == windows):
            return r
    return None


def _fmt(value: Any, unit: str) -> str:
    return "not measured" if value is None else f"{value:,.0f} {unit}"


def _ratio_target(
    rows: Sequence[dict[str, Any]], name: str, path: str, base_path: str, floor: float
) -> Target:
    """``path``'s records per CPU-second at least ``floor`` times ``base_path``'s."""
    mine, base = _path(rows, path), _path(rows, base_path)
    a = (mine or {}).get("records_per_cpu_s")
    b = (base or {}).get("records_per_cpu_s")
    ratio = a / b if a and b else None
    return Target(
        name, f">= {floor:.1f}x",
        "not measured" if ratio is None
        else f"{ratio:.2f}x ({_fmt(a, 'rec/CPU s')} vs {_fmt(b, 'rec/CPU s')})",
        None if ratio is None else bool(ratio >= floor and mine and mine.get("correct")),
    )


def targets(rows: Sequence[dict[str, Any]]) -> list[Target]:
    """The targets of the JVM read path; a value that could not be measured gives
    ``met=None``, a failed or wrong run ``False``."""
    out = [
        _ratio_target(rows, "(a) JVM firm DataFrame count vs Kafka + from_avro watermark "
                      "query, records per CPU-second", "jvm-df", "watermark-avro", 1.2),
        _ratio_target(rows, "(a) JVM firm ArrowEpochOperator vs Kafka + mapInPandas "
                      "watermark query, records per CPU-second", "jvm-arrow",
                      "watermark-pandas", 1.0),
    ]
    sizes = sorted(r["windows"] for r in rows if r.get("path") == "jvm-arrow")
    large, small = (sizes[0], sizes[-1]) if sizes else WINDOWS
    lo = (_path(rows, "jvm-arrow", small) or {}).get("driver_peak_mb")
    hi = (_path(rows, "jvm-arrow", large) or {}).get("driver_peak_mb")
    ratio = hi / lo if lo and hi else None
    out.append(
        Target(
            f"(a) JVM firm driver peak RSS, epochs {small // large}x larger ({small} -> {large} "
            "windows)",
            "<= 1.2x",
            "not measured"
            if ratio is None
            else f"{ratio:.2f}x ({_fmt(lo, 'MB')} -> {_fmt(hi, 'MB')})",
            None if ratio is None else ratio <= 1.2,
        )
    )
    b_firm = _path(rows, "firm")
    p50, p99 = (b_firm or {}).get("p50_ms"), (b_firm or {}).get("p99_ms")
    failed = b_firm is not None and b_firm.get("error") is not None
    marks = [r.get("p99_ms") for r in rows if r.get("part") == "b"
             and str(r.get("path", "")).startswith("watermark") and r.get("p99_ms")]
    for name, value, limit in (("p50", p50, 200.0), ("p99", p99, 600.0)):
        out.append(
            Target(
                f"(b) seal -> on_epoch {name}",
                f"<= {limit:.0f} ms",
                _fmt(value, "ms") + ("" if not marks or name == "p50" else
                                     " (watermark queries: "
                                     f"{', '.join(_fmt(m, 'ms') for m in marks)})"),
                False if failed else None if value is None else value <= limit,
            )
        )
    return out


def _measure(
    ctx: BenchContext,
    epochs: int,
    granularity: int,
    windowed: bool = True,
    notes: list[str] | None = None,
    read: str = "jvm",
    spark: Any = None,
) -> tuple[list[float], dict[str, list[float]]]:
    """Part (b)'s latencies, in its own session unless ``spark`` (``--smoke``'s) is given:
    (the firm query's seal -> on_epoch seconds, the watermark queries' by kind)."""
    from substreams.spark import EpochOperator, run
    from substreams.spark.connector import KAFKA_CONNECTOR, kafka_connector_conf
    from substreams.spark.runner import stop
    from substreams.spark.session import session

    sub = {"name": "ep", "stream": "s0", "kind": "epoch", "field": "batch", "mechanism": "acker"}
    config = ctx.config([("s0", 2)], [sub])
    stream = config.streams[0].name
    substream = config.substreams[0].name
    firm_seen = _Seen()
    kinds = ("watermark-avro", "watermark-pandas") if windowed else ()
    window_seen = {k: _Seen() for k in kinds}

    class Probe(EpochOperator):
        def on_epoch(self, epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return []

        def on_notification(self, note: Any) -> None:  # on the driver, once per epoch
            if isinstance(note.time, int):
                firm_seen.mark(note.time)

        def __reduce__(self) -> Any:  # the executors' copy needs nothing of the driver's
            from substreams.spark.operator import FunctionOperator

            return (FunctionOperator, (_no_results,))

    def on_windows(seen: _Seen) -> Callable[[Any, int], None]:
        def mark(df: Any, batch_id: int) -> None:
            for row in df.collect():
                seen.mark(int(row["window"].start.timestamp()))

        return mark

    # Before the session: Spark's Kafka connector must be on the classpath when the JVM
    # starts (its jars resolved once per machine, then named in spark.jars).
    connector: dict[str, str] = kafka_connector_conf(progress=ctx.log) if windowed else {}
    if connector and notes is not None:
        notes.append(
            "the watermark query reads the data topic with Spark's Kafka connector "
            f"({KAFKA_CONNECTOR}, read_committed)"
        )
    acker = contextlib.ExitStack()
    acker.enter_context(acker_process(config, ctx.bootstrap))
    if spark is None:
        ctx.log("starting Spark local[2] ...")
        spark = session(
            "substreams-bench", master="local[2]", shuffle_partitions=4, jvm_read=True,
            **SLOW_MACHINE, **connector,
        )
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
                # a checkpoint per call: another call's would start at its topics' offsets
                checkpoint=ctx.workdir / f"ckpt-firm-{substream}",
                read=read,
            )
        )
        # The baselines read Kafka as a user without substreams would: Spark's connector,
        # the envelope decoded by from_avro in the JVM, or by the project's codec in
        # mapInPandas (the baseline before the JVM path).
        for k in kinds:
            queries.append(
                _watermark_counts(spark, config, ctx.bootstrap, stream,
                                  avro=k == "watermark-avro", by_key=False)
                .writeStream.outputMode("append")
                .option("checkpointLocation", str(ctx.workdir / f"ckpt-{k}-{substream}"))
                .foreachBatch(on_windows(window_seen[k]))
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
                # the first batch starts Python workers and the JVM read: minutes when loaded
                firm_seen.wait(epoch, WAIT_S if epoch else 4 * WAIT_S, check)
                if epoch == 0 and windowed:
                    # The warm-up covers both queries' start: the watermark query's first
                    # batches (Kafka consumer, Python workers, state store) take seconds,
                    # and a backlog left from them would be counted against every epoch.
                    for q in queries[1:]:
                        _wait_consumed(q, granularity, WAIT_S, check)
                time.sleep(PAUSE_S)
            # the last counted window, closed by the last epoch's records
            for k, q in zip(kinds, queries[1:], strict=True):
                with contextlib.suppress(BenchError):
                    window_seen[k].wait(epochs - 1, WAIT_S, functools.partial(_alive, q))
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
    window = {k: [seen.at[e] - t0s[e] for e in range(1, epochs) if e in seen.at]
              for k, seen in window_seen.items()}
    return firm, window


# --- (a) throughput and driver memory over a backlog -------------------------------------

RECORDS = 5_000_000
"""Records of part (a) (``--records``); 50 one-second windows of them."""
QUICK_RECORDS = 20_000
WINDOWS = (50, 500)
"""The two epoch sizes of part (a): the same records in 50 one-second tumbling windows and
in 500 of 100 ms (epochs 10x smaller)."""
QUICK_WINDOWS = (10, 100)
SMOKE_WINDOWS = (10, 20)
"""``--smoke``: the smaller epochs only 2x smaller (2 batches of 10 epochs, not 10)."""
EPOCHS_PER_BATCH = 5
"""``maxEpochsPerTrigger`` of the firm queries in part (a): a batch grows with the epoch."""
QUICK_EPOCHS_PER_BATCH = 10
KEYS = 100
"""Distinct keys counted per window (the record's ``body`` starts with its key)."""
SLICE = 1000
CHILD_TIMEOUT_S = 3600.0


class WindowCounts(EpochOperator):
    """Records per key in each window (what ``jobs/windowed_counts.py`` computes), its
    results shaped as the bench's record (``ts`` = window start, ``batch`` = count,
    ``body`` = key) so that they go to an output stream of the bench's schema.  A per-row
    operator: :class:`ArrowWindowCounts` is the columnar one part (a) runs."""

    key_field = "body"

    def __init__(self, size_ms: int) -> None:
        self.size_ms = size_ms

    def on_epoch(self, epoch: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        counts = Counter(str(r["body"])[:4] for r in rows)
        return [
            {"ts": int(epoch) * self.size_ms, "batch": n, "body": k}
            for k, n in sorted(counts.items())
        ]


class ArrowWindowCounts(ArrowEpochOperator):
    """:class:`WindowCounts` computed with pyarrow over the epoch's ``body`` column (the
    same results: a test compares them), as the watermark query counts in the JVM."""

    key_field = "body"

    def __init__(self, size_ms: int) -> None:
        self.size_ms = size_ms

    def on_epoch_table(self, epoch: Any, table: Any) -> list[dict[str, Any]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        if table.num_rows == 0:
            return []
        keys = pc.utf8_slice_codeunits(pc.cast(table.column("body"), pa.string()), 0, 4)
        counts = pa.table({"k": keys}).group_by("k").aggregate([([], "count_all")])
        ts = int(epoch) * self.size_ms
        return [
            {"ts": ts, "batch": n, "body": k}
            for k, n in sorted(zip(counts.column("k").to_pylist(),
                                   counts.column("count_all").to_pylist(), strict=True))
        ]


def _key_body(i: int) -> str:
    return f"k{i % KEYS:03d}".ljust(BODY_BYTES, "x")


def _publish_backlog(ctx: BenchContext, config: Any, n: int, windows: tuple[int, int]) -> float:
    """``n`` records over ``windows[0]`` seconds of event time, every window of both
    substreams sealed as soon as its last record is written, then one record of a later
    second (it lets the watermark query close the last window; no firm epoch holds it).
    Returns seconds."""
    from substreams.app import DIRECT

    stream = config.streams[0].name
    span = windows[0] * 1000
    subs = {w: config.substreams[i].name for i, w in enumerate(windows)}
    sizes = {w: span // w for w in windows}
    (pub,) = open_publishers(config, stream, ["src0"], ctx.bootstrap, mechanisms=DIRECT,
                             batch_size=5000)
    sealed = dict.fromkeys(windows, -1)
    t0 = time.perf_counter()
    task = ctx.progress.add_task(f"publishing {n:,} records", total=n)
    try:
        for lo in range(0, n, SLICE):
            hi = min(n, lo + SLICE)
            pub.publish_many(
                [{"ts": i * span // n, "batch": 0, "body": _key_body(i)} for i in range(lo, hi)]
            )
            next_ts = hi * span // n if hi < n else span
            for w in windows:
                done = next_ts // sizes[w] - 1  # windows whose every record is written
                for window in range(sealed[w] + 1, done + 1):
                    pub.seal(subs[w], window, commit=False)
                sealed[w] = max(sealed[w], done)
            ctx.progress.update(task, completed=hi)
        pub.publish({"ts": span + 1500, "batch": 0, "body": _key_body(0)})
        pub.flush()
    finally:
        ctx.progress.remove_task(task)
        close_all([pub])
        del pub
    return time.perf_counter() - t0


def _query_row(
    query: str, windows: int, n: int, out: dict[str, Any] | None, error: str | None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "part": "a",
        "query": query,
        "windows": windows,
        "granularity": n // windows,
        "records": n,
        "error": error,
    }
    if out is not None:
        seconds = out["seconds"]
        row.update(
            seconds=round(seconds, 2),
            records_per_s=round(n / seconds, 1) if seconds > 0 else None,
            batches=out["batches"],
            cpu_s=round(out.get("cpu_s", 0.0), 1) or None,
            records_per_cpu_s=round(n / out["cpu_s"], 1) if out.get("cpu_s") else None,
            cpu_by_kind=out.get("cpu_by_kind"),
            batch_rows=out["batch_rows"],
            batch_ms=out.get("batch_ms"),
            driver_peak_mb=round((out["python_hwm_kb"] + out["jvm_hwm_kb"]) / 1024, 1),
            python_hwm_mb=round(out["python_hwm_kb"] / 1024, 1),
            jvm_hwm_mb=round(out["jvm_hwm_kb"] / 1024, 1),
            tree_peak_mb=round(out["tree_peak_kb"] / 1024, 1),
            windows_out=out["windows_out"],
            counted=out["counted"],
            correct=out["windows_out"] == windows and out["counted"] == n,
        )
    return row


def _spawn(ctx: BenchContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one part-(a) query in a child process (``python -m substreams_bench.spark``);
    its last stdout line is its result."""
    log = ctx.workdir / f"child-{spec['label']}.log"
    with open(log, "wb") as err:
        done = subprocess.run(
            [sys.executable, "-m", "substreams_bench.spark", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = log.read_text(errors="replace")[-1500:]
        raise BenchError(f"bench spark: {spec['label']} exited with {done.returncode}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _throughput(
    ctx: BenchContext, result: BenchResult, n: int, windows: tuple[int, int], shared: Any = None
) -> list[dict[str, Any]]:
    """Part (a)'s rows: each query in its own child process, or (``--smoke``) one after
    another in the ``shared`` session."""
    span = windows[0] * 1000
    per_batch = QUICK_EPOCHS_PER_BATCH if ctx.quick else EPOCHS_PER_BATCH
    subs = [
        {"name": f"win{w}", "stream": "s0", "kind": "tumbling", "size_ms": span // w}
        for w in windows
    ]
    config = ctx.config(
        [("s0", 2), ("counts0", 1), ("counts1", 1), ("counts2", 1), ("counts3", 1)], subs
    )
    from substreams.spark.connector import kafka_connector_conf

    connector = kafka_connector_conf(progress=ctx.log)
    ctx.log(f"part (a): publishing the backlog of {n:,} records ...")
    took = _publish_backlog(ctx, config, n, windows)
    result.notes.append(
        f"part (a): {n:,} records of {BODY_BYTES}-byte bodies published in {took:.0f} s "
        f"({n / took:,.0f} records/s, publish_many, DIRECT control records) before any query"
    )
    runs = [
        ("substreams run_frames (JVM read, DataFrame count)", windows[0], "jvm-df"),
        ("substreams run (JVM read, ArrowEpochOperator)", windows[0], "jvm-arrow"),
        ("substreams run (JVM read, ArrowEpochOperator)", windows[1], "jvm-arrow"),
        ("substreams run (Python read, ArrowEpochOperator)", windows[0], "python"),
        ("Kafka + from_avro + withWatermark + window", windows[0], "watermark-avro"),
        ("Kafka + mapInPandas decode + withWatermark + window", windows[0], "watermark-pandas"),
    ]
    specs = []
    for _query, count, kind in runs:
        label = f"{kind}-{count}"
        # one output stream per firm query: each reads back only its own results
        outputs = {"python": 3, "jvm-df": 4}
        specs.append({
            "label": label,
            "kind": kind,
            "config": str(config.path),
            "bootstrap": ctx.bootstrap,
            "stream": config.streams[0].name,
            "output": config.streams[outputs.get(kind, 1 + windows.index(count))].name,
            "substream": config.substreams[windows.index(count)].name,
            "size_ms": span // count,
            "span_ms": span,
            "checkpoint": str(ctx.workdir / f"ckpt-{label}"),
            "max_epochs": per_batch,
            "connector": connector,
        })
    outs: list[dict[str, Any] | None] = [None] * len(runs)
    errors: list[str | None] = [None] * len(runs)
    if shared is not None:
        for i, spec in enumerate(specs):
            ctx.log(f"part (a): {spec['label']}, in the shared session ...")
            try:
                outs[i] = _child(spec, shared)
            except Exception as exc:  # reported in its row, the next query still runs
                errors[i] = f"{spec['label']}: {exc!r}"[:1500]
    else:
        for i, (spec, (query, count, _kind)) in enumerate(zip(specs, runs, strict=True)):
            ctx.log(f"part (a): {query}, {count} windows ...")
            try:
                outs[i] = _spawn(ctx, spec)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                errors[i] = str(exc)
    rows = []
    for (query, count, kind), spec, out, error in zip(runs, specs, outs, errors, strict=True):
        if error is not None:
            ctx.log(f"[red]{error[:500]}[/]")
            result.notes.append(f"part (a) {spec['label']} failed: {error[:500]}")
        rows.append({**_query_row(query, count, n, out, error), "path": kind})
    return rows


def _read_anything(progress: dict[str, Any]) -> bool:
    """Did this micro-batch read anything?  Its input rows, or -- for a firm query on the
    JVM read, whose source rows (the notifications) are taken from the offset log and never
    read as rows, so ``numInputRows`` stays 0 -- a source whose offsets moved."""
    return bool(progress["numInputRows"]) or any(
        s.get("startOffset") != s.get("endOffset") for s in progress.get("sources", [])
    )


def _read_counts(config: Any, stream: str) -> tuple[int, int]:
    """(distinct windows, sum of counts) of the firm query's output stream."""
    from substreams.streams.records import Entry
    from substreams.streams.tail import open_listener, tail

    windows: set[int] = set()
    total = 0
    with open_listener(config, stream) as listener:
        for e in tail(listener, follow=False):
            if isinstance(e, Entry):
                windows.add(int(e.payload["ts"]))
                total += int(e.payload["batch"])
    return len(windows), total


def _proc_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: Linux only, like the RSS figures)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


class _TreeSampler(threading.Thread):
    """The peak of the summed RSS of this process and its descendants, sampled every
    200 ms (the Python workers of the JVM come and go; ``VmHWM`` does not add up), and
    the CPU time they used (the last value seen of every process: on a shared machine the
    wall clock measures the other load as much as the query)."""

    def __init__(self, jvm: int = 0) -> None:
        """``jvm``: the session's JVM, when this process has other children (``--smoke``
        runs in the bench process, beside the embedded broker): the tree is then this
        process, that JVM and the JVM's descendants."""
        super().__init__(daemon=True, name="rss-sampler")
        self.jvm = jvm
        self.peak_kb = 0
        self.ticks: dict[int, int] = {}
        self.stop = threading.Event()

    def sample(self) -> None:
        me = os.getpid()
        procs = [me, self.jvm, *_descendants(self.jvm)] if self.jvm else [me, *_descendants(me)]
        self.peak_kb = max(self.peak_kb, sum(_proc_kb(p, "VmRSS") for p in procs))
        for p in procs:
            self.ticks[p] = max(self.ticks.get(p, 0), process_cpu_ticks(p))

    def cpu_s(self) -> float:
        """CPU seconds of the tree so far (sampled now)."""
        self.sample()
        return sum(self.ticks.values()) / os.sysconf("SC_CLK_TCK")

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds so far per kind of process: the JVM, the Python workers the JVM
        forks (read and operator tasks), the source's planner, this driver."""
        self.sample()
        out: dict[str, float] = {}
        for pid, ticks in self.ticks.items():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = "gone"
            kind = (
                "driver" if pid == os.getpid()
                else "jvm" if "java" in cmd.split(" ")[0]
                else "planner" if "streaming_source_runner" in cmd
                else "python workers" if "pyspark" in cmd
                else "other"
            )
            out[kind] = out.get(kind, 0.0) + ticks / os.sysconf("SC_CLK_TCK")
        return {k: round(v, 1) for k, v in sorted(out.items())}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()


def _jvm_pid(spark: Any = None) -> int:
    """The JVM of ``spark`` (the process its gateway started), else this process's first
    ``java`` descendant."""
    with contextlib.suppress(AttributeError, TypeError):  # no session, or no gateway process
        return int(spark.sparkContext._gateway.proc.pid)
    for pid in _descendants(os.getpid()):
        try:
            if "java" in Path(f"/proc/{pid}/comm").read_text():
                return pid
        except OSError:
            continue
    return 0


def _watermark_counts(
    spark: Any, config: Any, bootstrap: str, stream: str, *, avro: bool, by_key: bool
) -> Any:
    """What a Spark user writes instead of substreams: Spark's Kafka source on the data
    topic (read_committed), the envelopes decoded -- with ``from_avro`` in the JVM
    (``avro``; one writer schema, punctuations dropped by their prefix) or with the project's
    codec in ``mapInPandas`` (given the config: every schema the stream registered, as a user
    of ``decode_envelopes`` decodes) -- an event-time column, ``withWatermark(..., "0 seconds")``
    and a one-second tumbling window count (per key with ``by_key``), append mode."""
    from pyspark.sql import functions as F

    from substreams.spark.connector import decode_envelopes
    from substreams.spark.jvm_read import Decoding, decoded

    kafka = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", stream)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    if avro:
        env = decoded(kafka, Decoding.of(config, stream, {}), stream)
        records = env.select(F.col("env.payload.ts").alias("ts"),
                             F.col("env.payload.body").alias("body"))
    else:
        records = decode_envelopes(kafka, config.stream(stream), config)
    timed = records.withColumn("event_time", (F.col("ts") / 1000).cast("timestamp"))
    keys = [F.substring("body", 1, 4).alias("key")] if by_key else []
    return (
        timed.withWatermark("event_time", "0 seconds")
        .groupBy(F.window("event_time", "1 second"), *keys)
        .count()
    )


def _session(spec: dict[str, Any]) -> Any:
    """The local[2] session of a part-(a) query, its Python workers started."""
    from substreams.spark.session import session, warm_up

    spark = session(
        f"bench-{spec['label']}",
        master="local[2]",
        shuffle_partitions=4,
        jvm_read=True,
        **{
            "spark.sql.streaming.numRecentProgressUpdates": "10000",
            **SLOW_MACHINE,
            **spec["connector"],
            **spec.get("conf", {}),
        },
    )
    warm_up(spark)
    return spark


def _child(spec: dict[str, Any], shared: Any = None) -> dict[str, Any]:
    """One part-(a) query in this process (a fresh JVM), in the ``shared`` session if one
    is given (left running), else in its own (stopped at the end); returns its
    measurements."""
    from substreams.config import load_config

    config = load_config(spec["config"])
    sampler = _TreeSampler(_jvm_pid(shared) if shared is not None else 0)
    sampler.start()
    spark = shared if shared is not None else _session(spec)
    out: dict[str, Any] = {}
    kind = spec["kind"]
    if kind in ("jvm-arrow", "python"):
        from substreams.spark import run

        cpu0 = sampler.cpu_s()
        t0 = time.perf_counter()
        query: Any = run(
            ArrowWindowCounts(spec["size_ms"]),
            config,
            spec["substream"],
            spec["output"],
            spark=spark,
            bootstrap=spec["bootstrap"],
            once=True,
            checkpoint=spec["checkpoint"],
            options={"maxEpochsPerTrigger": str(spec["max_epochs"])},
            read="jvm" if kind == "jvm-arrow" else "python",
        )
        out["seconds"] = time.perf_counter() - t0
        out["cpu_s"] = sampler.cpu_s() - cpu0
        out["cpu_by_kind"] = sampler.cpu_by_kind()
        if query.exception() is not None:
            raise BenchError(f"firm query failed: {query.exception()}")
        out["windows_out"], out["counted"] = _read_counts(config, spec["output"])
    elif kind == "jvm-df":
        from substreams.spark.frames import run_frames

        size_ms = int(spec["size_ms"])

        def counts_df(df: Any) -> Any:
            from pyspark.sql import functions as F

            return (
                df.where(~F.col("is_notification"))
                .groupBy("control_offset", "control_index", "epoch",
                         F.substring("body", 1, 4).alias("body"))
                .count()
                .select("control_offset", "control_index", "epoch", "body",
                        (F.col("epoch.coords")[0] * size_ms).alias("ts"),
                        F.col("count").alias("batch"))
            )

        cpu0 = sampler.cpu_s()
        t0 = time.perf_counter()
        query = run_frames(
            counts_df, config, spec["substream"], spec["output"], name=f"bench-{spec['label']}",
            key_field="body", spark=spark, bootstrap=spec["bootstrap"], once=True,
            checkpoint=spec["checkpoint"],
            options={"maxEpochsPerTrigger": str(spec["max_epochs"])},
        )
        out["seconds"] = time.perf_counter() - t0
        out["cpu_s"] = sampler.cpu_s() - cpu0
        out["cpu_by_kind"] = sampler.cpu_by_kind()
        if query.exception() is not None:
            raise BenchError(f"firm query failed: {query.exception()}")
        out["windows_out"], out["counted"] = _read_counts(config, spec["output"])
    else:
        results: list[tuple[int, int]] = []

        def collect(df: Any, batch_id: int) -> None:
            results.extend(
                (int(r["window"].start.timestamp()), int(r["count"])) for r in df.collect()
            )

        counts = _watermark_counts(spark, config, spec["bootstrap"], spec["stream"],
                                   avro=kind == "watermark-avro", by_key=True)
        cpu0 = sampler.cpu_s()
        t0 = time.perf_counter()
        query = (
            counts.writeStream.outputMode("append")
            .option("checkpointLocation", spec["checkpoint"])
            .foreachBatch(collect)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        out["seconds"] = time.perf_counter() - t0
        out["cpu_s"] = sampler.cpu_s() - cpu0
        out["cpu_by_kind"] = sampler.cpu_by_kind()
        if query.exception() is not None:
            raise BenchError(f"watermark query failed: {query.exception()}")
        in_span = [(w, c) for w, c in results if w * 1000 < spec["span_ms"]]
        out["windows_out"] = len({w for w, _ in in_span})
        out["counted"] = sum(c for _, c in in_span)
    done = [p for p in query.recentProgress if _read_anything(p)]
    out["batches"] = len(done)
    out["batch_rows"] = [int(p["numInputRows"]) for p in done]
    out["batch_ms"] = [int(p["durationMs"].get("triggerExecution", 0)) for p in done]
    out["python_hwm_kb"] = _proc_kb(os.getpid(), "VmHWM")
    out["jvm_hwm_kb"] = _proc_kb(_jvm_pid(spark), "VmHWM")
    sampler.stop.set()
    sampler.join(1)
    out["tree_peak_kb"] = sampler.peak_kb
    if shared is None:
        spark.stop()
    return out




def plot(result: BenchResult, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(12, 3.8))
    a_rows = [r for r in result.rows if r.get("part") == "a"]
    b_rows: Sequence[dict[str, Any]] = [r for r in result.rows if r.get("part") == "b"]
    labels = [f"{'firm' if r['query'].startswith('substreams') else 'watermark'}\n"
              f"{r['windows']} windows" for r in a_rows]
    x = list(range(len(a_rows)))
    left.bar(x, [r.get("records_per_s") or 0 for r in a_rows])
    left.set_xticks(x, labels, fontsize=8)
    left.set_ylabel("records / s (availableNow over the backlog)")
    left.set_title("(a) throughput")
    mid.bar(x, [r.get("driver_peak_mb") or 0 for r in a_rows], label="driver (Python + JVM)")
    mid.plot(x, [r.get("tree_peak_mb") or 0 for r in a_rows], "k^", label="whole tree")
    mid.set_xticks(x, labels, fontsize=8)
    mid.set_ylabel("peak RSS (MB)")
    mid.set_title("(a) driver memory")
    mid.legend(fontsize=7)
    if b_rows:
        names = [r["query"] for r in b_rows]
        xb = range(len(b_rows))
        right.bar([i - 0.2 for i in xb], [r["p50_ms"] or 0 for r in b_rows], 0.4, label="p50")
        right.bar([i + 0.2 for i in xb], [r["p99_ms"] or 0 for r in b_rows], 0.4, label="p99")
        right.set_xticks(list(xb), names, fontsize=7)
        right.set_ylabel("seal → result visible (ms)")
        right.legend(fontsize=7)
    right.set_title("(b) latency")
    fig.suptitle(titled("Spark: substreams run vs withWatermark", result))
    save_figure(fig, path)


if __name__ == "__main__":
    # Through the module's own name, so that WindowCounts pickles as
    # substreams_bench.spark.WindowCounts (an executor can import it), not as __main__'s.
    from substreams_bench import spark as _bench

    print(json.dumps(_bench._child(json.loads(sys.argv[1]))), flush=True)
