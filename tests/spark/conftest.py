"""One local SparkSession for every Spark test (a session costs ~10 s to start), and a
publisher harness that writes the real control protocol (DirectProgress) for tests that do
not run the acker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from substreams import jvm
from substreams.app import DIRECT, Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import EpochComplete, completions
from substreams.streams.listener import Listener
from substreams.streams.publisher import Publisher
from tests.conftest import follow_notifications

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from substreams.spark.connector import kafka_connector_conf  # noqa: E402
from substreams.spark.session import session  # noqa: E402


@contextlib.contextmanager
def jvm_start_lock() -> Iterator[None]:
    """Held while a SparkSession's JVM starts, across processes (pytest-xdist workers).

    Why: when the jar cache cannot be built, the JVM resolves ``spark.jars.packages`` with
    Ivy as it starts, and Ivy's cache (``~/.ivy2*``) is not safe for two resolutions at once;
    two workers starting their sessions together take turns here instead."""
    with jvm.file_lock(jvm.cache_home() / ".spark-session.lock"):
        yield


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with jvm_start_lock():
        s = _start_session()
    yield s
    s.stop()


def _start_session() -> SparkSession:
    return session(
        "substreams-tests",
        master="local[2]",
        shuffle_partitions=2,
        # Spark's Kafka connector (tests/spark/test_connector.py): only settable here, before
        # the session's JVM starts.
        **{
            "spark.default.parallelism": "2",
            # A Python worker's auth handshake that is slow on a loaded 2-core CI machine is
            # a slow machine, not a failure (default 15 s; bench spark sets the same).  The
            # 10 s wait for a non-daemon worker to connect back at all is fixed in Spark 4's
            # PythonWorkerFactory and cannot be raised.
            "spark.python.authenticate.socketTimeout": "180s",
            **kafka_connector_conf(),
        },
    )


@pytest.fixture(autouse=True)
def _stop_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "spark" in request.fixturenames:
        from substreams.spark.runner import stop

        for q in request.getfixturevalue("spark").streams.active:
            stop(q)


Click = dict[str, Any]


def window_clicks(window: int, n: int, size_ms: int = 1000, users: int = 3) -> list[Click]:
    step = max(1, size_ms // max(n, 1))
    return [
        {"user": f"u{i % users}", "url": f"/p{i % 4}", "ts": window * size_ms + i * step}
        for i in range(n)
    ]


def publish_window(
    pub: Publisher, substream: str, window: int, n: int, truth: Counter[tuple[int, str]]
) -> None:
    """``n`` clicks of ``window`` keyed by user, then its seal; counted into ``truth``
    (window, user) -> clicks, what a windowed count must come out as."""
    for c in window_clicks(window, n):
        pub.publish(c, key=str(c["user"]))
        truth[(window, str(c["user"]))] += 1
    pub.seal(substream, window)


def publish_windows(
    config: Config,
    substream: str,
    windows: Sequence[tuple[int, int]],
    *,
    open_tail: Sequence[Click] = (),
    source: str = "src",
    stream: str | None = None,
) -> None:
    """Publish (window, n) clicks window after window and seal each, then ``open_tail``
    unsealed: the control topic gets one EpochComplete per sealed window."""
    name = stream or config.substream(substream).stream
    with Application(config, mechanisms=DIRECT).publisher(name, source) as pub:
        for window, n in windows:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(substream, window)
        for c in open_tail:
            pub.publish(c, key=str(c["user"]))
        pub.flush()


@contextlib.contextmanager
def running_acker(config: Config) -> Iterator[None]:
    """The real acker service in a thread for the duration of the block."""
    from substreams.acker.service import AckerService

    stop = threading.Event()
    service = AckerService(config)
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True, name="acker")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def wait_for_epochs(
    config: Config, substream: str, count: int, timeout: float = 30.0
) -> list[EpochComplete]:
    """Block until the control topic of ``substream`` holds ``count`` EpochComplete records."""
    notes = follow_notifications(config, substream, count, timeout)
    assert len(notes) >= count, f"{substream}: {len(notes)} of {count} epochs completed"
    return notes


def output_rows(config: Config, stream: str) -> list[dict[str, Any]]:
    """Every result record of the output ``stream`` (read to its end)."""
    with Listener(config, stream) as listener:
        return [
            dict(e.payload) for e in listener.entries(idle_timeout=0.5) if hasattr(e, "payload")
        ]


def output_epochs(config: Config, substream: str) -> list[EpochComplete]:
    """Every EpochComplete on ``substream``'s control topic."""
    return [
        n
        for _, r in read_control(config.kafka.bootstrap, config.acker.control_topic(substream))
        for n in completions(r.body)
    ]


def wait_rows(
    config: Config,
    stream: str,
    windows: int,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 180.0,
) -> None:
    """Until ``stream`` holds results of ``windows`` windows: one tail read as the results
    come (not the whole topic again every second), failing at once when the job exits."""
    deadline = time.monotonic() + timeout
    seen: set[object] = set()
    with Listener(config, stream) as listener:
        while len(seen) < windows:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"job did not produce {windows} windows (exit {proc.poll()}):\n"
                    + log.read_text()[-3000:]
                )
            entry = listener.poll(0.5)
            if entry is not None and hasattr(entry, "payload"):
                seen.add(entry.payload["window"])

