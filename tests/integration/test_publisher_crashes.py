"""The firm bound when publishers crash or hand their source id over (issue: firm bound under
every crash).  Every epoch is notified once, in order, with exactly the records committed at
its time -- "committed" read back from the data topic itself (``read_committed``), so a record
whose report was lost, or a report whose record was lost, shows as a mismatch."""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import IO

import pytest

from substreams.app import Application
from substreams.config import Config
from substreams.control.verify import verify_config
from substreams.frontier import Time
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory
from tests.integration.test_acker import (
    FAST,
    acker,
    check_exactly_once,
    notifications,
    wait_notifications,
)

ROOT = Path(__file__).resolve().parents[2]
EPOCH = {"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}


def committed(config: Config, stream: str) -> dict[Time, list[tuple[str, str]]]:
    """Every committed record of ``stream`` by time: (source, url)."""
    out: dict[Time, list[tuple[str, str]]] = defaultdict(list)
    with Listener(config, stream) as listener:
        for e in listener.entries(idle_timeout=0.5):
            assert isinstance(e, Entry)
            out[int(e.payload["ts"])].append((e.source, str(e.payload["url"])))
    return out


def proc(*args: str, log: IO[bytes] | None = None, stdin: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.procs", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=log if log is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT if log is not None else None,
    )


def spawn(*args: str) -> tuple[subprocess.Popen[bytes], queue.Queue[str]]:
    """A ``procs`` process and the lines it prints, read by a thread as they come."""
    p = proc(*args)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert p.stdout is not None
        for raw in p.stdout:
            lines.put(raw.decode().strip())

    threading.Thread(target=pump, daemon=True).start()
    return p, lines


KILLS = 4
"""Per source: even rounds right after a commit, odd ones at a random moment."""


def test_sigkilled_publishers_restarting_keep_every_epoch_exact(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """Two sources, each SIGKILLed 4 times and restarted with the same source id: half the
    kills at a random moment (before or during a commit), half right after a commit returned.
    ``flush_ms`` 300: a report that waited for a flush timer after its commit (the first
    version) would die with its process.  The simulator (tests/sim) runs thousands of crash
    schedules at every step that can fail; these kills show the same of real processes."""
    acker_cfg = {"heartbeat_ms": 200, "flush_ms": 300}
    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=acker_cfg)
    stream, sub = config.streams[0].name, config.substreams[0].name
    epochs, rng = 30, random.Random(5)
    seeds = iter(range(1000))
    kills = {"after_commit": 0, "random": 0}

    def start(source: str) -> tuple[subprocess.Popen[bytes], queue.Queue[str]]:
        part = "0" if source == "a" else "1"
        args = ("epochs", str(config.path), stream, sub, source, part, str(epochs))
        return spawn(*args, str(next(seeds)))

    def kill_loop(source: str) -> None:
        for i in range(KILLS):
            p, lines = start(source)
            if i % 2:
                time.sleep(rng.uniform(0.6, 2.0))  # import + start take ~0.5 s
                kills["random"] += 1
            else:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        if lines.get(timeout=0.1) == "committed":
                            break
                    except queue.Empty:
                        continue
                kills["after_commit"] += 1
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        last, _ = start(source)  # the last incarnation runs to the end
        assert last.wait(120) == 0

    with acker(config):
        # Both sources exist from the start (a source counts from its Register: one whose
        # every early incarnation died before registering would not hold epoch 0 back).
        for source in ("a", "b"):
            Application(config).publisher(stream, source).abort()  # registered, never unregistered
        threads = [threading.Thread(target=kill_loop, args=(s,)) for s in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        sent = committed(config, stream)
        got = check_exactly_once(config, sub, sent, set(range(epochs)))
    assert kills == {"after_commit": KILLS, "random": KILLS}
    assert sum(n.records for n in got) == sum(len(v) for v in sent.values())
    assert all(r.ok for r in verify_config(config))


class Remote:
    """A publisher in another process (a second incarnation of a source id must be one)."""

    def __init__(self, config: Config, stream: str, source: str) -> None:
        self.p = proc("serve", str(config.path), stream, source, stdin=True)
        assert self.line() == "ready"

    def line(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().decode().strip()

    def do(self, *cmd: object) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(cmd) + "\n").encode())
        self.p.stdin.flush()
        return self.line()

    def kill(self) -> None:
        self.p.kill()
        self.p.wait(10)

    def end(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(20)


@pytest.fixture
def handover(make_config: ConfigFactory) -> tuple[Config, str, str]:
    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=FAST)
    return config, config.streams[0].name, config.substreams[0].name


def settled(config: Config, sub: str, count: int, seconds: float = 1.5) -> None:
    """Nothing beyond ``count`` notifications within ``seconds``."""
    time.sleep(seconds)
    assert len(notifications(config, sub)) == count


def test_handover_a_fenced_old_process_closing_cannot_unregister_the_source(
    handover: tuple[Config, str, str],
) -> None:
    config, stream, sub = handover
    with acker(config):
        old = Remote(config, stream, "src")
        assert old.do("publish", "/old", 0) == "ok" and old.do("flush") == "ok"
        new = Remote(config, stream, "src")  # takes the source id over
        assert new.do("publish", "/new", 0) == "ok" and new.do("flush") == "ok"
        assert old.do("close").startswith("error PublisherFencedError")
        old.end()
        settled(config, sub, 0)  # the new incarnation has not sealed 0
        assert new.do("seal", sub, 0) == "ok"
        [note] = wait_notifications(config, sub, 1)
        new.do("close")
        new.end()
    assert note.time == 0 and note.records == 2
    check_exactly_once(config, sub, committed(config, stream), {0})


def test_handover_b_a_committed_record_of_the_old_process_is_in_its_epoch(
    make_config: ConfigFactory,
) -> None:
    """``flush_ms`` 5 s: a report that waited for a flush timer (the first version's agent)
    would come after the new incarnation's seal; one committed with its record cannot."""
    acker_cfg = {"heartbeat_ms": 200, "flush_ms": 5000}
    config = make_config([{"name": "clicks", "partitions": 2}], [EPOCH], acker=acker_cfg)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config):
        old = Remote(config, stream, "src")
        assert old.do("publish", "/old", 0) == "ok" and old.do("flush") == "ok"
        new = Remote(config, stream, "src")  # right after the commit: no time for a timer
        assert new.do("seal", sub, 0) == "ok"
        wait_notifications(config, sub, 1)
        old.end()
        new.do("close")
        new.end()
    check_exactly_once(config, sub, committed(config, stream), {0})
    assert committed(config, stream)[0] == [("src", "/old")]


