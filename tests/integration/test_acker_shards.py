"""Sharded ackers on a real broker, as separate `substreams acker run --shard` processes:

- two shards, a workload running, shard 0's acker SIGKILLed: its standby takes over, every
  substream is notified exactly once and in order, and shard 1's notifications keep coming
  while shard 0 is down;
- one shard becomes two while a workload runs (``--from-shards 1``, the old acker still
  running: it is fenced and retired): exactly once and in order through the change of owner,
  each control topic written by one owner at a time;
- every shard serves the command protocol: `acker status|epochs|peek` show both shards'
  substreams, and a stopped shard is named rather than left out.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from substreams.acker.protocol import segment_partition
from substreams.app import Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import completions
from substreams.control.verify import verify_config
from substreams.frontier import Time
from tests.conftest import ConfigFactory, follow_each
from tests.integration.test_acker import (
    acker,
    check_exactly_once,
    wait_notifications,
)
from tests.integration.test_source_liveness import cli, evictions

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
EPOCHS = 60


def sharded_config(make_config: ConfigFactory, acker: dict[str, Any]) -> Config:
    """Four epoch substreams over one stream, two on each shard of a two-shard layout
    (names carry a random suffix, so draw until they spread)."""
    for _ in range(20):
        config = make_config(
            [{"name": "clicks", "partitions": 2}],
            [{"name": f"s{i}", "stream": "clicks", "kind": "epoch", "field": "ts"}
             for i in range(4)],
            acker={"acks_partitions": PARTITIONS, "heartbeat_ms": 100, "flush_ms": 2, **acker},
            create=False,
        )
        shards = [shard_of(config, s.name) for s in config.substreams]
        if shards.count(0) == 2:
            from substreams.kafka import client
            from substreams.kafka.topics import ensure_topics

            ensure_topics(client.admin(config.kafka.bootstrap), config.topics())
            return config
    raise AssertionError("no spread of substream names over two shards in 20 draws")


def shard_of(config: Config, sub: str, shards: int = 2) -> int:
    return segment_partition(sub, config.acker.acks_partitions) % shards


class Workload:
    """Three sources publish epochs 0..EPOCHS-1 (1-3 records each per epoch) and seal every
    substream after each epoch, one epoch every ``pace`` seconds."""

    def __init__(self, config: Config, pace: float = 0.08) -> None:
        self.config = config
        self.pace = pace
        self.sent: dict[Time, list[tuple[str, str]]] = {}
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.epoch = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(5)
        stream = self.config.streams[0].name
        subs = [s.name for s in self.config.substreams]
        try:
            pubs = [
                Application(self.config).publisher(stream, f"src{i}", batch_size=50)
                for i in range(3)
            ]
            for epoch in range(EPOCHS):
                self.epoch = epoch
                for i, pub in enumerate(pubs):
                    for k in range(rng.randint(1, 3)):
                        url = f"/{epoch}/{i}/{k}"
                        pub.publish({"user": "u", "url": url, "ts": epoch}, partition=i % 2)
                        self.sent.setdefault(epoch, []).append((f"src{i}", url))
                    for sub in subs:
                        pub.seal(sub, epoch, commit=sub == subs[-1])
                time.sleep(self.pace)
            for pub in pubs:
                pub.close()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.done.set()

    def __enter__(self) -> Workload:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(120)


class Acker:
    """One `substreams acker run` process, its output in a log file."""

    def __init__(self, config: Config, log: Path, *args: str) -> None:
        self.log = log
        self.handle = log.open("ab")
        cmd = [sys.executable, "-m", "substreams", "--log-level", "INFO", "acker", "run",
               "-c", str(config.path), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.handle, stderr=subprocess.STDOUT, cwd=ROOT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 60.0) -> float:
        """Wait until the log holds ``needle``; the time.time() it was seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return time.time()
            assert self.proc.poll() is None, self.text()[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"{self.log.name}: no {needle!r} in {timeout} s:\n"
                             + self.text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.handle.close()


@contextmanager
def ackers() -> Iterator[list[Acker]]:
    started: list[Acker] = []
    try:
        yield started
    finally:
        for a in started:
            a.stop()


def written(config: Config, sub: str) -> list[tuple[str, int, Time]]:
    """(writer, written_at_ms, time) of every notification of ``sub`` (batched or not), in
    topic order."""
    return [
        (rec.writer, rec.written_at_ms, note.time)
        for _, rec in read_control(config.kafka.bootstrap, config.acker.control_topic(sub), config)
        for note in completions(rec.body)
    ]


def test_a_killed_shard_is_taken_over_and_the_other_never_pauses(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = sharded_config(make_config, {"shards": 2, "standby_timeout_ms": 2000})
    subs = [s.name for s in config.substreams]
    mine = {i: [s for s in subs if shard_of(config, s) == i] for i in (0, 1)}
    name0 = config.acker.shard_name(0)
    with ackers() as procs:
        one = Acker(config, tmp_path / "shard1.log", "--shard", "1")
        zero = Acker(config, tmp_path / "shard0.log", "--shard", "0")
        procs += [one, zero]
        one.wait_for("' started in ")
        # Shard 0 also serves commands: its first step recovers the command handler.  The
        # standby follows heartbeats from when it starts, so it starts after that.
        zero.wait_for("command handler recovery")
        spare = Acker(config, tmp_path / "standby0.log", "--shard", "0", "--standby")
        procs.append(spare)
        spare.wait_for("following the heartbeats")
        with Workload(config) as work:
            got = follow_each(config, subs, 10, 90)
            assert all(len(n) >= 10 for n in got.values()), got
            zero.proc.kill()  # SIGKILL: no last commit
            zero.proc.wait(10)
            killed_ms = int(time.time() * 1000)
            spare.wait_for("' started in ", 60)
        assert not work.errors, work.errors
        for sub in subs:
            check_exactly_once(config, sub, work.sent, set(range(EPOCHS)))
    # Shard 0's substreams: written by shard 0's name only (active, then its standby);
    # there was an outage (nothing written for at least most of the standby timeout).
    resumed_ms = min(
        at for s in mine[0] for _, at, _ in written(config, s) if at > killed_ms
    )
    assert resumed_ms - killed_ms >= 1000, (killed_ms, resumed_ms)
    for s in mine[0]:
        assert {w for w, _, _ in written(config, s)} == {name0}
    # Shard 1 kept notifying while shard 0 was down: no gap over 1 s in the outage.
    during = sorted(
        at for s in mine[1] for _, at, _ in written(config, s) if killed_ms <= at <= resumed_ms
    )
    edges = [killed_ms, *during, resumed_ms]
    gaps = [b - a for a, b in itertools.pairwise(edges)]
    assert len(during) >= 5 and max(gaps) < 1000, (len(during), max(gaps), resumed_ms - killed_ms)
    assert all(r.ok for r in verify_config(config)), [r.broken for r in verify_config(config)]


def test_adding_a_shard_while_a_workload_runs(make_config: ConfigFactory, tmp_path: Path) -> None:
    config = sharded_config(make_config, {})
    assert config.acker.shards == 1
    subs = [s.name for s in config.substreams]
    old_name = config.acker.name
    with ackers() as procs:
        old = Acker(config, tmp_path / "old.log")
        procs.append(old)
        old.wait_for("' started in ")
        with Workload(config) as work:
            got = follow_each(config, subs, 10, 90)
            assert all(len(n) >= 10 for n in got.values()), got
            # The new layout starts while the old acker still runs: each new shard fences
            # and retires it, then serves its own partitions from the retired checkpoint.
            new = [
                Acker(config, tmp_path / f"new{i}.log", "--shard", str(i), "--shards", "2",
                      "--from-shards", "1")
                for i in (0, 1)
            ]
            procs += new
            for a in new:
                a.wait_for("' started in ")
        assert not work.errors, work.errors
        for sub in subs:
            check_exactly_once(config, sub, work.sent, set(range(EPOCHS)))
        assert old.proc.wait(30) != 0  # fenced: it stopped
        assert "fenced" in old.text()
        # The retired acker refuses to serve again.
        again = Acker(config, tmp_path / "again.log")
        assert again.proc.wait(60) != 0
        assert "was retired" in again.text()
    for sub in subs:
        writers = [w for w, _, _ in written(config, sub)]
        owner = config.acker.shard_name(shard_of(config, sub), 2)
        # One owner at a time: the old acker's notifications, then only the new owner's.
        switch = writers.index(owner)
        assert set(writers[:switch]) == {old_name} and set(writers[switch:]) == {owner}
        assert switch >= 10
    assert all(r.ok for r in verify_config(config)), [r.broken for r in verify_config(config)]


def test_a_source_idle_on_one_shard_is_not_evicted_there(make_config: ConfigFactory) -> None:
    """A source that for a while commits only about shard 0's segments (here: seals of one
    substream) heartbeats to shard 1's partition, so shard 1 does not evict it."""
    config = sharded_config(
        make_config,
        # heartbeat_ms 500: an acker step slower than two of its heartbeats is taken as
        # the acker's own stall and excused from every source's silence
        {"shards": 2, "heartbeat_ms": 500, "source_heartbeat_ms": 300, "source_timeout_ms": 2000},
    )
    subs = [s.name for s in config.substreams]
    a = next(s for s in subs if shard_of(config, s) == 0)
    b = next(s for s in subs if shard_of(config, s) == 1)
    stream = config.streams[0].name
    with acker(config, shard=0, shards=2) as zero, acker(config, shard=1, shards=2) as one:
        with Application(config).publisher(stream, "only-a") as pub:
            pub.publish({"user": "u", "url": "/0", "ts": 0})
            for s in subs:
                pub.seal(s, 0, commit=s == subs[-1])
            t, until = 1, time.monotonic() + 6.0  # three times the eviction timeout
            while time.monotonic() < until:
                pub.seal(a, t)  # commits about partition of `a` only
                t += 1
                time.sleep(0.1)
            pub.publish({"user": "u", "url": f"/{t}", "ts": t})  # not fenced
            for s in subs:
                pub.seal(s, t, commit=s == subs[-1])
            got = wait_notifications(config, b, 2)
            # `acker sources` reads every shard's checkpoint: the source is live on both.
            listed = cli("acker", "sources", "-c", str(config.path))
            # So does the dashboard: each substream's open times come from its own shard.
            snap = dashboard_snapshot(config)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split("│") for line in listed.stdout.splitlines() if "only-a" in line]
        assert sorted(r[1].strip() for r in rows) == ["0", "1"], listed.stdout
        assert all("live" in (c.strip() for c in r) for r in rows), listed.stdout
        assert "shard0of2" in listed.stdout and "shard1of2" in listed.stdout
        assert [n.time for n in got] == [0, t]
        assert zero.service.evictions == 0 and one.service.evictions == 0
    for s in subs:
        assert evictions(config, s) == []
    shards = {s["name"]: s["alive"] for s in snap["acker"]["shards"]}
    assert shards == {config.acker.shard_name(0, 2): True, config.acker.shard_name(1, 2): True}
    assert all(card["open"] is not None for card in snap["substreams"]), snap["substreams"]
    assert sorted(r["shard"] for r in snap["sources"] if r["source"] == "only-a") == sorted(
        shards
    )


def dashboard_snapshot(config: Config, timeout: float = 20.0) -> dict[str, Any]:
    """The dashboard model's snapshot once it has a checkpoint of every shard."""
    from substreams.ui.model import DashboardModel

    model = DashboardModel(config)
    model.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            snap = model.snapshot()
            if all(s["checkpoint_ms"] for s in snap["acker"]["shards"]):
                return snap
            assert time.monotonic() < deadline, snap
            time.sleep(0.2)
    finally:
        model.close()


def cli_wide(*args: str) -> subprocess.CompletedProcess[str]:
    """``substreams ARGS`` with a wide terminal (the tables' names are not cut)."""
    import os

    env = {**os.environ, "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "substreams", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)


def test_every_shard_serves_commands_and_the_cli_merges_them(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    """`acker status|epochs|peek` against two `acker run --shard` processes show the
    substreams of both shards; with one shard stopped, `status` shows the other's and names
    the silent one (exit code 2), instead of showing half as if it were all."""
    config = sharded_config(make_config, {"shards": 2})
    subs = [s.name for s in config.substreams]
    mine = {i: [s for s in subs if shard_of(config, s) == i] for i in (0, 1)}
    path = str(config.path)
    with ackers() as procs:
        for i in (0, 1):
            procs.append(Acker(config, tmp_path / f"shard{i}.log", "--shard", str(i)))
        for a in procs:
            a.wait_for("command handler recovery")
        with Application(config).publisher(config.streams[0].name, "src") as pub:
            pub.publish({"user": "u", "url": "/0", "ts": 0})
            for s in subs:
                pub.seal(s, 0, commit=s == subs[-1])
            for k in range(3):  # time 1: open (unsealed) in every substream
                pub.publish({"user": "u", "url": f"/1/{k}", "ts": 1})
            pub.flush()
            got = follow_each(config, subs, 1, 30)
            assert all(len(n) == 1 for n in got.values()), got
            status = cli_wide("acker", "status", "-c", path, "--timeout", "10")
            epochs = cli_wide("acker", "epochs", "-c", path, "--timeout", "10")
            peeks = {s: cli_wide("acker", "peek", "-c", path, "-s", s, "--timeout", "10")
                     for s in (mine[0][0], mine[1][0])}
            procs[1].stop()  # shard 1 gone: its part cannot be shown
            partial = cli_wide("acker", "status", "-c", path, "--timeout", "2")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "2 of 2 shards answered" in status.stdout
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in status.stdout.splitlines() if line.startswith("│")}
    for i in (0, 1):
        for s in mine[i]:
            shard, lower, open_times = rows[s][1], rows[s][2], rows[s][4]
            assert (shard, lower, open_times) == (str(i), "{1}", "1"), status.stdout
    acks = [line.split("│")[1].strip() for line in status.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    assert sorted(acks) == ["0", "1", "2", "3"], status.stdout  # every shard's partitions
    assert epochs.returncode == 0, epochs.stdout + epochs.stderr
    assert "open times (4)" in epochs.stdout
    assert all(f"│ {s} " in epochs.stdout for s in subs), epochs.stdout
    for s, out in peeks.items():
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"peek {s}" in out.stdout and "OPEN" in out.stdout, out.stdout
    assert partial.returncode == 2, partial.stdout + partial.stderr
    assert "1 of 2 shards answered" in partial.stdout
    assert all(f"│ {s} " in partial.stdout for s in mine[0]), partial.stdout
    assert not any(f"│ {s} " in partial.stdout for s in mine[1]), partial.stdout
    name1 = config.acker.shard_name(1, 2)
    assert f"shard 1 ('{name1}'" in partial.stderr, partial.stderr
    assert all(s in partial.stderr for s in mine[1]), partial.stderr
