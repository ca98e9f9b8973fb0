"""The subscriber on a real broker: firm bound and order, joining mid-stream, merged frontiers.

Data comes from real publishers (3 sources, 4 partitions); control records come from a
ControlWriter + ProgressTracker driven here the way a progress writer drives them: a time
is activated on its first record and completed with the ranges that truly hold it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import TopicPartition

from substreams.app import UNTRACKED, Application
from substreams.config import Config
from substreams.control.io import ControlWriter, now_ms, read_control
from substreams.control.messages import Completion, FrontierSnapshot, OffsetRange, WriterHeartbeat
from substreams.control.progress import ProgressTracker
from substreams.control.subscriber import (
    Data,
    Event,
    FrontierAdvanced,
    Subscriber,
    find_latest_snapshot,
)
from substreams.control.traffic import CONTROL_READ, TRAFFIC
from substreams.frontier import Antichain, Time
from substreams.kafka import client
from substreams.streams.listener import Listener, StreamDecoder
from substreams.streams.publisher import Publisher
from substreams.streams.records import Entry
from tests.conftest import ConfigFactory

SOURCES = ("a", "b", "c")


class Writer:
    """A progress writer for one substream, as the acker or the aligner would run it."""

    def __init__(self, config: Config, substream: str, snapshot_every: int, name: str,
                 control: ControlWriter | None = None) -> None:
        self.config = config
        self.substream = substream
        self.topic = config.acker.control_topic(substream)
        self.control = control or ControlWriter(config.kafka.bootstrap, name, [self.topic], config)
        self.tracker = ProgressTracker(substream, snapshot_every)
        self.by_time: dict[Time, list[Entry]] = defaultdict(list)
        self.lower_after: dict[Time, Antichain] = {}
        self.written = 0
        self.listener: Listener | None = None

    def observe(self) -> None:
        """Activate every time on its first record, remembering where its records are."""
        if self.listener is None:
            self.listener = Listener(self.config, self.config.substream(self.substream).stream)
        for entry in self.listener.entries(idle_timeout=0.3):
            assert isinstance(entry, Entry)
            t = entry.times[self.substream]
            self.tracker.activate(t)
            self.by_time[t].append(entry)

    def activate(self, t: Time) -> None:
        self.tracker.activate(t)

    def complete(self, *times: Time) -> None:
        """Announce ``times`` in one record (an ``EpochsComplete`` for several, as the acker
        writes a run of times that terminated together)."""
        stream = self.config.substream(self.substream).stream
        done: list[tuple[Completion, tuple[Time, ...]]] = []
        for t in times:
            spans: dict[int, list[int]] = defaultdict(list)
            for e in self.by_time.get(t, []):
                spans[e.partition].append(e.index)
            ranges = tuple(
                OffsetRange(stream, p, min(ix), max(ix) + 1) for p, ix in spans.items()
            )
            done.append((Completion(t, ranges, len(self.by_time.get(t, [])), now_ms()), ()))
        before = self.tracker.lower.frontier()
        bodies = self.tracker.complete_many(done)
        self.control.write([(self.topic, b) for b in bodies])
        self.written += len(bodies)
        for t in times:  # a batch's frontier changes apply after its last time
            self.lower_after[t] = before
        self.lower_after[times[-1]] = self.tracker.lower.frontier()

    def close(self) -> None:
        self.control.close()
        if self.listener is not None:
            self.listener.close()


def publish(pubs: dict[str, Publisher], epoch: int, per_source: int, start: int = 0) -> None:
    """``per_source`` records of window ``epoch`` from every source, round-robin partitions."""
    for name, pub in pubs.items():
        for i in range(start, start + per_source):
            pub.publish({"user": f"{name}{i}", "url": f"/{epoch}/{i}", "ts": epoch * 100 + i})
        pub.flush()


def collect(sub: Subscriber, done: Callable[[list[Event]], bool], timeout: float = 20.0
            ) -> list[Event]:
    """Events until ``done`` says so (then a short quiet period to catch any extra)."""
    out: list[Event] = []
    deadline = time.monotonic() + timeout
    while not done(out) and time.monotonic() < deadline:
        out.extend(sub.poll(0.5))
    out.extend(sub.poll(0.5))
    return out


def data_count(n: int) -> Callable[[list[Event]], bool]:
    return lambda events: sum(isinstance(e, Data) for e in events) >= n


def frontier_empty(events: list[Event]) -> bool:
    return any(isinstance(e, FrontierAdvanced) and e.frontier.is_empty() for e in events)


@pytest.fixture
def world(make_config: ConfigFactory) -> Iterator[tuple[Config, str, dict[str, Publisher]]]:
    config = make_config(
        [{"name": "clicks", "partitions": 4}],
        [{"name": "win", "stream": "clicks", "kind": "tumbling", "size_ms": 100}],
    )
    stream = config.streams[0].name
    pubs = {s: Application(config, mechanisms=UNTRACKED).publisher(stream, s) for s in SOURCES}
    try:
        yield config, config.substreams[0].name, pubs
    finally:
        for p in pubs.values():
            p.close()


def keys(entries: list[Entry]) -> set[tuple[int, int]]:
    return {(e.partition, e.index) for e in entries}


@pytest.mark.parametrize("batched", [False, True])
def test_firm_data_events_hold_exactly_each_epoch_in_notification_order(
    world: tuple[Config, str, dict[str, Publisher]], batched: bool
) -> None:
    """Also with epochs 1-3 announced in ONE batched record (``EpochsComplete``): one Data
    event per epoch, each with exactly its records, in order."""
    config, win, pubs = world
    w = Writer(config, win, snapshot_every=2, name=config.acker.name)
    try:
        publish(pubs, 0, 5)
        publish(pubs, 1, 4)  # epoch 1 starts before 0 completes: ranges interleave
        w.observe()
        w.complete(0)
        publish(pubs, 1, 3, start=4)
        publish(pubs, 2, 2)
        w.observe()
        if batched:
            w.activate(3)
            w.complete(1, 2, 3)  # 3 is a skipped epoch: no records, still announced
            kinds = [type(r.body).__name__ for _, r in read_control(
                config.kafka.bootstrap, w.topic, config)]
            assert kinds.count("EpochsComplete") == 1, kinds
        else:
            w.complete(1)
            w.complete(2)
            w.activate(3)
            w.complete(3)  # a skipped epoch: no records, still announced
        publish(pubs, 4, 6)
        w.observe()
        w.complete(4)
        before = TRAFFIC.get(CONTROL_READ, win)
        with Subscriber(config, [win], start="beginning") as sub:
            assert sub.mode == "firm"
            events = collect(sub, data_count(5))
            assert list(sub.events(idle_timeout=0.5)) == []  # nothing more, iteration ends
        assert TRAFFIC.get(CONTROL_READ, win) - before == w.written
    finally:
        w.close()
    datas = [e for e in events if isinstance(e, Data)]
    assert [d.time for d in datas] == [0, 1, 2, 3, 4]
    for d in datas:
        assert d.substream == win
        assert keys(d.records) == keys(w.by_time.get(d.time, []))
        assert all(r.times[win] == d.time for r in d.records)
    assert [len(d.records) for d in datas] == [15, 21, 6, 0, 18]
    # each Data is followed by the frontier its completion produced, nothing in between
    expected: list[Event] = []
    last = Antichain()
    for d in datas:
        expected.append(d)
        if w.lower_after[d.time] != last:
            last = w.lower_after[d.time]
            expected.append(FrontierAdvanced(last))
    assert [(type(e).__name__, getattr(e, "time", None), getattr(e, "frontier", None))
            for e in events] == [
        (type(e).__name__, getattr(e, "time", None), getattr(e, "frontier", None))
        for e in expected
    ]


@pytest.mark.parametrize("mode", ["firm", "soft"])
def test_joining_mid_stream_never_sees_part_of_an_epoch(
    world: tuple[Config, str, dict[str, Publisher]], mode: str
) -> None:
    config, win, pubs = world
    w = Writer(config, win, snapshot_every=1, name=config.acker.name)
    try:
        publish(pubs, 0, 3)
        publish(pubs, 1, 3)
        w.observe()
        w.complete(0)  # snapshot: upper {1}
        publish(pubs, 2, 2)  # epoch 2 half written: active when the next snapshot is taken
        w.observe()
        w.complete(1)  # the latest snapshot: lower {2}, upper {2}
        snaps = [r.body for _, r in read_control(config.kafka.bootstrap, w.topic, config)
                 if isinstance(r.body, FrontierSnapshot)]
        assert len(snaps) == 2 and list(snaps[-1].upper) == [2]
        with Subscriber(config, [win], start="latest_snapshot", mode=mode) as sub:  # type: ignore[arg-type]
            assert sub.frontier == Antichain([2])
            publish(pubs, 2, 2, start=2)  # the rest of epoch 2
            publish(pubs, 3, 3)
            w.observe()
            w.complete(2)
            publish(pubs, 4, 2)
            w.observe()
            w.complete(3)
            w.complete(4)
            events = collect(sub, frontier_empty)
    finally:
        w.close()
    datas = [e for e in events if isinstance(e, Data)]
    got: dict[Time, list[Entry]] = defaultdict(list)
    for d in datas:
        got[d.time].extend(d.records)
    assert 2 not in got  # active at the snapshot: never delivered, not even in part
    assert set(got) == {3, 4}  # the first time above the snapshot's upper frontier is 3
    for t in (3, 4):
        assert keys(got[t]) == keys(w.by_time[t])
    if mode == "firm":
        assert [d.time for d in datas] == [3, 4]
    # soft bound: every record of a time arrives before the frontier that completes it
    for t in (3, 4):
        last_data = max(i for i, e in enumerate(events) if isinstance(e, Data) and e.time == t)
        done = next(i for i, e in enumerate(events)
                    if isinstance(e, FrontierAdvanced) and e.frontier == w.lower_after[t])
        assert last_data < done
    assert sub.frontier == w.lower_after[4] == Antichain()


def test_merged_frontiers_for_partially_ordered_times(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "a", "stream": "clicks", "kind": "epoch", "field": "ts"},
         {"name": "b", "stream": "clicks", "kind": "epoch", "field": "ts"}],
    )
    a, b = (s.name for s in config.substreams)
    # one writer (as one acker) for both topics: a chain per topic, the same writer name
    both = ControlWriter(config.kafka.bootstrap, config.acker.name,
                         [config.acker.control_topic(n) for n in (a, b)], config)
    wa = Writer(config, a, snapshot_every=1, name=config.acker.name, control=both)
    wb = Writer(config, b, snapshot_every=1, name=config.acker.name, control=both)

    def settle(sub: Subscriber, done: Callable[[list[Event]], bool]) -> list[Event]:
        """The events read until ``done(events)`` holds (30 s at most): a quiet gap in the
        records is not their end on a loaded machine, the expected state is."""
        out: list[Event] = []
        deadline = time.monotonic() + 30.0
        while not done(out) and time.monotonic() < deadline:
            out.extend(sub.poll(0.2))
        return out

    def data(events: list[Event]) -> set[tuple[str, Time]]:
        return {(e.substream, e.time) for e in events if isinstance(e, Data)}

    try:
        for t in [(0, 0), (1, 2)]:
            wa.activate(t)
        wa.complete((0, 0))  # a: lower {(1,2)}, upper {(1,2)}
        for t in [(0, 1), (2, 1)]:
            wb.activate(t)
        wb.complete((0, 1))  # b: lower {(2,1)}, upper {(2,1)}
        with Subscriber(config, [a, b], start="latest_snapshot", mode="firm") as sub:
            assert sub.frontier == Antichain([(1, 2), (2, 1)])  # meet of the parts
            assert sub.frontiers.upper.elements() == ((1, 2), (2, 1))  # union of the parts
            wa.activate((1, 1))  # latent at the snapshot but below its upper: filtered
            wa.activate((3, 0))  # incomparable with both upper elements: delivered
            wa.complete((1, 1))
            wa.complete((1, 2))
            events = settle(sub, lambda _: sub.frontier == Antichain([(3, 0), (2, 1)]))
            assert not [e for e in events if isinstance(e, Data)]
            assert sub.frontier == Antichain([(3, 0), (2, 1)])
            assert sub.frontiers.upper.elements() == ((2, 1),)  # (1,2) passed, (2,1) not
            wb.activate((2, 2))
            wb.complete((2, 1))  # filtered: active at b's snapshot
            events = settle(sub, lambda _: sub.frontier == Antichain([(3, 0), (2, 2)]))
            assert not [e for e in events if isinstance(e, Data)]
            assert sub.frontier == Antichain([(3, 0), (2, 2)])
            assert sub.frontiers.upper.is_empty()
            wb.complete((2, 2))
            wa.complete((3, 0))
            events = settle(sub, lambda seen: data(seen) == {(b, (2, 2)), (a, (3, 0))})
    finally:
        wa.close()
        wb.close()
    assert data(events) == {
        (b, (2, 2)), (a, (3, 0))
    }
    assert [e.frontier for e in events if isinstance(e, FrontierAdvanced)][-1] == Antichain()


def test_soft_mode_holds_a_completion_until_its_records_are_read(
    world: tuple[Config, str, dict[str, Publisher]],
) -> None:
    """A control record can be readable before the data it announces (a slow data fetch);
    here the data's transaction is still open when its EpochComplete is written."""
    config, win, pubs = world
    stream = config.streams[0].name
    w = Writer(config, win, snapshot_every=100, name=config.acker.name)
    try:
        with Subscriber(config, [win], start="beginning", mode="soft") as sub:
            for i in range(8):
                pubs["a"].publish({"user": "a", "url": f"/{i}", "ts": 500 + i})
            # the records are in the log but not committed: find them read_uncommitted
            peek = client.consumer(config.kafka.bootstrap, config,
                                   **{"isolation.level": "read_uncommitted"})
            peek.assign([TopicPartition(stream, p, 0) for p in range(4)])
            deadline = time.monotonic() + 10
            while len(w.by_time[5]) < 8 and time.monotonic() < deadline:
                for msg in peek.consume(100, 0.2):
                    if not msg.error():
                        w.by_time[5].append(StreamDecoder(config, stream).decode(msg))  # type: ignore[arg-type]
            peek.close()
            w.activate(5)
            w.activate(6)
            w.complete(5)  # the frontier moves to {6}
            held = collect(sub, lambda _: False, timeout=1.5)
            assert held == []  # neither the data nor the completion yet
            pubs["a"].flush()
            events = collect(sub, lambda ev: any(isinstance(e, FrontierAdvanced) for e in ev))
    finally:
        w.close()
    assert events[-1] == FrontierAdvanced(Antichain([6]))
    got = [r for e in events if isinstance(e, Data) for r in e.records]
    assert keys(got) == keys(w.by_time[5]) and len(got) == 8


