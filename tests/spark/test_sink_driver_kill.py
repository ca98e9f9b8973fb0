"""The streaming sink survives SIGKILLs of its driver: ``tests/spark/sink_job.py`` (read ->
count per url -> ``writeStream.format("substreams")``) is killed at a random moment once it
wrote, while windows keep completing, and restarted from the same checkpoint (in the test's
own SparkSession: a driver other than the killed one, of the same query); then every
(window, url) count is in the output exactly once and exact, and the output substream
announces every window once, in order, with exactly its results."""

from __future__ import annotations

import os
import random
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
from substreams.control.follower import RAISE, ControlFollower
from substreams.control.io import read_control
from substreams.control.messages import SourceEvicted, completions
from tests.conftest import ConfigFactory, follow_notifications
from tests.spark.conftest import output_epochs, output_rows, running_acker, window_clicks
from tests.spark.jobs import ROOT, out_stream
from tests.spark.sink_job import start

pytestmark = pytest.mark.spark

KILLS = 1
WINDOWS = 8
TIMEOUT_MS = 5000
SILENT_S = TIMEOUT_MS / 1000 + 1.5
"""How long the killed driver stays dead: past the acker's source timeout (+ a heartbeat's
slack), so that a restart that came too soon cannot hide an eviction for silence."""


def job(config: Config, ck: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "spark" / "sink_job.py"), str(config.path),
            config.substreams[0].name, config.streams[1].name, str(ck), "killed-sink", *extra]


def wait_written(config: Config, substream: str, count: int, proc: subprocess.Popen[bytes],
                 log: Path, timeout: float) -> None:
    """Until ``substream``'s control topic holds ``count`` EpochCompletes: one tail read as
    they come, failing at once when the job exits."""
    deadline = time.monotonic() + timeout
    seen = 0
    with ControlFollower(config.kafka.bootstrap, config, name="test: written", on_bad=RAISE,
                         verify=False) as tail:
        tail.assign({config.acker.control_topic(substream): 0})
        while seen < count:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            for followed in tail.poll_batch(0.2):  # a corrupt record raises, with its offset
                seen += len(completions(followed.record.body))


def test_sigkilled_sink_driver_restarts_and_every_result_is_written_once(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2},
         out_stream("url_counts", "url_count.avsc", partitions=2)],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000},
         {"name": "uw", "stream": "url_counts", "kind": "epoch", "field": "window"}],
        # Far shorter than a driver's restart: the killed driver is silent past it every
        # time, and must be waited for (never evicted for silence), not evicted.
        acker={"source_timeout_ms": TIMEOUT_MS, "source_heartbeat_ms": 500},
    )
    w, uw = config.substreams[0].name, config.substreams[1].name
    clicks, url_counts = config.streams[0].name, config.streams[1].name
    ck, log = tmp_path / "ck", tmp_path / "job.log"
    truth: Counter[tuple[int, str]] = Counter()
    rng = random.Random(15)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    stop, sealed, killed = threading.Event(), threading.Event(), threading.Event()

    def produce() -> None:
        """Windows complete while the job runs (one every 4 s) and while it is dead (the
        rest, at once after the kill: nothing more to wait for)."""
        with Application(config).publisher(clicks, "src") as pub:
            for window in range(WINDOWS):
                for c in window_clicks(window, 3 + window % 5):
                    pub.publish(c, key=str(c["user"]))
                    truth[(window, str(c["url"]))] += 1
                pub.seal(w, window)
                pub.flush()
                if stop.wait(0.0 if killed.is_set() else 4.0):
                    break
            sealed.set()
            stop.wait()  # keep the source registered until the end (its times stay open)

    kills: list[tuple[int, float]] = []
    killed_at = 0.0
    with running_acker(config), log.open("ab") as out:
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            for _ in range(KILLS):
                before = len(output_epochs(config, uw))
                proc = subprocess.Popen(job(config, ck), stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=env)
                try:
                    wait_written(config, uw, before + 1, proc, log, timeout=300)  # kill it soon
                    delay = rng.uniform(0.0, 3.0)
                    time.sleep(delay)
                    kills.append((len(output_epochs(config, uw)), delay))
                finally:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                    killed_at = time.monotonic()
                    killed.set()
                out.write(f"\n===== SIGKILL after {kills[-1]}\n".encode())
                out.flush()
            assert sealed.wait(WINDOWS * 5)
            # Dead past the source timeout before it restarts: the acker must wait for it.
            time.sleep(max(0.0, killed_at + SILENT_S - time.monotonic()))
            # The restart (the same query: same checkpoint, same query name) runs in this
            # test's session, which is up already: another JVM start shows nothing more.
            again = start(spark, config, w, url_counts, str(ck), "killed-sink", once=True)
            assert again.awaitTermination(400), "the restarted query did not finish"
            assert again.exception() is None, again.exception()
            follow_notifications(config, uw, WINDOWS, timeout=60)
            rows = output_rows(config, url_counts)
            notes = output_epochs(config, uw)
        finally:
            stop.set()
            producer.join(30)
    assert len(kills) == KILLS
    seen = Counter((int(r["window"]), str(r["url"])) for r in rows)
    dup = {k: n for k, n in seen.items() if n > 1}
    assert not dup, f"results written more than once: {dup}; kills {kills}"
    assert {(int(r["window"]), str(r["url"])): int(r["clicks"]) for r in rows} == dict(truth)
    per_window = Counter(k[0] for k in truth)
    assert [n.time for n in notes] == list(range(WINDOWS))
    assert [n.records for n in notes] == [per_window[i] for i in range(WINDOWS)]
    # Silent past the timeout at every kill, the driver was waited for, never evicted.
    evicted = [r.body.source for _, r in read_control(
        config.kafka.bootstrap, config.acker.control_topic(uw), config
    ) if isinstance(r.body, SourceEvicted)]
    assert evicted == [], evicted
    print(f"kills (output epochs seen, delay s): {kills}; unit skips: "
          f"{log.read_text().count('already committed')}")
