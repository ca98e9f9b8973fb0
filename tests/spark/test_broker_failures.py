"""Broker failures on a 3-node Apache Kafka cluster (replication factor 3,
``min.insync.replicas=2``) while publishers, the acker (a subprocess) and a firm Spark query
run, one after the other in one run of the workload: (A) the broker leading every data, acks
and control partition is SIGKILLed, the workload goes on with two brokers, the broker restarts
and takes its leaderships back; then (B) all three brokers are SIGKILLed, stay down longer
than the clients' commit timeout (one ``commit_transaction`` call,
``kafka.commit_timeout_ms``: cut to 2 s here so that the outage need not outlast the default
30 s), and restart.  (One run, not one per failure: the second failure then also hits a
workload, an acker and a query that already rode out the first.)
Through both every epoch is notified exactly once, in order, with exactly its committed records;
the data topics hold every committed record once; the Spark output holds every epoch's result
exactly once; the control topics' hash chains verify; the acker never exits.

Which broker leads: the test creates its topics itself with an explicit replica assignment
whose first (preferred) replica is the victim, so that one broker leads all of them (checked
with the cluster metadata right before the kill).

What the workload does when a commit fails (the Publisher raises the KafkaException): a
retriable error (the commit timed out while the brokers were away; librdkafka goes on with it
in the background) is retried with ``flush()`` on the same publisher, as the transaction may
commit anyway; an error that requires an abort, or a failure before the commit, means the
transaction's records are gone: the publisher is aborted and the source's part of the epoch
is published again by a new Publisher for the same source id.  A fatal error (the commit's
outcome unknown) fails the test.

The harness restarts an acker that exits and a query that fails, as a supervisor would, and
records it: the results must be exactly once either way; the acker must not exit at all, and
the query must not fail while one broker is down (after a full outage longer than its read
timeout it may fail and is restarted from its checkpoint).  The harness follows the control
and output topics with one open reader each, not a re-read of both every tick.

Last, a Publisher that cannot register with the acker (its acks partition unreachable) must
not keep its (stream, source) acquired: a later one, after the outage, opens.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from substreams.acker.service import checkpoint_topic
from substreams.app import Application
from substreams.config import Config
from substreams.control.follower import RAISE, ControlFollower
from substreams.control.messages import completions
from substreams.control.verify import verify_config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.embedded import KafkaCluster
from substreams.kafka.topics import ensure_topics
from substreams.spark.runner import run, stop, stop_handler
from substreams.spark.sink import commit_topic
from substreams.streams.listener import Listener
from substreams.streams.publisher import Publisher
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory
from tests.integration.test_acker import check_exactly_once, verify_chains
from tests.spark.jobs import load_job, out_stream

pytestmark = pytest.mark.spark

SOURCES = 2
PAUSE_S = 0.25  # between epochs
AFTER_RECOVERY = 4  # epochs published once the cluster is whole again
USERS = 3
COMMIT_TIMEOUT_MS = 2000  # kafka.commit_timeout_ms of every client (default 30 s)
ALL_DOWN_S = 3.0  # + the restart: past the clients' commit timeout
WINDOWS = {"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}


# -- the cluster -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    kafka = KafkaCluster(tmp_path_factory.mktemp("kafka3"), nodes=3)
    try:
        kafka.start(timeout=180)
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def bootstrap(cluster: KafkaCluster) -> str:
    """Overrides the session's broker: make_config builds configs on the 3-node cluster."""
    return cluster.bootstrap


def partitions_of(config: Config, topics: list[str]) -> dict[tuple[str, int], Any]:
    """(topic, partition) -> its metadata (``leader``, ``replicas``, ``isrs``)."""
    admin = client.admin(config.kafka.bootstrap, config)
    out = {}
    for topic in topics:
        for p, pm in admin.list_topics(topic, timeout=10).topics[topic].partitions.items():
            out[(topic, p)] = pm
    return out


def leaders(config: Config, topics: list[str]) -> dict[tuple[str, int], int]:
    return {tp: pm.leader for tp, pm in partitions_of(config, topics).items()}


