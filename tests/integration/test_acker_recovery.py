"""Acker fault tolerance: SIGKILL at random points and restarts, and a standby taking over."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from substreams.acker.service import checkpoint_topic
from substreams.app import Application
from substreams.control.verify import verify_config
from substreams.frontier import Time
from tests.conftest import ConfigFactory
from tests.integration.test_acker import (
    AckerThread,
    acker,
    check_exactly_once,
    notifications,
    verify_chains,
    wait_notifications,
)

SUBSTREAM = {"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}


def test_sigkill_and_restart_loses_and_duplicates_nothing(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 4}],
        [SUBSTREAM],
        acker={"heartbeat_ms": 100, "flush_ms": 2},
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    rng = random.Random(11)
    sent: dict[Time, list[tuple[str, str]]] = {}
    done = threading.Event()
    errors: list[BaseException] = []

    def workload() -> None:
        try:
            pubs = [
                Application(config).publisher(stream, f"src{i}", batch_size=5) for i in range(3)
            ]
            for epoch in range(80):
                for i, pub in enumerate(pubs):
                    for k in range(rng.randrange(4)):
                        url = f"/{epoch}/{i}/{k}"
                        pub.publish({"user": "u", "url": url, "ts": epoch})
                        sent.setdefault(epoch, []).append((f"src{i}", url))
                    pub.seal(sub, epoch)
                time.sleep(0.2)
            for pub in pubs:
                pub.close()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    log_path = tmp_path / "acker.log"
    log = log_path.open("ab")
    cmd = [sys.executable, "-m", "substreams", "--log-level", "INFO", "acker", "run", "-c",
           str(config.path)]

    def started(since: int) -> bool:
        """The acker process logged its start after byte ``since`` of the log (or 30 s
        passed): kills count from there, not from a process start slowed down by load."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b"' started in " in log_path.read_bytes()[since:]:
                return True
            time.sleep(0.05)
        return False

    thread = threading.Thread(target=workload, daemon=True)
    thread.start()
    kills = 0
    seen = []
    try:
        while not done.is_set() or kills < 10:
            log.flush()
            since = log_path.stat().st_size
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            assert started(since), log_path.read_text(errors="replace")[-2000:]
            time.sleep(rng.uniform(0.3, 1.5))
            proc.kill()
            proc.wait(10)
            kills += 1
            seen.append(len(notifications(config, sub)))
        thread.join(30)
        assert not errors, errors
        log.flush()
        since = log_path.stat().st_size
        final = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            check_exactly_once(config, sub, sent, set(range(80)))
        finally:
            # A SIGTERM before the process installed its handler (still importing: the
            # notifications may all be there already) kills it; the clean stop is what
            # this checks.
            assert started(since), log_path.read_text(errors="replace")[-2000:]
            final.terminate()
            assert final.wait(20) == 0
    finally:
        log.close()
    assert kills >= 10
    # Kills landed mid-stream (the acker had notified some, not all) at two points at least:
    # how many depends on the machine's load (a loaded one makes progress in larger jumps).
    assert len({n for n in seen if 0 < n < 80}) >= 2, f"kills between progress: {seen}"
    assert all(r.ok for r in verify_config(config)), [r.broken for r in verify_config(config)]
    verify_chains(config, [checkpoint_topic(config)])


def test_standby_takes_over_when_the_active_acker_stops(make_config: ConfigFactory) -> None:
    acker_cfg: dict[str, Any] = {"heartbeat_ms": 100, "standby_timeout_ms": 800, "flush_ms": 2}
    config = make_config([{"name": "clicks", "partitions": 2}], [SUBSTREAM], acker=acker_cfg)
    stream, sub = config.streams[0].name, config.substreams[0].name
    active = AckerThread(config)
    with Application(config).publisher(stream, "a") as pub, active:
        for t in range(5):
            pub.publish({"user": "u", "url": f"/{t}", "ts": t})
            pub.seal(sub, t)
        assert len(wait_notifications(config, sub, 5)) == 5  # the active one is up
        with acker(config, standby=True) as standby:
            time.sleep(1.5)
            assert not standby.service.started  # heartbeats keep it waiting
            active.stop.set()
            active.thread.join(10)
            assert active.error is None
            for t in range(5, 10):
                pub.publish({"user": "u", "url": f"/{t}", "ts": t})
                pub.seal(sub, t)
            got = wait_notifications(config, sub, 10)
            assert standby.service.started
    assert [n.time for n in got] == list(range(10))
    verify_chains(config, [config.acker.control_topic(sub), checkpoint_topic(config)])
