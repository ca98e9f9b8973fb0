"""The acker on a real broker: exactly-once, in-order notifications with firm bounds,
sealed empty times, dead letters, fencing."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from substreams.acker.protocol import (
    AckBlock,
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    SealEntry,
    ack_headers,
    acks_partition,
    encode_ack,
)
from substreams.acker.service import (
    AckerFencedError,
    AckerService,
    checkpoint_topic,
    latest_state,
)
from substreams.app import Application
from substreams.config import Config
from substreams.control.chain import ChainVerifier
from substreams.control.io import read_control
from substreams.control.messages import EpochComplete, EpochsComplete, OffsetRange, completions
from substreams.control.ranges import read_ranges
from substreams.control.traffic import ACK_REPORTS, ACK_SENT, TRAFFIC
from substreams.frontier import Time, sort_key
from substreams.streams.deadletter import UndeliveredError
from substreams.streams.listener import Listener
from substreams.streams.records import Entry
from tests.applied import acks_applied
from tests.conftest import ConfigFactory, follow_notifications, read_dead_letters
from tests.unit.test_dead_letters import FlakyProducer

FAST = {"heartbeat_ms": 200, "flush_ms": 2}


class AckerThread:
    """An AckerService running in a background thread."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self.service = AckerService(config, **kwargs)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.service.run(self.stop)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> AckerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(20)


@contextmanager
def acker(config: Config, **kwargs: Any) -> Iterator[AckerThread]:
    with AckerThread(config, **kwargs) as a:
        yield a
    if a.error is not None:
        raise a.error


def notifications(config: Config, substream: str) -> list[EpochComplete]:
    topic = config.acker.control_topic(substream)
    out = []
    for _, rec in read_control(config.kafka.bootstrap, topic, config):
        out.extend(completions(rec.body))  # one per time, batched or not
    return out


def wait_notifications(
    config: Config, substream: str, count: int, timeout: float = 30.0
) -> list[EpochComplete]:
    return follow_notifications(config, substream, count, timeout)


def verify_chains(config: Config, topics: list[str]) -> None:
    for topic in topics:
        verifier = ChainVerifier()
        for offset, rec in read_control(config.kafka.bootstrap, topic, config):
            brk = verifier.check(offset, rec)
            assert brk is None, f"{topic}: {brk}"


def run_workload(
    config: Config,
    stream: str,
    substream: str,
    rng: random.Random,
    *,
    sources: int = 3,
    records: int = 300,
    time_of: Any,
    empty_time: Time | None = None,
) -> dict[Time, list[tuple[str, str]]]:
    """Sources publish interleaved at random, each with non-decreasing ts, sealing each time
    it moves past; at the end every source seals its last time (and ``empty_time``)."""
    pubs = [
        Application(config).publisher(stream, f"src{i}", batch_size=rng.randrange(3, 40))
        for i in range(sources)
    ]
    ts = [0] * sources
    sent: dict[Time, list[tuple[str, str]]] = defaultdict(list)
    try:
        for n in range(records):
            i = rng.randrange(sources)
            pub = pubs[i]
            prev = time_of(ts[i])
            ts[i] += rng.choice([0, 0, 1, 3, 7])
            t = time_of(ts[i])
            if t != prev and n:
                pub.seal(substream, prev)
            url = f"/r{n}"
            pub.publish({"user": f"u{n % 7}", "url": url, "ts": ts[i]}, key=f"u{n % 7}")
            sent[t].append((f"src{i}", url))
            if rng.random() < 0.02:
                time.sleep(0.01)
        for i, pub in enumerate(pubs):
            pub.seal(substream, time_of(ts[i]))
            if empty_time is not None:
                pub.seal(substream, empty_time)
    finally:
        for pub in pubs:
            pub.close()
    return sent


