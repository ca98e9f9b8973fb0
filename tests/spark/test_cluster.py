"""A real Spark standalone cluster on this machine (master + 2 workers from the PySpark
install): the windowed-counts job submitted to it keeps the firm bound when a worker (and its
executor) is SIGKILLed mid-stream and started again: every window's count once, exact."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from substreams.app import DIRECT, Application
from substreams.spark.cluster import SparkCluster
from tests.conftest import SPARK_GROUP, ConfigFactory
from tests.spark.conftest import output_rows, publish_window, wait_rows
from tests.spark.jobs import ROOT, out_stream

# Its own Spark JVMs (master, workers, driver) and no ``spark`` fixture: the Spark worker's.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group(SPARK_GROUP)]


def stop_job(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group (spark-submit and its driver), SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_windowed_counts_on_a_standalone_cluster_survive_a_killed_worker(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}, out_stream("counts", "window_count.avsc")],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w, clicks, counts = config.substreams[0].name, config.streams[0].name, config.streams[1].name
    log = tmp_path / "job.log"
    truth: Counter[tuple[int, str]] = Counter()
    with SparkCluster(tmp_path / "cluster", workers=2, cores=1, memory="768m") as cluster:
        cmd = [
            sys.executable, "-m", "substreams", "submit", "-c", str(config.path),
            "--master", cluster.url,
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.executor.memory=512m",
            "--conf", "spark.cores.max=2",
            str(ROOT / "jobs" / "windowed_counts.py"), "--",
            "--substream", w, "--output", counts, "--checkpoint", str(tmp_path / "ck"),
            "--query-name", "counts", "--trigger", "500 milliseconds",
        ]
        with (
            Application(config, mechanisms=DIRECT).publisher(clicks, "src") as pub,
            log.open("wb") as out,
        ):

            def publish(window: int, n: int) -> None:
                publish_window(pub, w, window, n, truth)

            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            )
            try:
                for window in range(3):
                    publish(window, 6 + window)
                wait_rows(config, counts, 3, proc, log, timeout=300)
                status = cluster.status() or {}
                apps = status.get("activeapps", [])
                assert apps and apps[0]["cores"] >= 1, status  # the job runs on the cluster
                cluster.kill_worker(0)  # with its executor, mid-stream
                for window in range(3, 6):
                    publish(window, 5)
                cluster.start_worker(0)
                cluster.wait_ready()
                for window in range(6, 8):
                    publish(window, 4)
                wait_rows(config, counts, 8, proc, log, timeout=300)
            finally:
                stop_job(proc)
    text = log.read_text()
    # the default read: Spark's Kafka source and from_avro on the executors, no fallback
    assert "JVM read" in text and "reads in Python" not in text, text[-3000:]
    rows = output_rows(config, counts)
    seen = Counter((int(str(r["window"])), str(r["key"])) for r in rows)
    assert max(seen.values()) == 1, f"duplicated results: {seen}"
    assert {(int(str(r["window"])), str(r["key"])): r["count"] for r in rows} == dict(truth)