def test_handover_c_old_process_killed_right_after_flush(
    handover: tuple[Config, str, str],
) -> None:
    config, stream, sub = handover
    with acker(config):
        old = Remote(config, stream, "src")
        assert old.do("publish", "/old", 0) == "ok" and old.do("flush") == "ok"
        old.kill()
        new = Remote(config, stream, "src")
        assert new.do("publish", "/new", 1) == "ok" and new.do("seal", sub, 1) == "ok"
        wait_notifications(config, sub, 2)
        new.do("close")
        new.end()
    got = check_exactly_once(config, sub, committed(config, stream), {0, 1})
    assert [n.records for n in got] == [1, 1]


def test_handover_d_fenced_seal_raises_and_the_new_incarnation_goes_on(
    handover: tuple[Config, str, str],
) -> None:
    config, stream, sub = handover
    with acker(config):
        old = Remote(config, stream, "src")
        for t in range(3):  # the old incarnation's sequence numbers run ahead
            assert old.do("publish", f"/old{t}", t) == "ok" and old.do("seal", sub, t) == "ok"
        wait_notifications(config, sub, 3)
        new = Remote(config, stream, "src")
        answer = old.do("seal", sub, 3)  # no records: the seal alone must meet the fence
        assert answer.startswith("error PublisherFencedError"), answer
        old.end()
        for t in range(3, 6):
            assert new.do("publish", f"/new{t}", t) == "ok" and new.do("seal", sub, t) == "ok"
        wait_notifications(config, sub, 6)
        new.do("close")
        new.end()
    got = check_exactly_once(config, sub, committed(config, stream), set(range(6)))
    assert [n.records for n in got] == [1] * 6
