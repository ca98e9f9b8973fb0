"""``Publisher.publish_many`` on a real broker (#16): the batch path keeps the single-record
path's guarantees -- exactly-once in-order notifications under the acker with each epoch's
own records, order-key regressions, bad payloads and keyed seals refused before anything of
the batch is written, fencing."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import substreams.streams.publisher as publisher_module
from substreams.app import Application
from substreams.errors import (
    OrderKeyRegressionError,
    PublisherFencedError,
    SealedTimeError,
    SubstreamsError,
)
from substreams.frontier import Time
from substreams.streams.listener import Listener
from substreams.streams.publisher import Ending, Write
from substreams.streams.records import Entry, SentRecord
from tests.conftest import ConfigFactory
from tests.integration.test_acker import FAST, acker, check_exactly_once, verify_chains
from tests.integration.test_streams import read_all


def click(ts: int, url: str, user: str = "u") -> dict[str, Any]:
    return {"user": user, "url": url, "ts": ts}


@pytest.mark.parametrize("seed", [1, 2])
def test_publish_many_under_the_acker_notifies_every_epoch_once_in_order(
    make_config: ConfigFactory, seed: int
) -> None:
    """Two sources write batches that span several epochs (random sizes, keys on some,
    single publish() calls mixed in); each seals after a batch.  Every epoch is notified
    once, in order, its ranges holding exactly its records."""
    config = make_config(
        [{"name": "clicks", "partitions": 4}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    from substreams.control.traffic import ACK_REPORTS, TRAFFIC

    rng = random.Random(seed)
    sent: dict[Time, list[tuple[str, str]]] = defaultdict(list)
    sealed: set[Time] = set()
    with acker(config):
        pubs = {
            name: Application(config).publisher(stream, name, batch_size=rng.randrange(5, 60))
            for name in ("a", "b")
        }
        ts = {name: 0 for name in pubs}
        n = 0
        try:
            for _ in range(40):
                name = rng.choice(sorted(pubs))
                pub = pubs[name]
                batch = []
                for _ in range(rng.randrange(1, 25)):
                    ts[name] += rng.choice([0, 0, 0, 1, 2])
                    batch.append(click(ts[name], f"/{name}{n}", f"u{n % 5}"))
                    sent[ts[name]].append((name, f"/{name}{n}"))
                    n += 1
                if rng.random() < 0.2:
                    for payload in batch:
                        pub.publish(payload)
                else:
                    keys = [p["user"] for p in batch] if rng.random() < 0.5 else None
                    records = pub.publish_many(batch, keys=keys)
                    assert [r.times[sub] for r in records] == [p["ts"] for p in batch]
                if ts[name] > 0:
                    pub.seal(sub, ts[name] - 1, commit=rng.random() < 0.5)
                    sealed.add(ts[name] - 1)
            for pub in pubs.values():
                pub.seal(sub, max(ts.values()))
            sealed.add(max(ts.values()))
        finally:
            for pub in pubs.values():
                pub.close()
        # a sealed time nobody wrote to is notified too, empty
        expected = set(sent) | sealed
        got = check_exactly_once(config, sub, sent, expected)
    assert [note.time for note in got] == sorted(expected)
    assert TRAFFIC.get(ACK_REPORTS, sub) == 2 * n  # SND and RCV of every record
    verify_chains(config, [config.acker.control_topic(sub)])


def test_a_regression_inside_a_batch_raises_and_writes_nothing(
    make_config: ConfigFactory,
) -> None:
    config = make_config([{"name": "clicks", "partitions": 2}])
    stream = config.streams[0].name
    with Application(config).publisher(stream, "src") as pub:
        pub.publish(click(10, "/first"))
        with pytest.raises(OrderKeyRegressionError, match=r"ts=9 \(record 2 of the batch\)"):
            pub.publish_many([click(11, "/x"), click(12, "/x"), click(9, "/x"), click(13, "/x")])
        with pytest.raises(OrderKeyRegressionError, match=r"ts=5 .* below the previous 10"):
            pub.publish_many([click(5, "/x")])
        with pytest.raises(SubstreamsError, match="does not match schema"):
            pub.publish_many([click(11, "/x"), {"user": "u", "url": 7, "ts": 12}])
        with pytest.raises(SubstreamsError, match="no integer order key"):
            pub.publish_many([click(11, "/x"), {"user": "u", "url": "/x"}])
        with pytest.raises(SubstreamsError, match=r"partitions 0\.\.1, not 2"):
            pub.publish_many([click(11, "/x")], partitions=[2])
        # the publisher is as it was: the last order key is still 10
        pub.publish_many([click(10, "/second"), click(11, "/third")])
        assert pub.publish_many([]) == []
    with Listener(config, stream) as listener:
        got = sorted((e.order_key, e.payload["url"]) for e in read_all(listener))
    assert got == [(10, "/first"), (10, "/second"), (11, "/third")]


def test_a_batch_below_a_keyed_seal_raises_and_writes_nothing(
    make_config: ConfigFactory,
) -> None:
    session = {
        "name": "s", "stream": "clicks", "kind": "session", "key": "user", "field": "ts",
        "gap_ms": 50,
    }  # fmt: skip
    config = make_config([{"name": "clicks"}], [session], acker=FAST)
    stream, sub = config.streams[0].name, config.substreams[0].name
    with Application(config).publisher(stream, "src") as pub:
        pub.publish_many([click(100, "/a"), click(120, "/b")])
        pub.seal_keys(sub, 150)
        with pytest.raises(SealedTimeError, match="sealed every key up to 150"):
            pub.publish_many([click(160, "/c"), click(150, "/d")], check_order=False)
        pub.publish_many([click(200, "/e")])
    with Listener(config, stream) as listener:
        urls = [e.payload["url"] for e in read_all(listener)]
    assert sorted(urls) == ["/a", "/b", "/e"]


def test_a_fenced_publisher_cannot_commit_a_batch(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks"}])
    stream = config.streams[0].name
    pub = Application(config).publisher(stream, "shared")
    pub.publish_many([click(1, "/a")])
    pub.flush()
    script = textwrap.dedent(
        f"""
        from substreams.config import load_config
        from substreams.app import Application
        cfg = load_config({str(config.path)!r})
        with Application(cfg).publisher({stream!r}, "shared") as p:
            p.publish_many([{{"user": "b", "url": "/b", "ts": 2}}])
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with pytest.raises(PublisherFencedError, match="fenced"):
        pub.publish_many([click(3, "/c"), click(4, "/d")])
        pub.flush()
    pub.abort()
    with Listener(config, stream) as listener:
        assert [e.payload["url"] for e in read_all(listener)] == ["/a", "/b"]