def create_led_by(config: Config, topics: list[tuple[str, int]], leader: int) -> None:
    """Create ``topics`` (with the settings the config gives them) on all three brokers,
    every partition's preferred replica on ``leader``, so that ``leader`` leads them all."""
    others = [n for n in (1, 2, 3) if n != leader]
    new = []
    for spec in topics:
        name, n = spec
        new.append(
            NewTopic(
                name,
                num_partitions=n,
                replication_factor=-1,
                replica_assignment=[[leader, *others[p % 2 :], *others[: p % 2]] for p in range(n)],
                config={**getattr(spec, "configs", {}), "min.insync.replicas": "2"},
            )
        )
    admin = client.admin(config.kafka.bootstrap, config)
    for fut in admin.create_topics(new, request_timeout=30).values():
        fut.result()
    names = [name for name, _ in topics]
    deadline = time.monotonic() + 30
    while set(leaders(config, names).values()) != {leader}:
        assert time.monotonic() < deadline, f"leaders after creation: {leaders(config, names)}"
        time.sleep(0.2)


def setup(cluster: KafkaCluster, make_config: ConfigFactory, leader: int) -> Config:
    for node in cluster.nodes:  # whole, even after a test that failed half-way
        cluster.start_node(node.node_id)
    cluster.wait_ready(timeout=120)
    config = make_config(
        [{"name": "clicks", "partitions": 3}, out_stream("counts", "window_count.avsc")],
        [WINDOWS],
        acker={"heartbeat_ms": 200, "flush_ms": 2},
        create=False,
        kafka={"commit_timeout_ms": COMMIT_TIMEOUT_MS},
    )
    create_led_by(config, [*config.topics(), (commit_topic(config.streams[1].name), 1)], leader)
    return config


# -- the workload ----------------------------------------------------------------------------


def records_of(epoch: int, source: int) -> list[dict[str, Any]]:
    """What ``source`` publishes in ``epoch`` (source 0 at least one record, so every epoch
    has a Spark result); ts inside the epoch's 1 s window, non-decreasing per source."""
    n = random.Random(f"{epoch}/{source}").randrange(1 if source == 0 else 0, 4)
    return [
        {"user": f"u{k % USERS}", "url": f"/{epoch}/{source}/{k}", "ts": epoch * 1000 + 10 * k}
        for k in range(n)
    ]


class Workload:
    """``SOURCES`` publishers in one thread: every epoch each publishes its records and
    seals; after ``finish`` is set, ``AFTER_RECOVERY`` more epochs, then close."""

    def __init__(self, config: Config, log: Callable[[str], None]) -> None:
        self.config = config
        self.stream = config.streams[0].name
        self.substream = config.substreams[0].name
        self.log = log
        self.sent: dict[Time, list[tuple[str, str]]] = {}  # committed: epoch -> (source, url)
        self.users: dict[tuple[str, str], str] = {}
        self.sealed: list[int] = []  # epochs sealed by every source, in order
        self.finish = threading.Event()
        self.halt = threading.Event()  # the test is over (failed): stop at once
        self.events: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="workload")

    def _open(self, source: str) -> Publisher:
        deadline = time.monotonic() + 180
        while True:
            try:
                return Application(self.config).publisher(self.stream, source, batch_size=1000)
            except (KafkaException, SubstreamsError) as exc:
                self.events["publisher open failed"] += 1
                self.log(f"{source}: opening the publisher failed: {exc!r}")
                if time.monotonic() > deadline or self.halt.is_set():
                    raise
                time.sleep(1)

    def _commit(self, pub: Publisher, source: str, epoch: int) -> bool:
        """Seal ``epoch`` with the commit of the open transaction.  True once committed;
        False when the transaction was aborted (its records are gone: publish again)."""
        deadline = time.monotonic() + 180
        attempt: Callable[[], None] = lambda: pub.seal(self.substream, epoch)  # noqa: E731
        while True:
            try:
                attempt()
                return True
            except KafkaException as exc:
                err = exc.args[0]
                self.log(f"{source} epoch {epoch}: commit failed: {err}")
                if err.txn_requires_abort() and not err.fatal():
                    self.events["transaction aborted"] += 1
                    return False
                if err.fatal() or not err.retriable() or time.monotonic() > deadline:
                    raise  # the commit's outcome is unknown: nothing correct is left to do
                if self.halt.is_set():
                    raise
                self.events["commit retried"] += 1
                attempt = pub.flush  # the same transaction again: committed at most once

    def _epoch(self, pub: Publisher, source: int, epoch: int) -> Publisher:
        name = f"src{source}"
        recs = records_of(epoch, source)
        while True:
            try:
                for r in recs:
                    pub.publish(r, key=r["user"])
            except KafkaException as exc:  # nothing committed: the transaction is dropped
                self.log(f"{name} epoch {epoch}: publish failed: {exc!r}")
                committed = False
            else:
                committed = self._commit(pub, name, epoch)
            if committed:
                for r in recs:
                    self.sent.setdefault(epoch, []).append((name, r["url"]))
                    self.users[(name, r["url"])] = r["user"]
                return pub
            pub.abort()
            self.events["epoch published again"] += 1
            pub = self._open(name)

    def _run(self) -> None:
        pubs: list[Publisher] = []
        try:
            pubs = [self._open(f"src{i}") for i in range(SOURCES)]
            epoch = 0
            left: int | None = None
            while (left is None or left > 0) and not self.halt.is_set():
                if left is None and self.finish.is_set():
                    left = AFTER_RECOVERY
                for i in range(SOURCES):
                    pubs[i] = self._epoch(pubs[i], i, epoch)
                self.sent.setdefault(epoch, [])
                self.sealed.append(epoch)
                epoch += 1
                if left is not None:
                    left -= 1
                time.sleep(PAUSE_S)
            for pub in pubs:
                pub.close()
        except BaseException as exc:
            self.error = exc
            self.log(f"workload failed: {exc!r}")
            for pub in pubs:
                pub.abort()

    def truth(self) -> dict[tuple[int, str], int]:
        """The count per (window, user) that the Spark job must write."""
        want: Counter[tuple[int, str]] = Counter()
        for epoch, recs in self.sent.items():
            assert isinstance(epoch, int)
            for rec in recs:
                want[(epoch, self.users[rec])] += 1
        return dict(want)


