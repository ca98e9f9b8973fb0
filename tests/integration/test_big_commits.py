"""Issue 42, the publisher's side: a transaction over 10^5 distinct keys of a session
substream commits (its acks go as bounded messages, protocol rule 8), its keyed seal closes
every session, and a failed commit never leaves the publisher in a state where ``close()``
raises."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaException

from substreams.acker.protocol import MAX_ACK_BYTES, AckMessage, AckReport, Register, decode_ack
from substreams.app import Application
from substreams.config import Config
from substreams.errors import PublisherFencedError
from substreams.frontier import Keyed
from substreams.kafka import client
from substreams.kafka.read import drain
from substreams.streams.listener import Listener
from substreams.streams.publisher import transactional_id
from tests.conftest import ConfigFactory
from tests.integration.test_acker import acker, wait_notifications

GAP = 1000
SESSION = {
    "name": "s", "stream": "clicks", "kind": "session", "key": "user", "field": "ts",
    "gap_ms": GAP,
}  # fmt: skip
NOTIFIED_KEYS = 100_000
"""Keys of the end-to-end test (every session notified): 10^5 in one transaction, its acks
cut in ~38 messages, every session closed by one keyed seal (~22 s here; before the acker's
keyed index and changelog, 20,000 keys did not notify within 15 minutes)."""


def clicks(n: int, ts: int = 1000) -> list[dict[str, object]]:
    return [{"user": f"user-{i:06d}", "url": f"/p{i}", "ts": ts} for i in range(n)]


def acks_messages(config: Config) -> list[tuple[int, int, AckMessage]]:
    """Every committed acks message: (partition, encoded size, message)."""
    bootstrap = client.resolve_bootstrap(config)
    out = []
    for p in range(config.acker.acks_partitions):
        for m in drain(bootstrap, config, config.acker.acks_topic, p):
            value = m.value()
            assert value is not None
            out.append((p, len(value), decode_ack(value, m.headers())))
    return out


def test_a_transaction_over_100000_keys_commits_as_bounded_acks_messages(
    make_config: ConfigFactory,
) -> None:
    """10^5 distinct keys in one transaction, then a keyed seal in a transaction of its
    own and the close: every commit succeeds, every acks message is at most MAX_ACK_BYTES
    with its own sequence number (0, 1, ... in the order committed), the reports name every
    key once, the keyed seal comes after all of them, and the data is all there."""
    config = make_config([{"name": "clicks", "partitions": 4}], [SESSION])
    stream, sub = config.streams[0].name, config.substreams[0].name
    n = 100_000
    pub = Application(config).publisher(stream, "a", batch_size=1 << 40)
    pub.publish_many(clicks(n))
    began = time.monotonic()
    pub.flush()
    took = time.monotonic() - began
    pub.seal_keys(sub, 1000 + GAP + 1)  # the seal path: its own commit
    pub.close()
    msgs = [(p, size, m) for p, size, m in acks_messages(config) if m.seq >= 0]  # no beats
    sizes = [size for _, size, _ in msgs]
    logging.getLogger(__name__).warning(
        "10^5 keys: commit %.2f s, %d acks messages, largest %d bytes", took, len(msgs),
        max(sizes),
    )
    assert max(sizes) <= MAX_ACK_BYTES
    assert len({p for p, _, _ in msgs}) == 1  # one segment: one acks partition
    assert [m.seq for _, _, m in msgs] == list(range(len(msgs)))
    assert isinstance(msgs[0][2].body, Register)
    reports = [m.body for _, _, m in msgs if isinstance(m.body, AckReport)]
    assert len(reports) > 20  # ~5.7 MB of reports
    keys = [e.time.key for r in reports for e in r.entries if isinstance(e.time, Keyed)]
    assert len(keys) == n and set(keys) == {f"user-{i:06d}" for i in range(n)}
    sealed = [i for i, r in enumerate(reports) if r.seals]
    assert len(sealed) == 1 and sealed[0] > max(i for i, r in enumerate(reports) if r.entries)
    assert reports[sealed[0]].seals[0].all_keys
    with Listener(config, stream) as listener:
        assert sum(1 for _ in listener.entries(idle_timeout=1.0)) == n


def test_a_keyed_seal_over_many_keys_notifies_every_session(
    make_config: ConfigFactory,
) -> None:
    """End to end with a running acker: one transaction of NOTIFIED_KEYS keys (its acks cut
    in several messages) and the keyed seal that closes them all, riding in the same
    transaction (the seal path's split): every session notified once, with its record."""
    config = make_config([{"name": "clicks", "partitions": 4}], [SESSION])
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config):
        with Application(config).publisher(stream, "a", batch_size=1 << 40) as pub:
            pub.publish_many(clicks(NOTIFIED_KEYS))
            pub.seal_keys(sub, 1000 + GAP + 1)  # records and seal in one commit
        got = wait_notifications(config, sub, NOTIFIED_KEYS, timeout=600)
    assert len([m for _, _, m in acks_messages(config) if isinstance(m.body, AckReport)]) > 1
    assert len(got) == NOTIFIED_KEYS
    assert {n.time for n in got} == {Keyed(f"user-{i:06d}", 1000) for i in range(NOTIFIED_KEYS)}
    assert all(n.records == 1 for n in got)


def test_close_after_a_fenced_commit_releases_without_raising(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A publisher fenced by another incarnation (init_transactions with its transactional
    id) fails its commit; close() then completes, logs what it dropped, and releases the
    source (a new publisher of it can start in this process)."""
    config = make_config([{"name": "clicks", "partitions": 2}], [SESSION])
    stream = config.streams[0].name
    pub = Application(config).publisher(stream, "a")
    pub.publish_many(clicks(10))
    bootstrap = client.resolve_bootstrap(config)
    other = client.producer(bootstrap, config, transactional_id=transactional_id(stream, "a"))
    other.init_transactions(30)  # fences pub
    with pytest.raises(PublisherFencedError):
        pub.flush()
    with caplog.at_level(logging.WARNING, "substreams.streams.publisher"):
        pub.close()  # raised "Operation not valid in state ..." before
    assert "closed after a failed commit" in caplog.text
    pub.close()  # and again
    del other
    Application(config).publisher(stream, "a").close()  # released
    with Listener(config, stream) as listener:
        assert list(listener.entries(idle_timeout=0.5)) == []


def test_an_acks_write_the_producer_refuses_aborts_and_close_is_clean(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer whose message.max.bytes is below the acks bound refuses an acks message
    at the commit: the transaction is aborted (its records never visible without their
    reports -- the commit used to go through without them), the error is raised once, and
    close() after it is clean."""
    config = make_config([{"name": "clicks", "partitions": 2}], [SESSION])
    stream = config.streams[0].name
    pub = Application(config).publisher(
        stream, "a", batch_size=1 << 40, producer_overrides={"message.max.bytes": 20_000},
    )
    pub.publish_many(clicks(5000))  # ~280 KB of reports: pieces far over 20 KB
    with caplog.at_level(logging.WARNING, "substreams.streams.publisher"), \
            pytest.raises(KafkaException, match="MSG_SIZE_TOO_LARGE"):
        pub.flush()
    with Listener(config, stream) as listener:
        assert list(listener.entries(idle_timeout=0.5)) == []
    assert "a hook's write was refused" in caplog.text
    pub.close()
    assert all(isinstance(m.body, Register) for _, _, m in acks_messages(config))
    Application(config).publisher(stream, "a").close()  # released