class CountingHook:
    """A hook that keeps what the publisher tells it."""

    wants_send = True
    wants_delivery = True

    def __init__(self) -> None:
        self.seen: list[SentRecord] = []
        self.offsets: list[tuple[SentRecord, int]] = []
        self.commits = 0

    def sent(self, records: Sequence[SentRecord]) -> None:
        self.seen.extend(records)

    def delivered(
        self, records: Sequence[SentRecord], partitions: Sequence[int],
        offsets: Sequence[int], times: Mapping[str, Sequence[Time]],
    ) -> None:
        self.offsets.extend(zip(records, offsets, strict=True))

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]:
        return ()

    def before_commit(self, last: bool) -> Sequence[Write]:
        # every delivery of the transaction is known before the hook's last word
        assert len(self.offsets) == len(self.seen)
        return ()

    def ended(self, how: Ending) -> None:
        self.commits += how != "aborted"


def test_a_hook_sees_each_record_of_a_batch_once(make_config: ConfigFactory) -> None:
    config = make_config([{"name": "clicks", "partitions": 3}])
    stream = config.streams[0].name
    hook = CountingHook()
    with Application(config).publisher(stream, "src", batch_size=7) as pub:
        pub.add_hook(hook)
        records = pub.publish_many([click(i, f"/{i}") for i in range(10)])
        records += pub.publish_many([click(10 + i, f"/{10 + i}") for i in range(5)])
    assert hook.seen == records
    assert [r for r, _ in hook.offsets] == records
    with Listener(config, stream) as listener:
        entries = [e for e in read_all(listener) if isinstance(e, Entry)]
    where = {(e.partition, e.index): e.tracking_id for e in entries}
    assert {(r.partition, o): r.tracking_id for r, o in hook.offsets} == where
    assert hook.commits == 2  # the 10-record batch went out whole, then close() committed


