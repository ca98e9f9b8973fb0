"""Late is per substream (issue 43, item 2): the real :class:`Publisher` with its seal
policies and the real acker :class:`Tracker` over the in-memory log, the real
:class:`AckerCore` reading the acks they committed, and a reader that takes a
notification's records as every substreams reader does (the records in its offset ranges
whose envelope time in the substream belongs to it).

The property (random policies over two substreams of one stream, random out-of-order event
times): no record on time for a substream is ever missing from its notifications; every
record late for a ``late: dead_letter`` substream is absent from it, still in the other
if on time there, and dead-lettered once naming it; a record late for a ``raise``
substream is refused whole, the error naming that substream.

The oracle of "late" is the seal policy's rule (``substreams/streams/policy.py``) in a few
lines of arithmetic over the event times the publisher wrote before the record."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.core import AckerCore
from substreams.acker.protocol import SOURCE
from substreams.acker.state import AckerState
from substreams.acker.tracker import Tracker
from substreams.app import Application
from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.control.messages import EpochComplete, completions, epoch_covers
from substreams.errors import SealedTimeError, SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.kafka.clock import SimClock
from substreams.kafka.log import Record
from substreams.kafka.memory import MemoryLog
from substreams.kafka.memproducer import MemoryProducers
from substreams.streams.deadletter import REASON_LATE, DeadLetter
from substreams.streams.publisher import Publisher, transactional_id
from substreams.streams.records import times_from_wire
from substreams.streams.schemas import Codec, envelope_schema

SCHEMA = Path(__file__).resolve().parents[1] / "sim" / "record.avsc"
"""``{inc, e, k, key, ts}``: ``k`` is the order key (a sequence number), ``ts`` the event
time, out of order."""
STREAM = "orders"
PARTITIONS = 2
SUBS = ("a", "b")
KEYS = ("x", "y", "z")


@dataclass(frozen=True)
class Policy:
    kind: str  # tumbling | session
    width: int  # size_ms | gap_ms
    lateness: int
    late: str  # raise | dead_letter

    def yaml(self, name: str) -> str:
        shape = (f"kind: tumbling, size_ms: {self.width}" if self.kind == "tumbling"
                 else f"kind: session, key: key, gap_ms: {self.width}")
        return (f"  - {{name: {name}, stream: {STREAM}, {shape}, field: ts, "
                f"seal: {{lateness_ms: {self.lateness}, late: {self.late}}}}}")


@functools.cache
def config_of(policies: tuple[Policy, Policy]) -> Config:
    text = "\n".join([
        "streams:",
        f"  - {{name: {STREAM}, schema: {SCHEMA.name}, order_key: k, partitions: {PARTITIONS}}}",
        "substreams:",
        *(p.yaml(name) for name, p in zip(SUBS, policies, strict=True)),
        "acker:",
        "  acks_partitions: 1",
    ]) + "\n"
    return load_config_text(text, SCHEMA.with_name("late.yaml"))


@dataclass
class Oracle:
    """What the policy has sealed of one substream, from the event times written so far."""

    policy: Policy
    high: int | None = None
    first: int | None = None
    """A tumbling policy's first window (no time seal below it is sent)."""
    sealed: int | None = None

    def time_of(self, ts: int, key: str) -> Time:
        if self.policy.kind == "tumbling":
            return ts // self.policy.width
        return Keyed(key, ts)

    def late(self, ts: int) -> bool:
        if self.sealed is None:
            return False
        if self.policy.kind == "tumbling":
            return ts // self.policy.width <= self.sealed
        return ts <= self.sealed

    def published(self, high: int) -> None:
        """A publish call wrote records up to event time ``high`` (``SealClock``'s rule)."""
        if self.policy.kind == "tumbling" and self.first is None:
            self.first = high // self.policy.width
        self.high = high if self.high is None else max(self.high, high)
        watermark = self.high - self.policy.lateness
        if self.policy.kind == "tumbling":
            upto = watermark // self.policy.width - 1
            assert self.first is not None
            if upto < self.first:
                return
        else:
            upto = watermark - 1
        if self.sealed is None or upto > self.sealed:
            self.sealed = upto


@dataclass
class Expect:
    written: dict[int, set[str]] = field(default_factory=dict)
    """Sequence number -> the substreams it is on time in (written to the stream)."""
    late: dict[int, set[str]] = field(default_factory=dict)
    """Sequence number -> the dead_letter substreams it was late for."""
    refused: int = 0


def tracker(pub: Publisher, names: list[str]) -> Tracker:
    """The acker's tracker without its heartbeat thread (nothing here runs on a clock)."""
    return Tracker(pub.config, pub.stream, pub.source_id, pub.incarnation, names, SOURCE,
                   writer=transactional_id(pub.stream, pub.source_id))


def read_all(log: MemoryLog, topic: str, partitions: int) -> list[Record]:
    reader = log.reader(committed=True, name=f"read {topic}")
    reader.assign({(topic, p): 0 for p in range(partitions)})
    out: list[Record] = []
    while got := reader.poll(0, 10_000):
        out.extend(got)
    return out