def test_backwards_search_finds_the_latest_snapshot(make_config: ConfigFactory) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": k, "stream": "clicks", "kind": "epoch", "field": "ts"} for k in "xyz"],
    )
    x, y, z = (s.name for s in config.substreams)
    wx = Writer(config, x, snapshot_every=4, name=config.acker.name + "-x")
    wy = Writer(config, y, snapshot_every=1, name=config.acker.name + "-y")
    try:
        for t in range(30):  # x: snapshots after 4, 8, ..., 28 completions
            wx.complete(t)
        wy.complete(0)  # y: one snapshot, at the very start; then 40 heartbeats
        for _ in range(40):
            wy.control.write([(wy.topic, WriterHeartbeat(y))])
        boot = config.kafka.bootstrap
        found = find_latest_snapshot(boot, wx.topic, config, window=2)
        assert found is not None
        snaps = [(o, r) for o, r in read_control(boot, wx.topic, config)
                 if isinstance(r.body, FrontierSnapshot)]
        assert len(snaps) == 7 and found == snaps[-1]
        found_y = find_latest_snapshot(boot, wy.topic, config, window=2)
        assert found_y is not None and found_y[0] == read_control(boot, wy.topic, config)[1][0]
        assert find_latest_snapshot(boot, config.acker.control_topic(z), config) is None
    finally:
        wx.close()
        wy.close()
