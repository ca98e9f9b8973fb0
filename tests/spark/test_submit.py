"""`substreams submit` runs a job under spark-submit; SIGKILL it mid-stream, restart it from
its checkpoint, and every window's result is in the output stream exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from substreams.app import DIRECT, Application
from substreams.config import Config
from substreams.spark.runner import run
from substreams.streams.listener import Listener
from tests.conftest import ConfigFactory
from tests.spark.conftest import publish_window
from tests.spark.jobs import ROOT, load_job, out_stream

pytestmark = pytest.mark.spark


def output_rows(config: Config, stream: str) -> list[dict[str, object]]:
    with Listener(config, stream) as listener:
        return [
            dict(e.payload) for e in listener.entries(idle_timeout=0.5) if hasattr(e, "payload")
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


def test_submitted_job_killed_mid_stream_restarts_exactly_once(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}, out_stream("counts", "window_count.avsc")],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w, clicks, counts = config.substreams[0].name, config.streams[0].name, config.streams[1].name
    ck, log = tmp_path / "ck", tmp_path / "job.log"
    cmd = [
        sys.executable,
        "-m",
        "substreams",
        "submit",
        "-c",
        str(config.path),
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        str(ROOT / "jobs" / "windowed_counts.py"),
        "--",
        "--substream",
        w,
        "--output",
        counts,
        "--checkpoint",
        str(ck),
        "--query-name",
        "counts",
        "--trigger",
        "200 milliseconds",
    ]
    truth: Counter[tuple[int, str]] = Counter()
    with (
        Application(config, mechanisms=DIRECT).publisher(clicks, "src") as pub,
        log.open("wb") as out,
    ):

        def publish(window: int, n: int) -> None:
            publish_window(pub, w, window, n, truth)

        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        try:
            for window in range(3):
                publish(window, 6 + window)
            wait_rows(config, counts, 3, proc, log)
            for window in range(3, 6):  # more windows, and the job dies while on them
                publish(window, 5)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        before = {r["window"] for r in output_rows(config, counts)}
        assert {0, 1, 2} <= before < set(range(6)), "the kill should leave work for the restart"
        # the restarted query (same checkpoint, same query name) finishes the work
        job = load_job("windowed_counts")
        run(
            job.WindowedCounts(1000),
            config.path,
            w,
            counts,
            checkpoint=ck,
            once=True,
            spark=spark,
            query_name="counts",
        )
    rows = output_rows(config, counts)
    seen = Counter((int(str(r["window"])), str(r["key"])) for r in rows)
    assert max(seen.values()) == 1, f"duplicated results after the restart: {seen}"
    assert {(int(str(r["window"])), str(r["key"])): r["count"] for r in rows} == dict(truth)