def test_a_seal_after_a_full_batch_commits_in_the_batchs_transaction(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher that seals leaves a full transaction open for a seal that may follow
    (one transaction, not two back to back); its next write commits it first, and a quiet
    caller's is committed by the ticker."""
    epoch = {"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}
    config = make_config([{"name": "clicks"}], [epoch])
    stream, sub = config.streams[0].name, config.substreams[0].name
    monkeypatch.setattr(publisher_module, "FULL_WAIT_S", 3600.0)  # no ticker commit yet
    hook = CountingHook()
    with Application(config).publisher(stream, "src", batch_size=3) as pub:
        pub.add_hook(hook)
        pub.publish_many([click(0, f"/0.{i}") for i in range(3)])
        assert hook.commits == 0  # full: waiting for a seal
        pub.seal(sub, 0)
        assert hook.commits == 1  # the records and their seal, one transaction
        for i in range(3):
            pub.publish(click(1, f"/1.{i}"))
        assert hook.commits == 1
        pub.publish(click(2, "/2.0"))
        assert hook.commits == 2  # the full one, committed before the next record
        monkeypatch.setattr(publisher_module, "FULL_WAIT_S", 0.02)
        pub.publish_many([click(2, "/2.1"), click(2, "/2.2")])
        deadline = time.monotonic() + 30
        while hook.commits < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.commits == 3  # the caller went quiet: the ticker committed it
        with Listener(config, stream) as listener:
            assert len(read_all(listener)) == 9


class TimedProducer:
    """Delegates to the publisher's producer, noting when each record or message was
    produced and when each commit returned."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("produce", "produce_batch", "commit_transaction"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            self.calls.append((name, time.monotonic()))
            return out

        return call


def test_a_seal_with_nothing_pending_waits_out_the_settle_after_a_commit(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction of the hooks' messages alone (a seal with nothing pending) right after
    a commit writes nothing until SETTLE_S after it (no AddPartitionsToTxn into the
    previous commit's markers, no 20 ms librdkafka retry in its commit); records and a seal
    with records pending never wait."""
    epoch = {"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}
    config = make_config([{"name": "clicks"}], [epoch])
    stream, sub = config.streams[0].name, config.substreams[0].name
    with Application(config).publisher(stream, "src") as pub:
        timed = TimedProducer(pub._producer)
        monkeypatch.setattr(pub, "_producer", timed)
        settles: list[float] = []
        settle = pub._settle
        monkeypatch.setattr(pub, "_settle", lambda: (settles.append(0.0), settle())[1])
        pub.publish(click(0, "/0"))
        pub.seal(sub, 0)  # records pending: rides in their transaction, no wait
        pub.publish(click(1, "/1"))  # right behind the commit: records do not wait
        assert settles == []
        pub.flush()
        committed = timed.calls[-1][1]
        n = len(timed.calls)
        pub.seal(sub, 1)  # nothing pending: the seal's transaction waits, then writes
        assert len(settles) == 1
        first_write = next(t for name, t in timed.calls[n:] if name != "commit_transaction")
        assert first_write - committed >= publisher_module.SETTLE_S
