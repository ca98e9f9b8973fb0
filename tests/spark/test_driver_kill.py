"""Exactly once with executor writes, proven by SIGKILL: a windowed-count job
(``jobs/windowed_counts.py``, its operator on the executors) is killed twice -- once inside a
batch, started by ``substreams submit`` (spark-submit, its own driver JVM: the path a user
deploys), once right after a task committed its results, started as a plain script -- and
restarted from the same checkpoint each time (the last time in the test's own SparkSession),
while windows keep completing; then every window's counts must be in the output exactly once,
with exactly the right values, and the output substream (tracked by the real acker, sealed by
the job's driver) must announce every window exactly once with exactly its records: a
downstream firm reader sees whole epochs."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from substreams.app import Application
from substreams.config import Config
from substreams.spark.runner import run
from tests.conftest import ConfigFactory, follow_notifications
from tests.spark.conftest import output_epochs, output_rows, running_acker, window_clicks
from tests.spark.jobs import ROOT, load_job, out_stream

pytestmark = pytest.mark.spark

KILLS = 2
MIN_WINDOWS, MAX_WINDOWS = 6, 24
"""Windows are published (one every 2 s) until the kills are over, at least the first, at most
the second many (on a loaded machine the kills take minutes: the backlog stays bounded)."""
STARTED = re.compile(rb"batch (\d+): started")
UNIT_COMMITTED = re.compile(rb"unit \S+: batch (\d+) committed")


def job(config: Config, w: str, counts: str, ck: Path, submit: bool) -> list[str]:
    """The job's command line: under ``substreams submit`` (spark-submit) or as a script."""
    script = str(ROOT / "jobs" / "windowed_counts.py")
    args = ["--substream", w, "--output", counts, "--checkpoint", str(ck),
            "--query-name", "killed", "--trigger", "200 milliseconds"]
    if submit:
        return [sys.executable, "-m", "substreams", "submit", "-c", str(config.path),
                "--master", "local[1]", "--conf", "spark.ui.enabled=false", script, "--", *args]
    return [sys.executable, script, "-c", str(config.path), *args]


def wait_for(pattern: re.Pattern[bytes], log: Path, after: int, proc: subprocess.Popen[bytes],
             timeout: float) -> int:
    """Until ``pattern`` appears in ``log`` past byte ``after``; its first group."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = pattern.search(log.read_bytes(), after)
        if m:
            return int(m.group(1))
        assert proc.poll() is None, f"the job exited early:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no {pattern.pattern!r} in {timeout} s:\n{log.read_text()[-3000:]}")


def test_sigkilled_driver_restarts_and_every_epoch_is_written_once(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2},
         out_stream("counts", "window_count.avsc", partitions=2)],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000},
         {"name": "cw", "stream": "counts", "kind": "epoch", "field": "window"}],
        # The driver is never evicted for silence (test_sink_driver_kill runs with a short
        # timeout); a long one here keeps the input publisher's eviction out of this test.
        acker={"source_timeout_ms": 600_000},
    )
    w, cw = config.substreams[0].name, config.substreams[1].name
    clicks, counts = config.streams[0].name, config.streams[1].name
    ck, log = tmp_path / "ck", tmp_path / "job.log"
    truth: Counter[tuple[int, str]] = Counter()
    rng = random.Random(15)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    stop = threading.Event()

    windows = 0

    def produce() -> None:  # windows keep completing while the job is killed and restarted
        nonlocal windows
        with Application(config).publisher(clicks, "src") as pub:
            while True:
                for c in window_clicks(windows, 3 + windows % 5):
                    pub.publish(c, key=str(c["user"]))
                    truth[(windows, str(c["user"]))] += 1
                pub.seal(w, windows)
                windows += 1
                if windows >= MAX_WINDOWS or (stop.wait(2.0) and windows >= MIN_WINDOWS):
                    return

    kills: list[tuple[int, float]] = []
    with running_acker(config), log.open("ab") as out:
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            for k in range(KILLS):
                start = log.stat().st_size
                proc = subprocess.Popen(job(config, w, counts, ck, submit=k == 0), stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True, env=env)
                try:
                    if k % 2:
                        # right after a task committed its results, before the seal: the
                        # replay must find that task's marker and not write again
                        batch = wait_for(UNIT_COMMITTED, log, start, proc, timeout=300)
                        delay = 0.0
                    else:
                        batch = wait_for(STARTED, log, start, proc, timeout=300)
                        delay = rng.uniform(0.0, 2.5)  # somewhere inside the batch
                        time.sleep(delay)
                    kills.append((batch, delay))
                finally:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                out.write(f"\n===== SIGKILL after batch {batch} started + {delay:.2f} s\n".encode())
                out.flush()
        finally:
            stop.set()
            producer.join(MAX_WINDOWS * 5)
        assert not producer.is_alive()
        # The last restart finishes what is complete (every window is sealed by now): the
        # same job (operator, checkpoint, query name, read path) in this test's session,
        # which is up already -- another JVM start shows nothing the killed ones do not.
        run(load_job("windowed_counts").WindowedCounts(1000), config.path, w, counts,
            checkpoint=ck, once=True, spark=spark, query_name="killed")
        follow_notifications(config, cw, windows, timeout=60)
    text = log.read_text()
    assert len(kills) == KILLS
    # both killed jobs ran the default read (Spark's Kafka source, from_avro), no fallback
    assert text.count("JVM read") >= KILLS and "reads in Python" not in text
    rows = output_rows(config, counts)
    seen = Counter((int(r["window"]), str(r["key"])) for r in rows)
    dup = {k: n for k, n in seen.items() if n > 1}
    assert not dup, f"results written more than once: {dup}; kills {kills}"
    assert {(int(r["window"]), str(r["key"])): int(r["count"]) for r in rows} == dict(truth)
    # downstream: every output window announced once, in order, with exactly its records
    notes = output_epochs(config, cw)
    per_window = Counter(k[0] for k in truth)
    assert [n.time for n in notes] == list(range(windows))
    assert [n.records for n in notes] == [per_window[i] for i in range(windows)]
    # what the kills hit (for the record): replays skipped by the tasks' markers
    print(f"kills (batch, delay s): {kills}; unit skips: "
          f"{len(re.findall('already committed', text))}; sealed replays: "
          f"{len(re.findall('a replay of a sealed batch', text))}")
