"""A publisher that dies inside a transaction: only it is evicted, and no committed report of
anyone is lost (substreams.acker.liveness).

Its open transaction holds the last stable offset (LSO) of the acks partitions (and data
partitions) it wrote: a ``read_committed`` reader sees nothing the live sources commit behind
it until the transaction is aborted.  Judged on the clock, every live source of those
partitions looked silent and was evicted and fenced, and the reports they had committed
behind the open transaction were refused as stale: epochs notified without their records.
Here three live sources publish and seal for longer than ``source_timeout_ms`` behind a
source SIGKILLed in its commit that never comes back.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from substreams.acker.protocol import segment_partition
from substreams.app import Application
from substreams.config import Config
from substreams.control.io import read_control
from substreams.control.messages import SourceEvicted
from substreams.frontier import Time
from tests.conftest import ConfigFactory, read_dead_letters
from tests.integration.test_acker import AckerThread, check_exactly_once
from tests.integration.test_publisher_crashes import Remote

TIMEOUT_MS = 3000
LIVENESS = {"heartbeat_ms": 200, "source_heartbeat_ms": 300, "source_timeout_ms": TIMEOUT_MS}
EPOCHS = 36  # at ~0.25 s an epoch: the live sources seal for ~9 s, three timeouts
LIVE = ("live0", "live1", "live2")


@dataclass
class Outcome:
    sent: dict[str, dict[Time, list[tuple[str, str]]]] = field(default_factory=dict)
    died_at: float = 0.0
    errors: list[BaseException] = field(default_factory=list)


def scenario(config: Config, subs: list[str], seed: int) -> Outcome:
    """Three live sources publish 1-2 records per epoch and seal it in every substream,
    while 'victim' commits a record at epoch 0 and one at epoch 1, then publishes another
    at epoch 1, seals and dies in that commit (its reports and seals in the open
    transaction)."""
    stream = config.streams[0].name
    out = Outcome(sent={s: defaultdict(list) for s in subs})
    lock = threading.Lock()
    pubs = [Application(config).publisher(stream, name) for name in LIVE]
    victim = Remote(config, stream, "victim")
    assert victim.do("publish", "/v0", 0) == "ok" and victim.do("flush") == "ok"
    for s in subs:
        out.sent[s][0].append(("victim", "/v0"))
    started = threading.Barrier(len(LIVE) + 1)

    def live(i: int) -> None:
        rng = random.Random(seed * 10 + i)
        pub = pubs[i]
        try:
            started.wait()
            for e in range(EPOCHS):
                for k in range(rng.randint(1, 2)):
                    url = f"/{LIVE[i]}/{e}/{k}"
                    pub.publish({"user": LIVE[i], "url": url, "ts": e})
                    with lock:
                        for s in subs:
                            out.sent[s][e].append((LIVE[i], url))
                for s in subs:
                    pub.seal(s, e, commit=False)
                pub.flush()
                time.sleep(0.2)
            pub.close()
        except BaseException as exc:  # a fenced live source: the failure this test is about
            out.errors.append(exc)
            pub.abort()

    threads = [threading.Thread(target=live, args=(i,)) for i in range(len(LIVE))]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.5)
    # Heard last: a commit just before the fatal transaction, so that judged on the clock
    # every live source would look silent before the victim does.
    assert victim.do("publish", "/v1", 1) == "ok" and victim.do("flush") == "ok"
    for s in subs:
        out.sent[s][1].append(("victim", "/v1"))
    assert victim.do("publish", "/v-open", 1) == "ok"
    assert victim.do("seal_and_die_in_commit", subs, 1) == ""  # no answer: it died
    out.died_at = time.time()
    victim.p.wait(10)
    for t in threads:
        t.join(120)
    return out


def check(config: Config, subs: list[str], out: Outcome, ackers: list[AckerThread]) -> None:
    """Only the victim evicted (once per substream), no live source fenced, nothing
    dead-lettered, every epoch notified once, in order, with exactly its committed records."""
    assert out.errors == [], f"a live source failed: {out.errors!r}"
    for s in subs:
        check_exactly_once(config, s, out.sent[s], set(range(EPOCHS)))
    evicted: list[tuple[str, SourceEvicted, int]] = []
    for s in subs:
        for _, rec in read_control(config.kafka.bootstrap, config.acker.control_topic(s)):
            if isinstance(rec.body, SourceEvicted):
                evicted.append((s, rec.body, rec.written_at_ms))
    assert sorted((s, e.source) for s, e, _ in evicted) == sorted((s, "victim") for s in subs)
    assert sum(a.service.evictions for a in ackers) == len(ackers)
    assert list(read_dead_letters(config)) == []
    after = max(w for *_, w in evicted) / 1000 - out.died_at
    # rule 5: the LSO held for source_timeout_ms, then the fence (probes every 300 ms)
    assert TIMEOUT_MS / 1000 <= after + 0.5 < TIMEOUT_MS / 1000 + 8, after
    print(f"victim evicted {after:.2f} s after it died inside its transaction")


def test_a_source_dead_inside_a_transaction_is_the_only_one_evicted(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 3}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=LIVENESS,
    )
    subs = [config.substreams[0].name]
    with AckerThread(config) as a:
        out = scenario(config, subs, seed=1)
        check(config, subs, out, [a])
    assert a.error is None


def two_partition_config(make_config: ConfigFactory) -> Config:
    """Two epoch substreams whose segments live on different acks partitions (the names get
    a random suffix: drawn until they do)."""
    for _ in range(20):
        config = make_config(
            [{"name": "clicks", "partitions": 3}],
            [{"name": n, "stream": "clicks", "kind": "epoch", "field": "ts"} for n in "ab"],
            acker={**LIVENESS, "acks_partitions": 2, "shards": 2},
        )
        a, b = (s.name for s in config.substreams)
        if segment_partition(a, 2) != segment_partition(b, 2):
            return config
    raise AssertionError("no two substreams on different acks partitions in 20 draws")


def test_a_transaction_over_two_acks_partitions_is_fenced_by_both_shards(
    make_config: ConfigFactory,
) -> None:
    config = two_partition_config(make_config)
    subs = [s.name for s in config.substreams]
    kw: dict[str, Any] = {"shards": 2}
    with AckerThread(config, shard=0, **kw) as s0, AckerThread(config, shard=1, **kw) as s1:
        out = scenario(config, subs, seed=2)
        check(config, subs, out, [s0, s1])
    assert s0.error is None and s1.error is None


def test_a_foreign_open_transaction_is_reported_and_evicts_no_one(
    make_config: ConfigFactory,
) -> None:
    """Another program's transaction on the acks partition: not ours to fence.  It is shown
    in `acker sources` and the dashboard's model, the live source behind it is never evicted,
    and once it ends every epoch is notified with exactly its records."""
    from confluent_kafka import Producer

    from substreams.ui.model import DashboardModel
    from tests.integration.test_source_liveness import cli

    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=LIVENESS,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    foreign = Producer({"bootstrap.servers": config.kafka.bootstrap,
                        "transactional.id": f"not-substreams-{sub}"})
    foreign.init_transactions(30)
    sent: dict[Time, list[tuple[str, str]]] = defaultdict(list)
    with AckerThread(config) as a, Application(config).publisher(stream, "live") as pub:
        foreign.begin_transaction()
        foreign.produce(config.acker.acks_topic, b"not an ack", partition=0)
        foreign.flush(10)
        began = time.monotonic()
        e = 0
        while time.monotonic() - began < 2.5 * TIMEOUT_MS / 1000:
            pub.publish({"user": "live", "url": f"/{e}", "ts": e})
            sent[e].append(("live", f"/{e}"))
            pub.seal(sub, e)
            e += 1
            time.sleep(0.2)
        shown = cli("acker", "sources", "-c", str(config.path))
        model = DashboardModel(config)
        model.start()
        try:
            deadline = time.monotonic() + 20
            while not model.snapshot().get("blockers") and time.monotonic() < deadline:
                time.sleep(0.2)
            [blocker] = model.snapshot()["blockers"]
        finally:
            model.close()
        foreign.abort_transaction(30)
        check_exactly_once(config, sub, sent, set(range(e)))
        assert a.service.evictions == 0
    assert a.error is None
    assert shown.returncode == 0, shown.stderr
    assert "open transactions holding acks partitions" in shown.stdout
    assert "unknown" in shown.stdout and "reported" in shown.stdout
    assert blocker["partition"] == 0 and blocker["verdict"] == "reported"
    assert list(read_dead_letters(config)) == []
    del foreign  # its client would go on calling the broker the session stops


def test_a_slow_fence_holds_back_no_other_substream(
    make_config: ConfigFactory, monkeypatch: Any
) -> None:
    """An eviction's fence runs off the acker's loop: while it takes seconds, another
    substream's notifications go on."""
    from substreams.acker import service

    config = make_config(
        [{"name": "clicks"}, {"name": "views"}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"},
         {"name": "v", "stream": "views", "kind": "epoch", "field": "ts"}],
        acker=LIVENESS,
    )
    clicks, views = (s.name for s in config.streams)
    v = config.substreams[1].name
    fencing: list[float] = []
    real = service.fence

    def slow(*args: Any) -> None:
        fencing.append(time.monotonic())
        time.sleep(4)
        real(*args)
        fencing.append(time.monotonic())

    monkeypatch.setattr(service, "fence", slow)
    with AckerThread(config) as a, Application(config).publisher(views, "c") as pub:
        victim = Remote(config, clicks, "victim")
        victim.kill()  # silent from now on: evicted after the timeout
        noted: list[float] = []
        deadline = time.monotonic() + 30
        e = 0
        while len(fencing) < 2 and time.monotonic() < deadline:
            pub.publish({"user": "c", "url": f"/{e}", "ts": e})
            pub.seal(v, e)
            e += 1
            before = a.service.notifications
            time.sleep(0.2)
            if a.service.notifications > before:
                noted.append(time.monotonic())
        assert len(fencing) == 2, "the victim was never fenced"
        during = [t for t in noted if fencing[0] + 0.5 < t < fencing[1] - 0.5]
        assert len(during) >= 5, (fencing, noted)