def notifications(config: Config, log: MemoryLog, clock: SimClock) -> list[EpochComplete]:
    """What the acker announces from every acks message committed (the sources are gone:
    their Unregister ends every time)."""
    state = AckerState()
    for sub in config.substreams:
        state.ensure(sub.name, 100, sub.gap_ms)
    core = AckerCore(
        "acker", [0], {s: 0 for s in SUBS}, {s: f"_control.{s}" for s in SUBS},
        acks_partitions=1, source_timeout_ms=60_000, heartbeat_ms=200, state=state,
    )
    now = int(clock.now_ms())
    core.started(now)
    acks = read_all(log, config.acker.acks_topic, 1)
    for rec in acks:
        refused = core.apply(rec.partition, rec.offset, rec.value or b"", rec.headers, now)
        assert not refused, refused
    effects = core.tick(now + 1, {0: len(acks)})
    return [c for _, body in effects.records for c in completions(body)]


def run(policies: tuple[Policy, Policy], calls: Sequence[Sequence[tuple[int, str]]]
        ) -> tuple[Expect, list[Record], list[EpochComplete], list[DeadLetter], Config]:
    config = config_of(policies)
    clock = SimClock()
    log = MemoryLog(clock)
    log.create_topics({STREAM: PARTITIONS, config.acker.acks_topic: 1,
                       config.acker.dead_letter_topic: 1})
    app = Application(config, mechanisms={"acker": tracker}, clock=clock,
                      producers=MemoryProducers(log), schemas=lambda *_: None)
    oracles = {name: Oracle(p) for name, p in zip(SUBS, policies, strict=True)}
    expect = Expect()
    seq = 0
    with app.publisher(STREAM, "src", bootstrap="memory/late") as pub:
        for call in calls:
            payloads = []
            for ts, key in call:
                seq += 1
                payloads.append({"inc": "", "e": 0, "k": seq, "key": key, "ts": ts})
            late = [{n for n, o in oracles.items() if o.late(p["ts"])} for p in payloads]
            raising = sorted({n for ls in late for n in ls if oracles[n].policy.late == "raise"})
            if raising:
                with pytest.raises(SealedTimeError) as info:
                    if len(payloads) == 1:
                        pub.publish(payloads[0], key=payloads[0]["key"])
                    else:
                        pub.publish_many(payloads, keys=[p["key"] for p in payloads])
                assert any(f"substream '{n}'" in str(info.value) for n in raising), info.value
                expect.refused += len(payloads)
                continue
            if len(payloads) == 1:
                sent = [pub.publish(payloads[0], key=payloads[0]["key"])]
            else:
                sent = pub.publish_many(payloads, keys=[p["key"] for p in payloads])
            for p, ls, record in zip(payloads, late, sent, strict=True):
                on_time = set(SUBS) - ls
                assert record.dead_lettered == (not on_time)
                if on_time:
                    expect.written[p["k"]] = on_time
                    assert set(record.times) == on_time
                if ls:
                    expect.late[p["k"]] = ls
            kept = [p["ts"] for p, ls in zip(payloads, late, strict=True) if ls != set(SUBS)]
            if kept:
                for o in oracles.values():
                    o.published(max(kept))
    data = read_all(log, STREAM, PARTITIONS)
    letters = [DeadLetter.from_json(r.value or b"")
               for r in read_all(log, config.acker.dead_letter_topic, 1)]
    return expect, data, notifications(config, log, clock), letters, config


def events() -> st.SearchStrategy[list[list[tuple[int, str]]]]:
    """Publish calls (1-4 records each) of out-of-order event times: a random walk that
    mostly moves forward and sometimes jumps back."""
    step = st.one_of(st.integers(0, 12), st.integers(-60, 0))
    record = st.tuples(step, st.sampled_from(KEYS))
    return st.lists(st.lists(record, min_size=1, max_size=4), min_size=1, max_size=25)


POLICY = st.builds(
    Policy,
    kind=st.sampled_from(["tumbling", "session"]),
    width=st.sampled_from([1, 5, 10, 20]),
    lateness=st.sampled_from([0, 3, 10, 25]),
    late=st.sampled_from(["dead_letter", "dead_letter", "raise"]),
)

COUNTS: Counter[str] = Counter()
"""The property's counts over every example run (printed by the last test)."""


def walk(steps: list[list[tuple[int, str]]]) -> Iterator[list[tuple[int, str]]]:
    ts = 1_000
    for call in steps:
        out = []
        for delta, key in call:
            ts = max(0, ts + delta)
            out.append((ts, key))
        yield out