# -- the harness -----------------------------------------------------------------------------


class Harness:
    """The workload, the acker subprocess and the Spark query, each kept running: an acker
    that exits and a query that fails are restarted (and recorded)."""

    def __init__(self, config: Config, spark: SparkSession, tmp_path: Path) -> None:
        self.config = config
        self.spark = spark
        self.t0 = time.monotonic()
        self.events: list[str] = []
        self.sub = config.substreams[0].name
        self.clicks, self.counts = config.streams[0].name, config.streams[1].name
        self.workload = Workload(config, self.log)
        self.acker_log = tmp_path / "acker.log"
        self.acker_cmd = [sys.executable, "-m", "substreams", "acker", "run"]
        self.acker_cmd += ["-c", str(config.path)]
        self.acker: subprocess.Popen[bytes] | None = None
        self.acker_exits: list[int] = []
        self.query: StreamingQuery | None = None
        self.query_failures: list[str] = []
        self.checkpoint = tmp_path / "ck"
        self.job = load_job("windowed_counts")
        # Open readers, drained every tick: what has been notified and written so far.
        self._notes = ControlFollower(
            config.kafka.bootstrap, config, name="test: notifications", on_bad=RAISE, verify=False
        )
        self._notes.assign({config.acker.control_topic(self.sub): 0})
        self._out = Listener(config, self.counts)
        self._notified = 0
        self._windows: set[int] = set()

    def log(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:6.1f}s {what}")

    def _start_acker(self) -> None:
        with self.acker_log.open("ab") as out:
            self.acker = subprocess.Popen(self.acker_cmd, stdout=out, stderr=subprocess.STDOUT)

    def _start_query(self) -> None:
        self.query = run(
            self.job.WindowedCounts(1000),
            self.config.path,
            self.sub,
            self.counts,
            checkpoint=self.checkpoint,
            spark=self.spark,
            query_name="counts",
            block=False,
            trigger="200 milliseconds",
        )

    def __enter__(self) -> Harness:
        self._start_acker()
        self._start_query()
        self.workload.thread.start()
        self.log("started")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        """On a failure: stop everything at once (the next test must not share the cluster
        with a leftover workload)."""
        self._notes.close()
        self._out.close()
        self.workload.halt.set()
        self.workload.thread.join(60)
        if self.query is not None and self.query.isActive:
            stop(self.query)
        if self.acker is not None and self.acker.poll() is None:
            self.acker.kill()
            self.acker.wait(10)

    def tick(self) -> None:
        """Restart whatever stopped (an acker exit or a failed query is recorded)."""
        assert self.acker is not None and self.query is not None
        rc = self.acker.poll()
        if rc is not None:
            self.acker_exits.append(rc)
            self.log(f"acker exited with {rc}; restarted")
            self._start_acker()
        if not self.query.isActive:
            exc = self.query.exception()
            lines = str(exc).splitlines()
            cause = [ln for ln in lines if "Error" in ln or "Exception:" in ln] or lines or [""]
            self.query_failures.append(cause[-1].strip()[:300])
            self.log(f"query failed: {self.query_failures[-1]}; restarted from its checkpoint")
            try:
                stop_handler(self.query)  # releases the output publisher
            except (KafkaException, SubstreamsError) as close_exc:
                self.log(f"closing the failed query's sink: {close_exc!r}")
            self._start_query()
        if self.workload.error is not None:
            raise self.workload.error
        for followed in self._notes.poll_batch(0.0):
            self._notified += len(completions(followed.record.body))
        while (entry := self._out.poll(0.05)) is not None:  # 0 would not poll at all
            if hasattr(entry, "payload"):
                self._windows.add(int(entry.payload["window"]))

    def wait(self, what: str, cond: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.tick()
        while not cond():
            self.tick()
            if time.monotonic() > deadline:
                pytest.fail(f"not within {timeout} s: {what}\n{self.report()}")
            time.sleep(0.3)
        self.log(what)

    def output(self) -> list[dict[str, Any]]:
        with Listener(self.config, self.counts) as listener:
            return [
                dict(e.payload) for e in listener.entries(idle_timeout=0.5) if hasattr(e, "payload")
            ]

    def windows_out(self) -> set[int]:
        """The windows in the output so far (as of the last tick)."""
        return self._windows

    def notified(self) -> int:
        """The epochs notified so far (as of the last tick)."""
        return self._notified

    def warm_up(self) -> None:
        """Epochs are notified and the query has written results: all three are running."""
        self.wait("3 epochs notified", lambda: self.notified() >= 3, 120)
        self.wait("a Spark result", lambda: bool(self.windows_out()), 120)

    def finish(self) -> None:
        """Publish a few more epochs, wait until all are notified and in the output, stop."""
        w = self.workload
        w.finish.set()
        self.wait("workload done", lambda: not w.thread.is_alive(), 240)
        self.wait(f"{len(w.sealed)} epochs notified", lambda: self.notified() >= len(w.sealed), 120)
        self.wait(
            "every epoch in the Spark output", lambda: self.windows_out() >= set(w.sealed), 120
        )
        assert self.query is not None and self.acker is not None
        stop(self.query)
        self.acker.send_signal(signal.SIGTERM)
        rc = self.acker.wait(30)
        assert rc == 0, f"acker stop: exit {rc}\n{self.report()}"
        self.log("stopped")
        print(self.report())

    def report(self) -> str:
        tail = self.acker_log.read_text(errors="replace")[-1500:] if self.acker_log.exists() else ""
        return (
            "\n".join(self.events)
            + f"\nworkload: {dict(self.workload.events)}, {len(self.workload.sealed)} epochs"
            + f"\nacker exits: {self.acker_exits}; query failures: {self.query_failures}"
            + f"\nacker log tail:\n{tail}"
        )

    def check(self, query_may_fail: bool = False) -> None:
        """Exactly once, in order, exactly the committed records; Spark output once each."""
        w = self.workload
        assert w.error is None, w.error
        check_exactly_once(self.config, self.sub, w.sent, set(w.sealed))
        # ... and nothing outside the notified ranges either: a transaction the workload
        # took for aborted (and published again) must not have committed after all.
        with Listener(self.config, self.clicks) as listener:
            data = Counter(
                (e.source, e.payload["url"])
                for e in listener.entries(idle_timeout=0.5)
                if isinstance(e, Entry)
            )
        assert data == Counter(r for recs in w.sent.values() for r in recs), "data topic"
        rows = self.output()
        seen = Counter((int(r["window"]), str(r["key"])) for r in rows)
        dup = {k: n for k, n in seen.items() if n > 1}
        assert not dup, f"duplicated Spark results: {dup}"
        got = {(int(r["window"]), str(r["key"])): int(r["count"]) for r in rows}
        assert got == w.truth(), "the Spark output differs from what was committed"
        reports = verify_config(self.config)
        assert all(r.ok for r in reports), [r.broken for r in reports]
        verify_chains(self.config, [checkpoint_topic(self.config)])
        # A broker outage is no reason for the acker to give up: it must ride it out.
        assert self.acker_exits == [], f"the acker exited\n{self.report()}"
        if not query_may_fail:
            assert self.query_failures == [], f"the Spark query failed\n{self.report()}"


# -- the tests -------------------------------------------------------------------------------


def test_leader_then_all_brokers_killed_and_restarted(
    spark: SparkSession, cluster: KafkaCluster, make_config: ConfigFactory, tmp_path: Path
) -> None:
    victim = 2
    config = setup(cluster, make_config, victim)
    with Harness(config, spark, tmp_path) as h:
        h.warm_up()
        # (A) the leader of everything
        topics = [h.clicks, config.acker.acks_topic, config.acker.control_topic(h.sub)]
        led = leaders(config, topics)
        assert set(led.values()) == {victim}, f"leaders before the kill: {led}"
        before = len(h.workload.sealed)
        cluster.kill(victim)
        h.log(f"node {victim} killed (it led {sorted(led)}); {before} epochs sealed")
        # Two of three replicas are in sync: the cluster elects new leaders and serves on.
        h.wait("3 epochs sealed without it", lambda: len(h.workload.sealed) >= before + 3, 90)
        moved = leaders(config, topics)
        assert victim not in moved.values(), moved
        cluster.start_node(victim)
        cluster.wait_ready([victim], timeout=120)
        h.log(f"node {victim} back")
        # Once it caught up, it takes its leaderships back (preferred-leader election, which
        # the cluster would also run by itself within 30 s): a second move under load.
        h.wait(
            f"node {victim} in sync again",
            lambda: all(victim in pm.isrs for pm in partitions_of(config, topics).values()),
            60,
        )
        admin = client.admin(config.kafka.bootstrap, config)
        tps = [TopicPartition(t, p) for t, p in led]
        admin.elect_leaders(ElectionType.PREFERRED, tps).result()
        h.wait(
            f"node {victim} leads again",
            lambda: set(leaders(config, topics).values()) == {victim},
            30,
        )
        sealed = set(h.workload.sealed)
        h.wait("the output caught up with phase A", lambda: h.windows_out() >= sealed, 120)
        # One broker down is no reason for the query to fail.
        assert h.query_failures == [], f"the Spark query failed\n{h.report()}"

        # (B) all of them, longer than a commit call waits
        before = len(h.workload.sealed)
        down = time.monotonic()
        for node in cluster.nodes:
            cluster.kill(node.node_id)
        h.log(f"all nodes killed; {before} epochs sealed")
        time.sleep(ALL_DOWN_S)
        for node in cluster.nodes:
            cluster.start_node(node.node_id)
        cluster.wait_ready(timeout=180)
        h.log(f"all nodes back after {time.monotonic() - down:.0f} s")
        outage = time.monotonic() - down
        h.finish()
        # The outage outlasted a single commit call: writers had to wait it out.
        assert outage > COMMIT_TIMEOUT_MS / 1000, (
            f"the outage was too short for that (raise ALL_DOWN_S)\n{h.report()}"
        )
        h.check(query_may_fail=True)


def test_publisher_that_could_not_register_can_be_opened_again(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Publisher whose acker hook cannot register (the acks topic unreachable, as when its
    partition has no leader) fails; once the acks topic is back, a new one for the same
    source opens (it used to stay "already acquired in this process" for good).  The
    registration's patience is cut from 30 s to 3 s: how long it waits is not the point."""
    from substreams.streams import publisher as publisher_module

    monkeypatch.setattr(publisher_module, "REGISTER_PATIENCE_S", 3.0)
    config = make_config([{"name": "clicks", "partitions": 1}], [WINDOWS], create=False)
    acks = config.acker.acks_topic
    admin = client.admin(config.kafka.bootstrap, config)
    ensure_topics(admin, [t for t in config.topics() if t[0] != acks])
    stream, sub = config.streams[0].name, config.substreams[0].name
    with pytest.raises(SubstreamsError, match="could not register"):
        Application(config).publisher(stream, "src")
    ensure_topics(admin, config.topics())
    with Application(config).publisher(stream, "src") as pub:
        pub.publish({"user": "u", "url": "/", "ts": 0})
        pub.seal(sub, 0)
