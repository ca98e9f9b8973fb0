"""The ``Log`` contract: the same cases against a real Apache Kafka (``KafkaLog`` on the
session's broker) and the in-memory log (``MemoryLog`` on a simulated clock, with markers
written at once and 20 ms after the decision), so the fake cannot drift from Kafka.

Every wait is on the environment's clock (:func:`wait_until`): real seconds against Kafka,
simulated steps against the in-memory log.  What Kafka does asynchronously (transaction
markers after ``commit`` returned, the coordinator's abort of a timed-out transaction) is
waited for, never assumed to have happened when the call returned."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from substreams.errors import BrokerError
from substreams.kafka.brokerlog import KafkaLog
from substreams.kafka.clock import Clock, SimClock, SystemClock, wait_until
from substreams.kafka.log import (
    OFFSET_END,
    Committed,
    FencedError,
    Log,
    Partition,
    Record,
)
from substreams.kafka.memory import MemoryLog
from substreams.kafka.write import FENCED_CODES, fatal_error, is_fenced


@dataclass
class Env:
    kind: str
    log: Log
    clock: Clock

    def topic(self, partitions: int = 1) -> str:
        name = f"log-contract-{uuid.uuid4().hex[:10]}"
        self.log.create_topics({name: partitions})
        return name

    def tid(self) -> str:
        return f"log-contract-{uuid.uuid4().hex[:10]}"

    def ends(self, topic: str, partitions: int = 1) -> tuple[dict[int, int], dict[int, int]]:
        """(last stable offsets, high watermarks)."""
        parts = list(range(partitions))
        return (self.log.end_offsets(topic, parts, committed=True),
                self.log.end_offsets(topic, parts, committed=False))

    def settled(self, topic: str, partitions: int = 1, timeout: float = 20.0) -> dict[int, int]:
        """Wait until no transaction holds any partition (LSO == HW); the ends."""
        found: list[dict[int, int]] = []

        def stable() -> bool:
            lso, high = self.ends(topic, partitions)
            found[:] = [high]
            return lso == high

        assert wait_until(self.clock, stable, timeout), f"{topic}: still held: {found}"
        return found[0]

    def read(self, starts: dict[Partition, int], *, committed: bool = True,
             timeout: float = 20.0) -> tuple[list[Record], dict[Partition, int]]:
        """Every record from ``starts`` to the end of each partition; and the positions."""
        reader = self.log.reader(committed=committed)
        try:
            reader.assign(starts)
            got: list[Record] = []

            def done() -> bool:
                got.extend(reader.poll(0.1))
                return reader.caught_up

            assert wait_until(self.clock, done, timeout), f"no end of {starts}"
            return got, dict(reader.positions)
        finally:
            reader.close()


@pytest.fixture(params=["kafka", "memory", "memory-delayed-markers"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    if request.param == "kafka":
        bootstrap: str = request.getfixturevalue("bootstrap")
        yield Env("kafka", KafkaLog(bootstrap), SystemClock())
        return
    clock = SimClock()
    delay = 20 if request.param == "memory-delayed-markers" else 0
    yield Env(request.param, MemoryLog(clock, marker_delay_ms=delay), clock)


def values(records: list[Record]) -> list[bytes | None]:
    return [r.value for r in records]


# -- offsets, markers, records ------------------------------------------------------------


def test_a_commit_writes_one_marker_per_partition_and_offsets_skip_it(env: Env) -> None:
    topic = env.topic(2)
    w = env.log.transactional_writer(env.tid())
    before = env.clock.now_ms()
    w.begin()
    w.produce(topic, 0, b"a", key=b"k", headers=[("h", b"1")], timestamp_ms=1234)
    w.produce(topic, 0, b"b")
    w.produce(topic, 1, b"c")
    sent = w.flush()
    after = env.clock.now_ms()
    w.commit()
    assert [(r.partition, r.offset, r.value) for r in sent] == [(0, 0, b"a"), (0, 1, b"b"),
                                                                (1, 0, b"c")]
    assert env.settled(topic, 2) == {0: 3, 1: 2}  # a marker after each partition's records
    got, positions = env.read({(topic, 0): 0, (topic, 1): 0})
    by_part = {p: [(r.offset, r.value) for r in got if r.partition == p] for p in (0, 1)}
    assert by_part == {0: [(0, b"a"), (1, b"b")], 1: [(0, b"c")]}
    first = next(r for r in got if r.value == b"a")
    assert (first.key, first.headers, first.timestamp_ms) == (b"k", (("h", b"1"),), 1234)
    second = next(r for r in got if r.value == b"b")
    assert second.key is None and before <= second.timestamp_ms <= after + 1
    assert positions == {(topic, 0): 3, (topic, 1): 2}  # the end event passed the markers
    w.begin()
    w.produce(topic, 0, b"d")
    [d] = w.flush()
    w.commit()
    assert d.offset == 3
    assert env.settled(topic, 2) == {0: 5, 1: 2}
    w.close()


def test_an_abort_hides_its_records_from_committed_readers_only(env: Env) -> None:
    topic = env.topic()
    w = env.log.transactional_writer(env.tid())
    w.begin()
    w.produce(topic, 0, b"x")
    w.produce(topic, 0, b"y")
    w.flush()
    w.abort()
    assert env.settled(topic) == {0: 3}
    got, positions = env.read({(topic, 0): 0})
    assert got == [] and positions == {(topic, 0): 3}
    raw, _ = env.read({(topic, 0): 0}, committed=False)
    assert values(raw) == [b"x", b"y"]
    at = env.log.record_at(topic, 0, 1)
    assert at is not None and at.value == b"y"  # read_uncommitted: also an aborted record
    assert env.log.record_at(topic, 0, 2) is None  # the abort marker
    assert env.log.record_at(topic, 0, 3) is None  # past the end
    w.close()


def test_empty_and_offsets_only_transactions_write_no_data_marker(env: Env) -> None:
    topic = env.topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    w = env.log.transactional_writer(env.tid())
    w.begin()
    w.commit()
    w.begin()
    w.send_offsets(group, {(topic, 0): Committed(5)})
    w.commit()
    assert wait_until(env.clock, lambda: bool(_stable_offsets(env, group, (topic, 0))), 20)
    assert env.log.committed_offsets(group, [(topic, 0)]) == {(topic, 0): Committed(5)}
    assert env.ends(topic) == ({0: 0}, {0: 0})
    w.close()


# -- read_committed: the last stable offset --------------------------------------------------


def test_an_open_transaction_holds_the_last_stable_offset(env: Env) -> None:
    topic = env.topic()
    opened = env.log.transactional_writer(env.tid())
    other = env.log.transactional_writer(env.tid())
    idem = env.log.writer()
    other.begin()
    other.produce(topic, 0, b"before")
    other.commit()
    env.settled(topic)  # "before" at 0, its marker at 1
    opened.begin()
    opened.produce(topic, 0, b"open")
    [held] = opened.flush()
    assert held.offset == 2
    other.begin()
    other.produce(topic, 0, b"behind")
    other.commit()
    assert wait_until(env.clock, lambda: env.ends(topic)[1] == {0: 5}, 20)  # its marker
    idem.produce(topic, 0, b"idempotent")
    [i] = idem.flush()
    assert i.offset == 5  # open 2, behind 3, its marker 4
    assert wait_until(env.clock, lambda: env.ends(topic) == ({0: 2}, {0: 6}), 20), env.ends(topic)
    got, positions = env.read({(topic, 0): 0})
    assert values(got) == [b"before"] and positions == {(topic, 0): 2}  # at end: the LSO
    raw, raw_positions = env.read({(topic, 0): 0}, committed=False)
    assert values(raw) == [b"before", b"open", b"behind", b"idempotent"]
    assert raw_positions == {(topic, 0): 6}
    opened.commit()
    assert env.settled(topic) == {0: 7}
    got, positions = env.read({(topic, 0): 0})
    assert values(got) == [b"before", b"open", b"behind", b"idempotent"]
    assert [r.offset for r in got] == [0, 2, 3, 5] and positions == {(topic, 0): 7}
    for w in (opened, other, idem):
        w.close()


def test_a_transaction_over_two_topics_holds_both_and_shows_both_at_once(env: Env) -> None:
    data, acks = env.topic(), env.topic()
    w = env.log.transactional_writer(env.tid())
    w.begin()
    w.produce(data, 0, b"record")
    w.produce(acks, 0, b"report")
    w.flush()
    assert env.ends(data) == ({0: 0}, {0: 1}) and env.ends(acks) == ({0: 0}, {0: 1})
    w.commit()
    assert env.settled(data) == {0: 2} and env.settled(acks) == {0: 2}
    got, _ = env.read({(data, 0): 0, (acks, 0): 0})
    assert sorted(values(got), key=str) == [b"record", b"report"]
    w.close()


def test_a_reader_at_end_sees_later_records_and_ends_again(env: Env) -> None:
    topic = env.topic()
    w = env.log.transactional_writer(env.tid())
    reader = env.log.reader()
    try:
        reader.assign({(topic, 0): 0})
        assert wait_until(env.clock, lambda: bool(reader.poll(0.1)) or reader.caught_up, 20)
        assert reader.caught_up and reader.positions == {(topic, 0): 0}
        w.begin()
        w.produce(topic, 0, b"n")
        w.commit()
        got: list[Record] = []

        def done() -> bool:
            got.extend(reader.poll(0.1))
            return bool(got) and reader.caught_up

        assert wait_until(env.clock, done, 20)
        assert values(got) == [b"n"] and reader.positions == {(topic, 0): 2}
        assert reader.at_end == {(topic, 0)}
    finally:
        reader.close()
        w.close()


# -- transactional ids: fencing and the coordinator's timeout -------------------------------


def test_a_new_holder_of_the_id_fences_the_old_and_aborts_its_transaction(env: Env) -> None:
    topic = env.topic()
    tid = env.tid()
    old = env.log.transactional_writer(tid)
    old.begin()
    old.produce(topic, 0, b"zombie")
    old.flush()
    new = env.log.transactional_writer(tid)
    assert env.settled(topic) == {0: 2}  # aborted: the record and its abort marker
    with pytest.raises(FencedError):
        old.produce(topic, 0, b"late")
        old.commit()
    new.begin()
    new.produce(topic, 0, b"new")
    new.commit()
    env.settled(topic)
    got, _ = env.read({(topic, 0): 0})
    assert values(got) == [b"new"]
    new.close()


def test_a_fence_found_during_flush_is_the_fence_error_every_time(bootstrap: str) -> None:
    """Kafka only: the fence reaches the old producer as the answer to its next produce
    request, inside ``flush``.  A delivery callback that calls into C (here ``list.append``)
    served after confluent-kafka's fatal-error exception made that flush raise
    ``SystemError`` (7 of 10 times here); :func:`client.flush_producer` raises the fence."""
    from confluent_kafka import KafkaException

    from substreams.kafka import client

    log = KafkaLog(bootstrap)
    topic = f"log-contract-{uuid.uuid4().hex[:10]}"
    log.create_topics({topic: 1})
    failed: list[object] = []
    for _ in range(5):
        tid = f"log-contract-{uuid.uuid4().hex[:10]}"
        old = client.producer(bootstrap, transactional_id=tid)
        old.init_transactions(30)
        old.begin_transaction()
        old.produce(topic, b"zombie", partition=0)
        client.flush_producer(old, "old")
        log.transactional_writer(tid).close()
        old.produce(topic, b"late", partition=0, on_delivery=lambda e, m: failed.append(e))
        with pytest.raises(KafkaException) as raised:
            client.flush_producer(old, "old")
        assert is_fenced(raised.value), raised.value
        found = fatal_error(old)  # the probe alone, as after a lost exception
        assert found is not None and found.code() in FENCED_CODES


def test_the_fatal_error_probe_leaves_a_sound_producer_as_it_was(bootstrap: str) -> None:
    """Kafka only: :func:`fatal_error`'s ``init_transactions`` on a producer inside its
    transaction finds nothing and changes nothing: the transaction still commits."""
    from substreams.kafka import client

    log = KafkaLog(bootstrap)
    topic = f"log-contract-{uuid.uuid4().hex[:10]}"
    log.create_topics({topic: 1})
    sound = client.producer(bootstrap, transactional_id=f"log-contract-{uuid.uuid4().hex[:10]}")
    sound.init_transactions(30)
    sound.begin_transaction()
    sound.produce(topic, b"kept", partition=0)
    assert fatal_error(sound) is None
    client.flush_producer(sound, "sound")
    sound.commit_transaction(30)
    got, _ = Env("kafka", log, SystemClock()).read({(topic, 0): 0})
    assert values(got) == [b"kept"]


def test_a_fenced_writer_without_open_transaction_fails_its_next_one(env: Env) -> None:
    topic = env.topic()
    tid = env.tid()
    old = env.log.transactional_writer(tid)
    env.log.fence(tid)
    with pytest.raises(FencedError):
        old.begin()
        old.produce(topic, 0, b"late")
        old.commit()
    group = f"g-{uuid.uuid4().hex[:8]}"
    with pytest.raises(FencedError):
        old.send_offsets(group, {(topic, 0): Committed(1)})
    assert env.ends(topic) == ({0: 0}, {0: 0})  # nothing of it reached the log


def test_the_coordinator_aborts_a_transaction_past_its_timeout_and_fences_it(env: Env) -> None:
    topic = env.topic()
    w = env.log.transactional_writer(env.tid(), timeout_ms=1000)
    w.begin()
    w.produce(topic, 0, b"slow")
    w.flush()
    assert env.ends(topic) == ({0: 0}, {0: 1})
    assert env.settled(topic, timeout=30) == {0: 2}  # Kafka: within its cleanup interval
    with pytest.raises(FencedError):
        w.commit()
    got, _ = env.read({(topic, 0): 0})
    assert got == []


# -- consumer-group offsets inside transactions -----------------------------------------------


def test_group_offsets_become_committed_with_the_transaction(env: Env) -> None:
    topic = env.topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    tp = (topic, 0)
    assert env.log.committed_offsets(group, [tp]) == {}
    w = env.log.transactional_writer(env.tid())
    w.begin()
    w.produce(topic, 0, b"out")
    w.send_offsets(group, {tp: Committed(7, "m1")})
    w.flush()
    with pytest.raises(BrokerError):  # UNSTABLE_OFFSET_COMMIT until the transaction ends
        env.log.committed_offsets(group, [tp], timeout=1.0)
    w.commit()
    assert wait_until(env.clock, lambda: bool(_stable_offsets(env, group, tp)), 20)
    assert env.log.committed_offsets(group, [tp]) == {tp: Committed(7, "m1")}
    w.begin()
    w.send_offsets(group, {tp: Committed(9)})
    w.abort()
    env.settled(topic)
    assert wait_until(env.clock, lambda: _stable_offsets(env, group, tp) is not None, 20)
    assert env.log.committed_offsets(group, [tp]) == {tp: Committed(7, "m1")}
    w.close()


def _stable_offsets(env: Env, group: str, tp: Partition) -> dict[Partition, Committed] | None:
    try:
        return env.log.committed_offsets(group, [tp], timeout=1.0)
    except BrokerError:
        return None


# -- the log start, and reading outside the log -------------------------------------------------


def test_delete_records_moves_the_log_start_and_readers_start_there(env: Env) -> None:
    topic = env.topic()
    w = env.log.writer()
    for i in range(5):
        w.produce(topic, 0, b"%d" % i)
    assert [r.offset for r in w.flush()] == [0, 1, 2, 3, 4]
    assert env.log.delete_records(topic, 0, 3) == 3
    assert env.log.start_offsets(topic, [0]) == {0: 3}
    got, positions = env.read({(topic, 0): 0})
    assert values(got) == [b"3", b"4"] and positions == {(topic, 0): 5}
    assert env.log.record_at(topic, 0, 1) is None
    at = env.log.record_at(topic, 0, 3)
    assert at is not None and at.value == b"3"
    assert env.log.delete_records(topic, 0, 1) == 3  # below the start: nothing moves
    with pytest.raises(BrokerError):
        env.log.delete_records(topic, 0, 6)  # past the high watermark
    w.close()


def test_an_offset_past_the_end_reads_from_the_log_start(env: Env) -> None:
    topic = env.topic()
    w = env.log.writer()
    w.produce(topic, 0, b"a")
    w.produce(topic, 0, b"b")
    w.flush()
    got, positions = env.read({(topic, 0): 100})  # auto.offset.reset=earliest
    assert values(got) == [b"a", b"b"] and positions == {(topic, 0): 2}
    got, positions = env.read({(topic, 0): OFFSET_END})
    assert got == [] and positions == {(topic, 0): 2}
    w.close()


# -- misuse, and a writer that dies inside its transaction ----------------------------------------


def test_transactional_calls_outside_a_transaction_are_refused(env: Env) -> None:
    topic = env.topic()
    w = env.log.transactional_writer(env.tid())
    with pytest.raises(BrokerError):
        w.produce(topic, 0, b"stray")
    assert w.flush() == []
    with pytest.raises(BrokerError):
        w.commit()
    with pytest.raises(BrokerError):
        w.abort()
    w.begin()
    with pytest.raises(BrokerError):
        w.begin()
    w.abort()
    assert env.ends(topic) == ({0: 0}, {0: 0})
    w.close()


def test_a_writer_gone_inside_its_transaction_holds_readers_until_fenced(env: Env) -> None:
    topic = env.topic()
    tid = env.tid()
    dead = env.log.transactional_writer(tid)
    live = env.log.transactional_writer(env.tid())
    dead.begin()
    dead.produce(topic, 0, b"dead")
    dead.flush()
    dead.close()  # a crash: no commit, no abort
    live.begin()
    live.produce(topic, 0, b"live")
    live.commit()
    assert wait_until(env.clock, lambda: env.ends(topic) == ({0: 0}, {0: 3}), 20)
    got, _ = env.read({(topic, 0): 0})
    assert got == []  # the live writer's commit is there, and invisible
    env.clock.sleep(0.5)
    assert env.ends(topic) == ({0: 0}, {0: 3})  # still held: nothing but a fence frees it
    env.log.fence(tid)
    assert env.settled(topic) == {0: 4}
    got, _ = env.read({(topic, 0): 0})
    assert values(got) == [b"live"]
    live.close()
