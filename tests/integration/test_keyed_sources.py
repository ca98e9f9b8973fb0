"""Keyed substreams written by several sources that share keys (issue: firm bound under
every crash, item 5).  Sessions are cut by the acker from the union of every source's keyed
event times; a source closes keys it never wrote with its keyed seal (the watermark); a
SIGKILLed publisher restarts with no session state to recover."""

from __future__ import annotations

import queue
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

from substreams.app import Application
from substreams.config import Config
from substreams.control.messages import EpochComplete
from substreams.control.ranges import read_ranges
from substreams.control.verify import verify_config
from substreams.frontier import Keyed, sort_key
from substreams.frontier.sessions import session_runs
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.applied import acks_applied
from tests.conftest import ConfigFactory
from tests.integration.test_acker import AckerThread, acker, notifications, wait_notifications
from tests.integration.test_publisher_crashes import spawn

GAP = 50
SESSION = {
    "name": "s", "stream": "clicks", "kind": "session", "key": "user", "field": "ts",
    "gap_ms": GAP,
}  # fmt: skip
SOURCES = ("a", "b", "c", "d")


def committed_by_key(config: Config, stream: str) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = defaultdict(list)
    with Listener(config, stream) as listener:
        for e in listener.entries(idle_timeout=0.5):
            assert isinstance(e, Entry)
            out[str(e.payload["user"])].append(e)
    return out


def check_sessions(config: Config, sub: str, data: dict[str, list[Entry]]) -> list[EpochComplete]:
    """Every session of the union of the committed records notified once, a key's sessions in
    start order, each with exactly its records (in memory and through ``read_ranges``)."""
    expected: dict[tuple[Keyed, Keyed], list[tuple[str, str]]] = {}
    for key, entries in data.items():
        for start, end in session_runs([int(e.payload["ts"]) for e in entries], GAP):
            expected[(Keyed(key, start), Keyed(key, end))] = sorted(
                (e.source, str(e.payload["url"]))
                for e in entries
                if start <= int(e.payload["ts"]) <= end
            )
    got = wait_notifications(config, sub, len(expected), timeout=60)
    spans = [(n.time, n.until) for n in got]
    assert len(spans) == len(set(spans)), "each session exactly once"
    assert set(spans) == set(expected), "the sessions of the union of every source's records"
    for key in data:
        starts = [n.time for n in got if isinstance(n.time, Keyed) and n.time.key == key]
        assert starts == sorted(starts, key=sort_key), f"sessions of {key} in start order"
    index = {(e.stream, e.partition, e.index): e for es in data.values() for e in es}
    for n in got:
        assert n.until is not None
        inside = sorted(
            (e.source, str(e.payload["url"]))
            for (stream, p, i), e in index.items()
            for r in n.ranges
            if (r.stream, r.partition) == (stream, p)
            and r.start <= i < r.end
            and n.covers(e.times[sub])
        )
        assert inside == expected[(n.time, n.until)], n
        assert n.records == len(inside)
    for n in random.Random(1).sample(got, min(4, len(got))):
        entries = read_ranges(config.kafka.bootstrap, config, n.ranges, sub, n.time, until=n.until)
        assert (
            sorted((e.source, str(e.payload["url"])) for e in entries)
            == expected[(n.time, n.until)]
        )
    return got


def test_four_sources_sharing_keys_close_each_session_once_through_sigkills(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """Four sources write users u0..u3 (every source every user) into their own partitions;
    each is SIGKILLed 3 times at a random moment and restarted with the same source id (it
    resumes after its last committed record and recovers nothing else), and the acker
    itself is stopped and restarted from its checkpoint halfway."""
    config = make_config([{"name": "clicks", "partitions": 4}], [SESSION])
    stream, sub = config.streams[0].name, config.substreams[0].name
    rng = random.Random(11)
    kills = []

    def start(i: int) -> tuple[subprocess.Popen[bytes], queue.Queue[str]]:
        return spawn("sessions", str(config.path), stream, SOURCES[i], str(i), "60", str(100 + i))

    def kill_loop(i: int) -> None:
        for _ in range(3):
            p, lines = start(i)
            # Mid-run by construction: after its first commit of this run (a process that
            # starts fast can otherwise finish its records before a fixed delay is up), then
            # a random moment later, inside or between transactions.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if lines.get(timeout=0.1) in ("committed", "done"):
                        break
                except queue.Empty:
                    continue
            time.sleep(rng.uniform(0, 0.05))
            if p.poll() is None:  # still publishing: a kill mid-run
                kills.append(SOURCES[i])
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        last, _ = start(i)
        assert last.wait(180) == 0

    first = AckerThread(config)
    first.__enter__()
    try:
        for source in SOURCES:  # every source counts from the start
            Application(config).publisher(stream, source).abort()
        threads = [threading.Thread(target=kill_loop, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(4)
    finally:
        first.__exit__(None, None, None)
    assert first.error is None
    with acker(config):  # from the checkpoint: keyed seals and open sessions included
        for t in threads:
            t.join(300)
        data = committed_by_key(config, stream)
        got = check_sessions(config, sub, data)
    shared = [
        n for n in got
        if len({e.source for es in data.values() for e in es if n.covers(e.times[sub])}) > 1
    ]  # fmt: skip
    assert shared, "some sessions hold records of several sources (the point of the test)"
    assert len(kills) == 12
    assert sum(n.records for n in got) == sum(len(v) for v in data.values())
    assert {e.source for es in data.values() for e in es} == set(SOURCES)
    assert all(r.ok for r in verify_config(config))


def test_per_key_substreams_close_only_when_every_sharing_source_sealed_them(
    make_config: ConfigFactory,
) -> None:
    """A per-key substream closes when every source sealed its key -- one by one, or all at
    once with the keyed seal, also for keys that source never wrote."""
    spec = {"name": "p", "stream": "clicks", "kind": "per_key", "key": "user"}
    config = make_config([{"name": "clicks", "partitions": 4}], [spec])
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config):
        pubs = {s: Application(config).publisher(stream, s) for s in SOURCES}
        try:
            for i, s in enumerate(SOURCES[:3]):  # d writes nothing
                for user in ("x", "y")[: 1 + i % 2]:
                    pubs[s].publish({"user": user, "url": f"/{s}", "ts": i}, partition=i)
                pubs[s].flush()
            for s in SOURCES[:3]:
                pubs[s].seal(sub, Keyed("x", 0), commit=False)
                pubs[s].seal(sub, Keyed("y", 0))
            acks_applied(config)
            assert notifications(config, sub) == [], "d has not sealed x or y"
            pubs["d"].seal(sub, Keyed("y", 0))
            [y] = wait_notifications(config, sub, 1)
            assert (y.time, y.records) == (Keyed("y", 0), 1)  # b wrote y
            pubs["d"].seal_keys(sub, 0)  # every key, x included, which d never wrote
            got = wait_notifications(config, sub, 2)
            assert [(n.time, n.records) for n in got] == [(Keyed("y", 0), 1), (Keyed("x", 0), 3)]
        finally:
            for p in pubs.values():
                p.close()