def check_exactly_once(
    config: Config, substream: str, sent: dict[Time, list[tuple[str, str]]], expected: set[Time]
) -> list[EpochComplete]:
    """Each expected time notified once, in order, and the ranges of each notification hold
    exactly the records published at that time (checked in memory against one full read of
    the data, and with ``read_ranges`` itself for a sample)."""
    got = wait_notifications(config, substream, len(expected))
    times = [n.time for n in got]
    assert sorted(times, key=sort_key) == times, "notifications in order"
    assert len(times) == len(set(times)), "each time exactly once"
    assert set(times) == expected
    streams = {r.stream for n in got for r in n.ranges}
    data: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    for stream in streams:
        with Listener(config, stream) as listener:
            for e in listener.entries(idle_timeout=0.5):
                assert isinstance(e, Entry)
                data[(stream, e.partition)].append(e)
    for note in got:
        inside = [
            e
            for r in note.ranges
            for e in data[(r.stream, r.partition)]
            if r.start <= e.index < r.end and e.times.get(substream) == note.time
        ]
        want = sorted(sent.get(note.time, []))
        assert sorted((e.source, e.payload["url"]) for e in inside) == want, note.time
        assert note.records == len(want)
    for note in random.Random(0).sample(got, min(4, len(got))):
        entries = read_ranges(config.kafka.bootstrap, config, note.ranges, substream, note.time)
        assert sorted((e.source, e.payload["url"]) for e in entries) == sorted(
            sent.get(note.time, [])
        )
    return got


@pytest.mark.parametrize(("kind", "seed"), [("tumbling", 1), ("epoch", 2)])
def test_notifications_exactly_once_in_order_with_firm_bound(
    make_config: ConfigFactory, kind: str, seed: int
) -> None:
    spec: dict[str, Any] = {"name": "s", "stream": "clicks", "kind": kind}
    if kind == "tumbling":
        spec |= {"field": "ts", "size_ms": 10}
    else:
        spec |= {"field": "ts"}
    config = make_config([{"name": "clicks", "partitions": 4}], [spec], acker=FAST)
    stream, sub = config.streams[0].name, config.substreams[0].name

    def time_of(ts: int) -> int:
        return ts // 10 if kind == "tumbling" else ts

    rng = random.Random(seed)
    with acker(config):
        sent = run_workload(config, stream, sub, rng, time_of=time_of, empty_time=10_000)
        expected = set(sent) | {10_000}
        got = check_exactly_once(config, sub, sent, expected)
    assert got[-1].time == 10_000 and got[-1].records == 0 and got[-1].ranges == ()
    # every record is reported twice: SND by its publisher, RCV on delivery (terminal)
    assert TRAFFIC.get(ACK_REPORTS, sub) == 2 * sum(len(v) for v in sent.values())
    verify_chains(config, [config.acker.control_topic(sub), checkpoint_topic(config)])


