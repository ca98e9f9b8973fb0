"""The end-to-end demo: broker, acker, a click workload, and a Spark job printing each
window the moment it is complete.

``run_demo(config_path, records)`` starts (or uses) the broker, creates the topics, runs the
acker in a thread, starts a firm-bound Spark query that prints every epoch notification
(epoch, record count, latency from the seal to the notification on the driver), publishes
generated clicks in event time with a progress bar, sealing each window as the clock leaves
it, waits until every sealed window has been printed and shuts everything down, also on
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from substreams.app import Application
from substreams.config import Config, SealPolicy, SubstreamConfig, load_config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.embedded import KafkaCluster, read_state
from substreams.kafka.topics import ensure_topics
from substreams.spark.epochs import format_time
from substreams.spark.operator import EpochNote, EpochOperator, Row

if TYPE_CHECKING:
    from substreams.spark.runner import EpochQuery


@dataclass
class DemoReport:
    """What the demo saw: per notified window (time, records, latency ms), and totals."""

    published: int = 0
    sealed: list[int] = field(default_factory=list)
    notified: list[tuple[Time, int, int]] = field(default_factory=list)
    tracker: str = "acker"
    interrupted: bool = False

    @property
    def counted(self) -> int:
        return sum(n for _, n, _ in self.notified)

    @property
    def complete(self) -> bool:
        """Every sealed window notified once, in order, and every record counted."""
        return [t for t, _, _ in self.notified] == self.sealed and self.counted == self.published


class _Printer(EpochOperator):
    """Counts each window's users on the executors and prints each notification on the
    driver as it arrives (``on_notification``: epoch, records, latency; never records)."""

    def __init__(self, console: Console, report: DemoReport, size_ms: int) -> None:
        self.console = console
        self.report = report
        self.size_ms = size_ms
        self.done = threading.Condition()
        self.warm_up: Time | None = None
        self.warmed = False

    def __getstate__(self) -> dict[str, object]:
        # Shipped to the executors: on_epoch needs nothing of the driver's console or lock.
        return {"size_ms": self.size_ms}

    def on_epoch(self, epoch: Time, rows: list[Row]) -> list[Row]:
        return []

    def on_notification(self, note: EpochNote) -> None:
        latency = note.latency_ms
        if note.time == self.warm_up:
            self.console.print(f"[bold]spark[/] query warmed up ({latency} ms for its first batch)")
            with self.done:
                self.warmed = True
                self.done.notify_all()
            return
        start = note.time * self.size_ms if isinstance(note.time, int) else None
        when = time.strftime("%H:%M:%S", time.gmtime(start / 1000)) if start is not None else "-"
        self.console.print(
            f"[bold green]epoch {format_time(note.time)}[/] ({when}): "
            f"[cyan]{note.records}[/] records, "
            f"[yellow]{latency} ms[/] after seal"
        )
        with self.done:
            self.report.notified.append((note.time, note.records, latency))
            self.done.notify_all()


def _pick_substream(config: Config, name: str | None) -> SubstreamConfig:
    if name is not None:
        sub = config.substream(name)
    else:
        candidates = [
            s for s in config.substreams if s.kind == "tumbling" and s.mechanism == "acker"
        ]
        candidates = candidates or [s for s in config.substreams if s.kind == "tumbling"]
        if not candidates:
            raise SubstreamsError(f"{config.path}: the demo needs a tumbling substream")
        sub = candidates[0]
    if sub.kind != "tumbling" or sub.size_ms is None:
        raise SubstreamsError(f"the demo needs a tumbling substream; '{sub.name}' is {sub.kind}")
    return sub


@contextlib.contextmanager
def _tracker(
    config: Config, bootstrap: str, sub: SubstreamConfig, report: DemoReport
) -> Iterator[None]:
    """The substream's progress writer in a thread: the acker, or the punctuation aligner."""
    app = Application(config, bootstrap)
    stop = threading.Event()
    if sub.mechanism == "acker":
        service = app.acker(commands=False)  # the demo sends no commands
        thread = threading.Thread(target=service.run, args=(stop,), name="acker", daemon=True)
    else:
        aligner = app.aligner(sub.name)
        report.tracker = "punctuation aligner"
        thread = threading.Thread(target=aligner.run, args=(stop,), name="aligner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextlib.contextmanager
def _ctrl_c_sets(event: threading.Event) -> Iterator[None]:
    """First Ctrl-C: set ``event`` (a clean stop); a second one interrupts at once.  PySpark's
    own SIGINT handler raises inside py4j calls, which makes a messy exit; this replaces it
    for the duration of the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_sig: int, _frame: object) -> None:
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_demo(
    config_path: str | Path,
    records: int = 2000,
    *,
    users: int = 20,
    seconds: float = 8.0,
    substream: str | None = None,
    bootstrap: str | None = None,
    master: str = "local[2]",
    console: Console | None = None,
    wait_timeout: float = 60.0,
) -> DemoReport:
    """Run the demo (see the module doc); returns what was published and notified.

    ``records`` clicks are spread over ``seconds`` of event time (the wall clock), so the
    windows close while Spark runs; ``bootstrap`` overrides the config (else an embedded
    broker is started when the config says ``embedded``)."""
    console = console or Console()
    config = load_config(config_path)
    sub = _pick_substream(config, substream)
    assert sub.size_ms is not None
    report = DemoReport()
    with contextlib.ExitStack() as stack:
        server = _broker(stack, config, bootstrap, console)
        ensure_topics(client.admin(server, config), config.topics())
        stack.enter_context(_tracker(config, server, sub, report))
        console.print(f"[bold]tracking[/] {sub.name} ({sub.mechanism}) by {report.tracker}")
        printer = _Printer(console, report, sub.size_ms)
        query = _start_query(stack, config, server, sub, printer, master)
        interrupted = threading.Event()
        stack.enter_context(_ctrl_c_sets(interrupted))
        _warm_up_query(config, server, sub, printer, interrupted, wait_timeout)
        _in_thread(
            lambda: _publish(
                config, server, sub, records, users, seconds, report, console, interrupted
            )
        )
        _await_notifications(printer, report, query, interrupted, wait_timeout)
        report.interrupted = interrupted.is_set()
        if report.interrupted:
            console.print("[yellow]interrupted: shutting down cleanly[/]")
        _summary(console, report)
    return report


def _broker(
    stack: contextlib.ExitStack, config: Config, bootstrap: str | None, console: Console
) -> str:
    """The bootstrap to use: ``bootstrap``, the recorded or configured broker, or (embedded
    config, no recorded broker) a throw-away embedded one closed with ``stack``."""
    if bootstrap is None and config.kafka.embedded and read_state() is None:
        # No recorded broker (`substreams broker start`): a throw-away one for this run.
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="substreams-")))
        console.print("[bold]broker[/] starting an embedded Apache Kafka ...")
        broker = stack.enter_context(
            KafkaCluster(home, progress=lambda line: console.print(f"  {line}"))
        )
        console.print(f"[bold]broker[/] embedded Apache Kafka on {broker.bootstrap}")
        return broker.bootstrap
    server = client.resolve_bootstrap(config, bootstrap)
    console.print(f"[bold]broker[/] {server}")
    return server


def _start_query(
    stack: contextlib.ExitStack,
    config: Config,
    server: str,
    sub: SubstreamConfig,
    printer: _Printer,
    master: str,
) -> EpochQuery:
    """Start the firm-bound demo query on a local session; ``stack`` stops it."""
    from substreams.spark.runner import run, stop
    from substreams.spark.session import session, warm_up

    printer.console.print("[bold]spark[/] starting a local session...")
    # ERROR: the demo's output is its own lines, not Spark's "batch falling behind" WARNs.
    spark = session(
        "substreams-demo", master=master, shuffle_partitions=2, jvm_read=True,
        **{"spark.log.level": "ERROR"},
    )
    warm_up(spark)
    checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="substreams-demo-"))
    query = run(
        printer,
        config,
        sub.name,
        None,
        checkpoint=checkpoint,
        spark=spark,
        bootstrap=server,
        query_name="demo",
        block=False,
    )
    stack.callback(stop, query)
    return query


def _in_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a thread and wait for it, re-raising its failure.

    Kafka calls run in a thread: a signal in the main thread would abort a blocking
    librdkafka call (commit_transaction) half way."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name="demo-publisher", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if failure:
        raise failure[0]


def _await_notifications(
    printer: _Printer,
    report: DemoReport,
    query: EpochQuery,
    interrupted: threading.Event,
    timeout: float,
) -> None:
    """Wait until every sealed window was notified, Ctrl-C, or ``timeout``; raise if the
    query failed meanwhile."""
    deadline = time.monotonic() + timeout
    with printer.done:
        while len(report.notified) < len(report.sealed) and time.monotonic() < deadline:
            if interrupted.is_set():
                break
            if query.exception() is not None:
                raise SubstreamsError(f"the Spark query failed: {query.exception()}")
            printer.done.wait(0.5)


def _warm_up_query(
    config: Config,
    server: str,
    sub: SubstreamConfig,
    printer: _Printer,
    interrupted: threading.Event,
    timeout: float,
) -> None:
    """Have an idle source publish one click in the window before the workload's first,
    seal it, and wait until the query has delivered it: its first micro-batch pays Spark's
    cold start (seconds), which would otherwise be charged to the demo's first windows.
    One record, not an empty window: an epoch without records is never read, and the JVM
    read's own first run (its plan, classes, generated code, Kafka consumers) is the larger
    part of that start."""
    assert sub.size_ms is not None
    app = Application(config, server)
    ts = int(time.time() * 1000) - sub.size_ms  # the window before this one
    # Known before its notification can arrive, and the only window this publisher seals
    # (by hand: an idle policy would also seal the empty windows after it, whose notes the
    # printer would count as the workload's -- and stop waiting one window short).
    click = {"user": "warm-up", "url": "/", "ts": ts}
    with app.publisher(sub.stream, "demo-warm-up", seal_policies={sub.name: None}) as pub:
        printer.warm_up = window = pub.assigners[sub.name].time_of(click)
        pub.publish(click, key="warm-up")
        pub.seal(sub.name, window)
    deadline = time.monotonic() + timeout
    with printer.done:
        while not printer.warmed and not interrupted.is_set() and time.monotonic() < deadline:
            printer.done.wait(0.5)


def _publish(
    config: Config,
    server: str,
    sub: SubstreamConfig,
    records: int,
    users: int,
    seconds: float,
    report: DemoReport,
    console: Console,
    interrupted: threading.Event,
) -> None:
    """Clicks in (compressed) real time; the seal policy seals each window once the event
    time leaves it (the substream's own policy, else no lateness), and the publisher's
    close releases the last one."""
    assert sub.size_ms is not None
    rng = random.Random(7)
    interval = seconds / max(records, 1)
    columns = (
        TextColumn("[bold]publishing[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    per_window: dict[int, int] = {}
    try:
        with (
            Application(config, server).publisher(
                sub.stream, "demo", batch_size=50,
                seal_policies={sub.name: sub.seal or SealPolicy(lateness_ms=0)},
            ) as pub,
            Progress(*columns, console=console, transient=True) as bar,
        ):
            task = bar.add_task(sub.stream, total=records)
            for _ in range(records):
                if interrupted.is_set():
                    raise _Stopped  # abort: the open transaction is dropped, not committed
                ts = int(time.time() * 1000)
                current = ts // sub.size_ms
                user = f"user{rng.randrange(users)}"
                pub.publish({"user": user, "url": f"/page/{rng.randrange(50)}", "ts": ts}, key=user)
                per_window[current] = per_window.get(current, 0) + 1
                bar.advance(task)
                time.sleep(interval)
            report.sealed = sorted(per_window)
    except _Stopped:
        pass
    except KafkaException:
        if not interrupted.is_set():
            raise
        # Ctrl-C in a terminal reaches the embedded broker too: it may be gone already.
    report.published = sum(per_window.get(w, 0) for w in report.sealed)


class _Stopped(Exception):
    """Ctrl-C: stop publishing now."""


def _summary(console: Console, report: DemoReport) -> None:
    latencies = sorted(lat for _, _, lat in report.notified)
    table = Table(title="demo summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records published", str(report.published))
    table.add_row("records in notified epochs", str(report.counted))
    table.add_row("windows sealed / notified", f"{len(report.sealed)} / {len(report.notified)}")
    if latencies:
        median = latencies[len(latencies) // 2]
        table.add_row("latency seal -> notification, median", f"{median} ms")
        table.add_row("latency seal -> notification, max", f"{latencies[-1]} ms")
    console.print(table)
    if report.complete:
        console.print("[green]every window notified once, in order, with all its records[/]")
    elif report.interrupted:
        console.print("[yellow]interrupted before every sealed window was notified[/]")
    else:
        console.print("[red]INCOMPLETE: see the table above[/]")