@settings(max_examples=300, deadline=None)
@given(a=POLICY, b=POLICY, steps=events())
def test_a_record_late_for_one_substream_stays_in_the_other(
    a: Policy, b: Policy, steps: list[list[tuple[int, str]]]
) -> None:
    expect, data, notes, letters, config = run((a, b), list(walk(steps)))
    codec = Codec(envelope_schema(config.stream(STREAM).schema), label="orders")
    by_sub: dict[str, list[EpochComplete]] = {s: [] for s in SUBS}
    for note in notes:
        by_sub[note.substream].append(note)
    seen: dict[int, set[str]] = {}
    for rec in data:
        doc = codec.decode_single(rec.value or b"")
        k = doc["payload"]["k"]
        times = times_from_wire(doc["times"])
        assert k not in seen, f"record {k} written twice"
        seen[k] = set()
        for sub in SUBS:
            t = times.get(sub)
            holders = [n for n in by_sub[sub]
                       if t is not None and epoch_covers(n.time, n.until, t)
                       and any(r.stream == STREAM and r.partition == rec.partition
                               and r.start <= rec.offset < r.end for r in n.ranges)]
            assert len(holders) <= 1, f"record {k} in {len(holders)} notifications of {sub}"
            if holders:
                seen[k].add(sub)
    # no record on time for a substream is missing from its notifications, and no late
    # one is in them
    assert seen == expect.written
    # a notification's record count is the records a reader finds in it
    for sub, notes_of in by_sub.items():
        assert sum(n.records for n in notes_of) == sum(1 for s in seen.values() if sub in s)
    # every late record dead-lettered once, naming exactly the substreams it missed
    late_letters = [d for d in letters if d.reason == REASON_LATE]
    got = Counter(json.loads(d.raw)["k"] for d in late_letters)
    assert all(n == 1 for n in got.values()), got
    assert {json.loads(d.raw)["k"]: set(d.substreams) for d in late_letters} == expect.late
    COUNTS["examples"] += 1
    COUNTS["records"] += len(expect.written) + sum(
        1 for k, ls in expect.late.items() if ls == set(SUBS)) + expect.refused
    COUNTS["refused whole (raise)"] += expect.refused
    for ls in expect.late.values():
        COUNTS["late for a" if ls == {"a"} else "late for b" if ls == {"b"}
               else "late for both"] += 1


def test_the_property_saw_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs after the property (file order): its counts, and that every case occurred."""
    if not COUNTS:  # run alone: run the property first
        test_a_record_late_for_one_substream_stays_in_the_other()
    with capsys.disabled():
        print("\nlate-for-one property:", dict(COUNTS))
    for case in ("late for a", "late for b", "late for both", "refused whole (raise)"):
        assert COUNTS[case] > 0, COUNTS


def test_publish_for_some_substreams_gives_no_time_in_the_others() -> None:
    """``publish(substreams=...)``: what a replay of a record late for 'a' only uses -- the
    record is in 'a' alone, 'b's seal is not checked (it is not written there), and a
    name the stream does not have, or a time for a substream left out, is refused."""
    policies = (Policy("tumbling", 10, 0, "dead_letter"), Policy("tumbling", 10, 0, "raise"))
    config = config_of(policies)
    clock = SimClock()
    log = MemoryLog(clock)
    log.create_topics({STREAM: PARTITIONS, config.acker.acks_topic: 1,
                       config.acker.dead_letter_topic: 1})
    app = Application(config, mechanisms={"acker": tracker}, clock=clock,
                      producers=MemoryProducers(log), schemas=lambda *_: None)
    with app.publisher(STREAM, "src", bootstrap="memory/some") as pub:
        def rec(k: int, ts: int) -> dict[str, object]:
            return {"inc": "", "e": 0, "k": k, "key": "x", "ts": ts}

        pub.publish(rec(1, 5))
        pub.publish(rec(2, 100))  # seals windows 0..9 of both
        with pytest.raises(SealedTimeError, match="'b'"):
            pub.publish(rec(3, 50))  # late for 'b', whose rule is raise
        only_a = pub.publish(rec(3, 50), substreams=["a"])  # late for 'a': out of it too
        assert only_a.dead_lettered
        sent = pub.publish(rec(3, 150), substreams=("a",))
        assert dict(sent.times) == {"a": 15}
        with pytest.raises(SubstreamsError, match="no substream 'c'"):
            pub.publish(rec(4, 150), substreams=["a", "c"])
        with pytest.raises(SubstreamsError, match="time given for substream 'b'"):
            pub.publish(rec(4, 150), substreams=["a"], times={"b": 15})
    records = read_all(log, STREAM, PARTITIONS)
    codec = Codec(envelope_schema(config.stream(STREAM).schema), label="orders")
    envelopes = [codec.decode_single(r.value or b"") for r in records]
    by_k = {e["payload"]["k"]: set(times_from_wire(e["times"])) for e in envelopes}
    assert by_k == {1: {"a", "b"}, 2: {"a", "b"}, 3: {"a"}}
    letters = [DeadLetter.from_json(r.value or b"")
               for r in read_all(log, config.acker.dead_letter_topic, 1)]
    assert [(d.reason, d.substreams) for d in letters] == [(REASON_LATE, ("a",))]
