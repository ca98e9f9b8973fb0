"""Source liveness: a dead or stopped source blocks no substream for longer than
``acker.source_timeout_ms``; it is fenced before the acker stops waiting for it, so a stopped
process that resumes cannot commit into an epoch already notified; evictions are on the
record (hash-chained control topic); an operator can evict by hand."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from substreams.app import Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import SourceEvicted
from substreams.control.verify import verify_config
from tests.applied import acks_applied
from tests.conftest import ConfigFactory
from tests.integration.test_acker import check_exactly_once, notifications, wait_notifications
from tests.integration.test_publisher_crashes import EPOCH, Remote, committed

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 2500
LIVENESS = {"heartbeat_ms": 200, "source_heartbeat_ms": 300, "source_timeout_ms": TIMEOUT_MS}


def evictions(config: Config, sub: str) -> list[SourceEvicted]:
    topic = config.acker.control_topic(sub)
    return [
        r.body
        for _, r in read_control(config.kafka.bootstrap, topic)
        if isinstance(r.body, SourceEvicted)
    ]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "substreams", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )


def test_a_dead_source_blocks_no_longer_than_the_timeout(make_config: ConfigFactory) -> None:
    from tests.integration.test_acker import acker

    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=LIVENESS)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config), Application(config).publisher(stream, "live") as live:
        dead = Remote(config, stream, "dead")
        assert dead.do("publish", "/dead", 0) == "ok" and dead.do("flush") == "ok"
        live.publish({"user": "l", "url": "/live", "ts": 0})
        live.seal(sub, 0)
        acks_applied(config)
        assert notifications(config, sub) == []  # the live heartbeating 'dead' holds 0 back
        dead.kill()
        killed = time.monotonic()
        [note] = wait_notifications(config, sub, 1, timeout=TIMEOUT_MS / 1000 + 15)
        waited = time.monotonic() - killed
        live.publish({"user": "l", "url": "/later", "ts": 1})
        live.seal(sub, 1)  # the evicted source holds nothing back any more
        wait_notifications(config, sub, 2)
    assert TIMEOUT_MS / 1000 - 0.5 < waited < TIMEOUT_MS / 1000 + 10, waited
    assert note.records == 2  # the dead source's committed record is in its epoch
    check_exactly_once(config, sub, committed(config, stream), {0, 1})
    [ev] = evictions(config, sub)
    assert ev.source == "dead" and "silent" in ev.reason
    assert all(r.ok for r in verify_config(config))


def test_a_stopped_source_is_fenced_before_its_epochs_close(make_config: ConfigFactory) -> None:
    """SIGSTOP with a record in an open transaction: evicted after the timeout, its open
    transaction aborted by the fence; resumed, it cannot commit (PublisherFencedError) and
    its record never appears, in the epoch or in the topic."""
    from tests.integration.test_acker import acker

    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=LIVENESS)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config), Application(config).publisher(stream, "live") as live:
        zombie = Remote(config, stream, "zombie")
        assert zombie.do("publish", "/zombie", 0) == "ok"  # in an open transaction
        zombie.p.send_signal(signal.SIGSTOP)
        live.publish({"user": "l", "url": "/live", "ts": 0})
        live.seal(sub, 0)
        [note] = wait_notifications(config, sub, 1, timeout=TIMEOUT_MS / 1000 + 15)
        zombie.p.send_signal(signal.SIGCONT)
        answer = zombie.do("flush")
        zombie.kill()
    assert answer.startswith("error PublisherFencedError"), answer
    assert note.records == 1
    assert committed(config, stream) == {0: [("live", "/live")]}
    check_exactly_once(config, sub, committed(config, stream), {0})


def test_evict_source_by_hand_and_list_sources(make_config: ConfigFactory) -> None:
    from tests.integration.test_acker import acker

    config = make_config(
        [{"name": "clicks", "partitions": 2}], [EPOCH],
        acker={**LIVENESS, "source_timeout_ms": 600_000},
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config), Application(config).publisher(stream, "live") as live:
        # registered, never sealing, never leaving
        Application(config).publisher(stream, "gone").abort()
        live.publish({"user": "l", "url": "/live", "ts": 0})
        live.seal(sub, 0)
        acks_applied(config)  # both registered, 0 sealed by live only
        listed = cli("acker", "sources", "-c", str(config.path))
        assert listed.returncode == 0, listed.stderr
        assert "gone" in listed.stdout and "live" in listed.stdout
        assert notifications(config, sub) == []
        out = cli("acker", "evict-source", "-c", str(config.path), "gone", "--reason", "drill")
        assert out.returncode == 0, out.stderr
        wait_notifications(config, sub, 1)
        time.sleep(0.5)
        after = cli("acker", "sources", "-c", str(config.path))
    assert "evicted" in after.stdout
    [ev] = evictions(config, sub)
    assert ev.source == "gone" and ev.reason == "evicted by hand: drill"


def test_a_spark_driver_is_never_evicted_for_silence(make_config: ConfigFactory) -> None:
    """A Spark query's driver (a ``BatchSink``) registers as never evicted for silence: a
    crashed driver must hold back the output times its tasks wrote in part until it is
    restarted and seals them.  Beside it an ordinary silent source is evicted as usual;
    the driver is listed as 'silent (kept)' and an operator's order evicts it."""
    from substreams.spark.sink import BatchSink
    from tests.integration.test_acker import acker

    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=LIVENESS)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config), Application(config).publisher(stream, "live") as live:
        driver = BatchSink(config, stream, "spark.q", config.kafka.bootstrap)
        Application(config).publisher(stream, "gone").abort()  # silent, evictable
        live.publish({"user": "l", "url": "/live", "ts": 0})
        live.seal(sub, 0)
        driver.publisher.abort()  # the driver goes silent: as if SIGKILLed
        deadline = time.monotonic() + TIMEOUT_MS / 1000 + 15
        while not evictions(config, sub) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * TIMEOUT_MS / 1000)  # the driver is silent for 3x the timeout now
        acks_applied(config)  # and the acker has read (and judged) past that moment
        assert [e.source for e in evictions(config, sub)] == ["gone"]
        assert notifications(config, sub) == []  # the silent driver holds epoch 0
        listed = cli("acker", "sources", "-c", str(config.path))
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.splitlines() if "spark.q" in line)
        assert "silent (kept)" in row, listed.stdout
        out = cli("acker", "evict-source", "-c", str(config.path), "spark.q", "--reason", "gone")
        assert out.returncode == 0, out.stderr
        [note] = wait_notifications(config, sub, 1)
    assert note.time == 0 and note.records == 1
    assert [e.source for e in evictions(config, sub)] == ["gone", "spark.q"]
