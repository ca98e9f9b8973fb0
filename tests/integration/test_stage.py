"""Stages tracked by the acker: the firm bound across a pipeline, and a cycle terminating."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from substreams.acker.stage import Stage, Transform
from substreams.app import Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import completions
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory
from tests.integration.test_acker import FAST, acker, check_exactly_once, wait_notifications


@contextmanager
def running(config: Config, name: str, transform: Transform) -> Iterator[Stage]:
    stop = threading.Event()
    stage = Stage(config, name, transform)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            stage.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield stage
    finally:
        stop.set()
        thread.join(20)
    if errors:
        raise errors[0]


def twice(entry: Entry) -> Iterable[Mapping[str, Any]]:
    p = entry.payload
    return [{**p, "url": f"{p['url']}#a"}, {**p, "url": f"{p['url']}#b"}]


def test_firm_bound_across_a_two_stage_pipeline(make_config: ConfigFactory) -> None:
    config = make_config(
        [
            {"name": "clicks", "partitions": 4},
            {"name": "mid", "partitions": 2},
            {"name": "out", "partitions": 3},
        ],
        [{"name": "s", "stream": "clicks", "kind": "tumbling", "field": "ts", "size_ms": 10}],
        [{"name": "one", "input": "clicks", "output": "mid"},
         {"name": "two", "input": "mid", "output": "out"}],
        acker=FAST,
    )
    clicks, sub = config.streams[0].name, config.substreams[0].name
    rng = random.Random(5)
    sent: dict[Any, list[tuple[str, str]]] = {}
    with acker(config), running(config, config.stages[0].name, twice), \
            running(config, config.stages[1].name, twice):
        pubs = [Application(config).publisher(clicks, f"src{i}", batch_size=9) for i in range(3)]
        ts = [0, 0, 0]
        for n in range(120):
            i = rng.randrange(3)
            prev = ts[i] // 10
            ts[i] += rng.choice([0, 1, 4])
            if ts[i] // 10 != prev and n:
                pubs[i].seal(sub, prev)
            pubs[i].publish({"user": "u", "url": f"/r{n}", "ts": ts[i]})
            # every input becomes four outputs, written by stage 'two'
            out = sent.setdefault(ts[i] // 10, [])
            src = f"stage.{config.stages[1].name}"
            out += [(src, f"/r{n}#{x}#{y}") for x in "ab" for y in "ab"]
        for i, pub in enumerate(pubs):
            pub.seal(sub, ts[i] // 10)
            pub.close()
        got = check_exactly_once(config, sub, sent, set(sent))
    # the notification names the terminal stream only: the sink of the segment
    assert {r.stream for n in got for r in n.ranges} == {config.streams[2].name}


def test_a_cycle_terminates(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        [{"name": "loop", "input": "clicks", "output": "clicks"}],
        acker=FAST,
    )
    clicks, sub = config.streams[0].name, config.substreams[0].name

    last_hop: dict[int, float] = {}

    def hop(entry: Entry) -> Iterable[Mapping[str, Any]]:
        n = int(entry.payload["user"])
        time.sleep(0.005)  # slow hops: an early termination would show
        if n >= 3:
            last_hop[entry.payload["ts"]] = time.time() * 1000
            return []
        return [{**entry.payload, "user": str(n + 1)}]

    with acker(config), running(config, config.stages[0].name, hop):
        with Application(config).publisher(clicks, "src") as pub:
            for t in range(4):
                for k in range(5):
                    pub.publish({"user": "0", "url": f"/{t}/{k}", "ts": t})
                pub.seal(sub, t)
        got = wait_notifications(config, sub, 4)
        assert [n.time for n in got] == [0, 1, 2, 3]
        assert all(n.ranges == () and n.records == 0 for n in got)  # no terminal stream
        # each time terminated only after its last hop was processed
        written = {
            note.time: rec.written_at_ms
            for _, rec in read_control(config.kafka.bootstrap, config.acker.control_topic(sub))
            for note in completions(rec.body)
        }
        assert all(written[t] >= last_hop[t] for t in range(4)), (written, last_hop)
        with Listener(config, clicks) as listener:
            hops = sorted(e.payload["user"] for e in listener.entries(idle_timeout=0.5)
                          if isinstance(e, Entry))
        assert hops == sorted(str(h) for h in range(4) for _ in range(20))


def test_sigkilled_stages_restart_exactly_once(make_config: ConfigFactory) -> None:
    """A two-stage pipeline whose stages are SIGKILLed 12 times at random and restarted: a
    restarted stage resumes from the input positions committed with its outputs, so the
    sink holds every output once and every epoch is exact."""
    import signal
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    config = make_config(
        [
            {"name": "clicks", "partitions": 2},
            {"name": "mid", "partitions": 2},
            {"name": "out", "partitions": 2},
        ],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        [{"name": "one", "input": "clicks", "output": "mid"},
         {"name": "two", "input": "mid", "output": "out"}],
        acker=FAST,
    )
    clicks, sub, out = config.streams[0].name, config.substreams[0].name, config.streams[2].name
    root = Path(__file__).resolve().parents[2]
    names = [st.name for st in config.stages]

    def start(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.procs", "stage", str(config.path), name],
            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    rng = random.Random(3)
    sent: dict[Any, list[tuple[str, str]]] = {}
    epochs, kills = 24, 0
    with acker(config):
        procs = {n: start(n) for n in names}
        with Application(config).publisher(clicks, "src", batch_size=3) as pub:
            for t in range(epochs):
                for k in range(rng.randint(1, 4)):
                    pub.publish({"user": "u", "url": f"/{t}/{k}", "ts": t})
                    src = f"stage.{names[1]}"
                    sent.setdefault(t, []).extend(
                        (src, f"/{t}/{k}#{x}#{y}") for x in "ab" for y in "ab"
                    )
                pub.seal(sub, t)
                if t % 2:
                    victim = rng.choice(names)
                    time.sleep(rng.uniform(0.0, 0.4))
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait(10)
                    kills += 1
                    procs[victim] = start(victim)
        try:
            got = check_exactly_once(config, sub, sent, set(range(epochs)))
        finally:
            for p in procs.values():
                p.terminate()
                p.wait(20)
    assert kills == 12
    with Listener(config, out) as listener:
        urls = Counter(
            e.payload["url"] for e in listener.entries(idle_timeout=0.5) if isinstance(e, Entry)
        )
    assert set(urls.values()) == {1}, [u for u, c in urls.items() if c > 1][:5]
    assert sum(urls.values()) == sum(len(v) for v in sent.values()) == sum(n.records for n in got)