def test_sealed_empty_time_is_notified_and_unsealed_source_blocks(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    pa, pb = Application(config).publisher(stream, "a"), Application(config).publisher(stream, "b")
    with acker(config) as a, pa, pb:
        pa.publish({"user": "x", "url": "/1", "ts": 1})
        pa.seal(sub, 1)
        deadline = time.monotonic() + 30  # until the acker applied a's record and seal
        while True:
            subs = a.service.view().substreams
            opened = [o for o in subs[sub].open_times if o.time == 1] if sub in subs else []
            if (opened and opened[0].records == 1) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        acks_applied(config)  # a's record and seal applied: any notification is out
        assert notifications(config, sub) == []  # b has not sealed 1
        [open1] = opened
        assert open1.unsealed_sources == ["b"] and open1.records == 1
        pb.seal(sub, 2)  # covers 1 and 2; 2 has no data at all
        pa.seal(sub, 2)
        got = wait_notifications(config, sub, 2)
    assert [(n.time, n.records) for n in got] == [(1, 1), (2, 0)]


def test_reports_are_aggregated_locally(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 4}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config), Application(config).publisher(stream, "a") as pub:
        for k in range(1000):
            pub.publish({"user": "x", "url": f"/{k}", "ts": k // 500})
        pub.seal(sub, 1)
        got = wait_notifications(config, sub, 2)
    assert [(n.time, n.records) for n in got] == [(0, 500), (1, 500)]
    assert TRAFFIC.get(ACK_REPORTS, sub) == 2000
    # register + flushes every few ms + the seal + unregister: far fewer than 2000
    assert 3 <= TRAFFIC.get(ACK_SENT, sub) < 200


def test_an_aborted_publisher_drops_its_transaction_and_stops_its_agent(
    make_config: ConfigFactory,
) -> None:
    """After an error inside ``with Publisher``: the aborted transaction's record and seal
    never reach the acker, the source stays registered (its time stays open), and the
    publisher's tracking agent holds nothing of the dropped transaction."""
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    with acker(config):
        with (
            pytest.raises(RuntimeError, match="boom"),
            Application(config).publisher(stream, "a") as pub,
        ):
            pub.publish({"user": "x", "url": "/committed", "ts": 0})
            pub.flush()
            pub.publish({"user": "x", "url": "/aborted", "ts": 0})
            pub.seal(sub, 0, commit=False)  # rides on the transaction that is dropped
            agent = pub._hooks[sub].agent  # type: ignore[attr-defined]
            raise RuntimeError("boom")
        assert not agent.pending()
        acks_applied(config)  # everything committed was applied: nothing notified
        assert notifications(config, sub) == []  # the aborted seal did not count
        with Application(config).publisher(stream, "a") as again:
            again.seal(sub, 0)
        got = wait_notifications(config, sub, 1)
    assert [(n.time, n.records) for n in got] == [(0, 1)]


def test_malformed_acks_are_dead_lettered_and_the_acker_keeps_running(
    make_config: ConfigFactory,
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    topic = config.acker.acks_topic
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})

    def send(source: str, body: Any, headers: Any = None, seq: int = 1) -> None:
        value = encode_ack(AckMessage(source, seq, 0, body))
        producer.produce(
            topic,
            value,
            partition=acks_partition(source, 1),
            headers=ack_headers() if headers is None else headers,
        )

    producer.produce(topic, b"\x00garbage", headers=ack_headers())
    producer.produce(topic, b"no fingerprint at all")
    send("ghost", AckReport((AckEntry(sub, 5, 123, 0, 1, ()),)))
    send("who", Register(("no-such-substream",)))
    producer.flush(10)
    with acker(config) as a:
        with Application(config).publisher(stream, "a") as pub:
            pub.publish({"user": "x", "url": "/1", "ts": 1})
            pub.seal(sub, 1)
        got = wait_notifications(config, sub, 1)
        assert [n.time for n in got] == [1]
        # a report for a time that already terminated
        send("a", Register((sub,)))
        send("a", AckReport((AckEntry(sub, 1, 99, 0, 1, ()),)), seq=2)
        producer.flush(10)
        deadline = time.monotonic() + 10
        while a.service.dead_letters < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.thread.is_alive()
    letters = list(read_dead_letters(config))
    reasons = sorted(d.reason for d in letters)
    assert reasons == sorted(
        ["malformed", "malformed", "unregistered_source", "unknown_substream", "terminated_time"]
    )
    assert {d.raw for d in letters if d.reason == "malformed"} == {
        b"\x00garbage",
        b"no fingerprint at all",
    }
    assert all(d.topic == topic and d.offset >= 0 for d in letters)


def test_no_checkpoint_passes_a_dead_letter_the_broker_did_not_take(
    make_config: ConfigFactory,
) -> None:
    """A malformed ack whose dead letter cannot be delivered: the step raises before its
    commit, so the checkpoint stays before the ack; ``run()``'s rewind replays it from
    there and the letter is written then (once on the topic)."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker={**FAST, "acks_partitions": 1},
    )
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    producer.produce(config.acker.acks_topic, b"\x00garbage", partition=0, headers=ack_headers())
    producer.flush(10)
    service = AckerService(config)
    try:
        service.start()
        assert service._letters is not None
        service._letters._producer = cast(Producer, FlakyProducer(failures=2))
        deadline = time.monotonic() + 30
        with pytest.raises(UndeliveredError) as failed:
            while time.monotonic() < deadline:
                service.step()
        assert service.dead_letters == 1
        found = latest_state(config)
        assert found is None or found[0].acks_offsets.get(0, 0) == 0  # not past the ack
        service._rewind(failed.value, threading.Event())  # what run() does
        while time.monotonic() < deadline:
            service.step()
            found = latest_state(config)
            if found is not None and found[0].acks_offsets.get(0, 0) == 1:
                break
        assert found is not None and found[0].acks_offsets[0] == 1
    finally:
        service.close()
    [letter] = read_dead_letters(config)
    assert (letter.service, letter.reason, letter.raw) == (
        config.acker.name, "malformed", b"\x00garbage"
    )
    assert (letter.topic, letter.partition, letter.offset) == (config.acker.acks_topic, 0, 0)


def test_a_malformed_block_is_dead_lettered_and_good_blocks_apply(
    make_config: ConfigFactory,
) -> None:
    """A columnar block whose stream index is out of range is dead-lettered as malformed,
    with the reason, and applies nothing; the good blocks after it apply."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    topic = config.acker.acks_topic
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    part = acks_partition("a", config.acker.acks_partitions)

    def block(ts: list[int]) -> AckBlock:
        return AckBlock.pack(sub, ts, [], [1] * len(ts), [2] * len(ts), [1] * len(ts),
                             [OffsetRange(stream, 0, t, t + 1) for t in ts])

    def send(seq: int, body: Any, value: bytes | None = None, headers: Any = None) -> None:
        producer.produce(topic, value or encode_ack(AckMessage("a", seq, 0, body)),
                         partition=part, headers=headers or ack_headers())

    bad = replace(block([1]), streams=())  # its one range names stream 0 of none
    send(1, Register((sub,)))
    send(2, AckReport((), (), (bad,)))
    send(3, AckReport((), (SealEntry(sub, 2, 5),), (block([1, 2]),)))
    send(4, AckReport((), (SealEntry(sub, 4, 6),), (block([3, 4]),)))
    producer.flush(10)
    with acker(config):
        got = wait_notifications(config, sub, 4)
    assert [(n.time, n.records, n.ranges) for n in got] == [
        (t, 1, (OffsetRange(stream, 0, t, t + 1),)) for t in (1, 2, 3, 4)
    ]
    letters = list(read_dead_letters(config))
    assert [d.reason for d in letters] == ["malformed"]
    assert "stream index outside the 0 streams" in letters[0].detail
    assert letters[0].source == "a"


def test_second_acker_with_the_same_name_fences_the_first(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 4}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    pub = Application(config).publisher(stream, "a")
    first = AckerThread(config)
    with first:
        for t in range(5):
            pub.publish({"user": "x", "url": f"/{t}", "ts": t})
            pub.seal(sub, t)
        assert len(wait_notifications(config, sub, 5)) == 5
        with acker(config) as second:
            first.thread.join(10)
            assert isinstance(first.error, AckerFencedError)
            assert "fenced" in str(first.error) and config.acker.name in str(first.error)
            for t in range(5, 10):
                pub.publish({"user": "x", "url": f"/{t}", "ts": t})
                pub.seal(sub, t)
            got = wait_notifications(config, sub, 10)
            assert second.thread.is_alive()
    pub.close()
    assert [n.time for n in got] == list(range(10))
    verify_chains(config, [config.acker.control_topic(sub), checkpoint_topic(config)])


def test_times_that_terminate_together_are_announced_in_one_batched_record(
    make_config: ConfigFactory,
) -> None:
    """40 epochs sealed by one seal terminate in one acker step: ONE ``EpochsComplete``
    announces them, in order, each with exactly its records; the chain verifies."""
    config = make_config(
        [{"name": "clicks", "partitions": 3}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    sent: dict[Time, list[tuple[str, str]]] = defaultdict(list)
    with acker(config), Application(config).publisher(stream, "src0") as pub:
        for n in range(200):
            t = n // 5
            pub.publish({"user": f"u{n % 7}", "url": f"/r{n}", "ts": t}, key=f"u{n % 7}")
            sent[t].append(("src0", f"/r{n}"))
        pub.flush()
        acks_applied(config)  # the records applied before the seal (nothing ends yet)
        pub.seal(sub, 39)
        check_exactly_once(config, sub, sent, set(range(40)))
    topic = config.acker.control_topic(sub)
    batches = [r.body for _, r in read_control(config.kafka.bootstrap, topic, config)
               if isinstance(r.body, EpochsComplete)]
    assert batches, "no batched record"
    assert max(len(b.epochs) for b in batches) >= 10, [len(b.epochs) for b in batches]
    verify_chains(config, [topic, checkpoint_topic(config)])
