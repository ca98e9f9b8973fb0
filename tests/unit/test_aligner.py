"""The punctuation aligner as pure logic: firm/soft bound, order, no loss, late records."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed, Time, less_than
from substreams.punctuation.aligner import (
    Aligner,
    Event,
    Late,
    Punctuation,
    Released,
    Terminated,
)
from substreams.streams.records import Entry

SUB = "win"
STREAM = "clicks"


@dataclass
class Log:
    """Per-partition logs of messages (records and punctuations), with offsets."""

    parts: dict[int, list[Entry | Punctuation]]

    def append_record(self, producer: str, partition: int, t: Time, tag: int) -> Entry:
        log = self.parts[partition]
        e = Entry(STREAM, partition, len(log), 0, tag, producer, {SUB: t}, {"tag": tag})
        log.append(e)
        return e

    def append_punct(
        self, kind: str, producer: str, t: Time | None, partitions: Sequence[int] | None = None
    ) -> None:
        for q in partitions if partitions is not None else list(self.parts):
            log = self.parts[q]
            log.append(Punctuation(kind, producer, SUB, t, q, len(log), len(log)))  # type: ignore[arg-type]


def feed(aligner: Aligner, msg: Entry | Punctuation) -> list[Event]:
    if isinstance(msg, Punctuation):
        return aligner.on_punctuation(msg)
    return aligner.on_record(msg)


def read_interleaved(
    aligner: Aligner, log: Log, rng: random.Random, partitions: Sequence[int] | None = None
) -> list[Event]:
    """Read the partitions in a random interleaving that keeps each partition's order."""
    parts = list(partitions if partitions is not None else log.parts)
    pos = dict.fromkeys(parts, 0)
    out: list[Event] = []
    while True:
        live = [q for q in parts if pos[q] < len(log.parts[q])]
        if not live:
            return out
        q = rng.choice(live)
        out.extend(feed(aligner, log.parts[q][pos[q]]))
        pos[q] += 1


def write_workload(
    rng: random.Random, producers: int, partitions: int, times: int, per_time: int
) -> tuple[Log, list[Entry]]:
    """Producers writing concurrently: REGISTER, records of t then SEAL t, ..., UNREGISTER.

    Everyone registers before anyone writes (a producer registering later is a late one)."""
    log = Log({q: [] for q in range(partitions)})
    scripts: list[list[tuple[str, object]]] = []
    for p in range(producers):
        log.append_punct("REGISTER", f"prod-{p}", None)
    for _ in range(producers):
        script: list[tuple[str, object]] = []
        for t in range(times):
            script += [("record", t)] * rng.randrange(per_time + 1)
            script.append(("SEAL", t))
        if rng.random() < 0.5:
            script.append(("UNREGISTER", None))
        scripts.append(script)
    pos = [0] * producers
    records: list[Entry] = []
    while any(pos[p] < len(scripts[p]) for p in range(producers)):
        p = rng.choice([p for p in range(producers) if pos[p] < len(scripts[p])])
        kind, arg = scripts[p][pos[p]]
        pos[p] += 1
        name = f"prod-{p}"
        if kind == "record":
            assert isinstance(arg, int)
            records.append(log.append_record(name, rng.randrange(partitions), arg, len(records)))
        else:
            log.append_punct(kind, name, arg)  # type: ignore[arg-type]
    return log, records


def check_firm(events: list[Event]) -> None:
    """Every record of t released before Terminated(t), none after."""
    terminated: set[Time] = set()
    for ev in events:
        if isinstance(ev, Released):
            assert ev.entry.times[SUB] not in terminated
        elif isinstance(ev, Terminated):
            terminated.add(ev.time)


def check_order(events: list[Event]) -> None:
    seen: list[Time] = [ev.time for ev in events if isinstance(ev, Terminated)]
    assert len(seen) == len(set(seen)), "a time terminated twice"
    for i, a in enumerate(seen):
        for b in seen[i + 1 :]:
            assert not less_than(b, a), f"{b} announced after {a}"


def check_no_loss(events: list[Event], records: list[Entry]) -> None:
    released = [ev.entry for ev in events if isinstance(ev, Released)]
    assert sorted(e.tracking_id for e in released) == [e.tracking_id for e in records]
    assert not [ev for ev in events if isinstance(ev, Late)]


def check_ranges(events: list[Event]) -> None:
    released: dict[Time, list[Entry]] = {}
    for ev in events:
        if isinstance(ev, Released):
            released.setdefault(ev.entry.times[SUB], []).append(ev.entry)
        elif isinstance(ev, Terminated):
            mine = released.get(ev.time, [])
            assert ev.records == len(mine)
            hull = {r.partition: (r.start, r.end) for r in ev.ranges}
            assert set(hull) == {e.partition for e in mine}
            for q, (lo, hi) in hull.items():
                offsets = [e.index for e in mine if e.partition == q]
                assert (lo, hi) == (min(offsets), max(offsets) + 1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ordered=st.booleans())
def test_firm_bound_order_and_no_loss_under_random_interleavings(seed: int, ordered: bool) -> None:
    rng = random.Random(seed)
    log, records = write_workload(rng, producers=3, partitions=4, times=5, per_time=4)
    aligner = Aligner(SUB, STREAM, range(4), bound="firm", ordered=ordered)
    events = read_interleaved(aligner, log, rng)
    check_firm(events)
    check_order(events)
    check_no_loss(events, records)
    check_ranges(events)
    assert sorted(ev.time for ev in events if isinstance(ev, Terminated)) == list(range(5))  # type: ignore[type-var]
    assert aligner.held() == 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_firm_bound_holds_records_of_later_times(seed: int) -> None:
    """Firm: no record of t is released while a known smaller time is still open."""
    rng = random.Random(seed)
    log, _ = write_workload(rng, producers=3, partitions=4, times=4, per_time=3)
    aligner = Aligner(SUB, STREAM, range(4), bound="firm")
    events = read_interleaved(aligner, log, rng)
    terminated: set[int] = set()
    opened: set[int] = set()
    for ev in events:
        if isinstance(ev, Terminated):
            assert isinstance(ev.time, int)
            terminated.add(ev.time)
        elif isinstance(ev, Released):
            t = ev.entry.times[SUB]
            assert isinstance(t, int)
            opened.add(t)
            assert all(u in terminated for u in opened if u < t)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_soft_bound_releases_on_arrival(seed: int) -> None:
    rng = random.Random(seed)
    log, records = write_workload(rng, producers=3, partitions=4, times=4, per_time=3)
    aligner = Aligner(SUB, STREAM, range(4), bound="soft")
    pos = dict.fromkeys(range(4), 0)
    events: list[Event] = []
    while any(pos[q] < len(log.parts[q]) for q in range(4)):
        q = rng.choice([q for q in range(4) if pos[q] < len(log.parts[q])])
        msg = log.parts[q][pos[q]]
        pos[q] += 1
        got = feed(aligner, msg)
        if isinstance(msg, Entry):
            assert got and got[0] == Released(msg)  # released the moment it arrives
        events.extend(got)
    check_order(events)
    check_no_loss(events, records)
    check_firm(events)  # well-behaved producers: nothing of t follows Terminated(t)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_tasks_reading_subsets_align_on_their_own_partitions(seed: int) -> None:
    rng = random.Random(seed)
    log, records = write_workload(rng, producers=3, partitions=4, times=4, per_time=3)
    all_events: list[Event] = []
    for subset in ([0, 1], [2], [3]):
        aligner = Aligner(SUB, STREAM, subset)
        events = read_interleaved(aligner, log, rng, subset)
        check_firm(events)
        check_order(events)
        assert all(
            r.partition in subset for ev in events if isinstance(ev, Terminated) for r in ev.ranges
        )
        all_events += events
    released = sorted(ev.entry.tracking_id for ev in all_events if isinstance(ev, Released))
    assert released == [e.tracking_id for e in records]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_producer_registering_at_any_moment_loses_nothing(seed: int) -> None:
    """A latecomer's records are released before their time's termination or reported Late."""
    rng = random.Random(seed)
    log, records = write_workload(rng, producers=2, partitions=3, times=3, per_time=3)
    # a third producer registers at a random point of each partition, then writes time 1
    late_records: list[Entry] = []
    for q in range(3):
        cut = rng.randrange(len(log.parts[q]) + 1)
        tail = log.parts[q][cut:]
        del log.parts[q][cut:]
        log.append_punct("REGISTER", "late", None, [q])
        if q == 0:
            late_records.append(log.append_record("late", q, 1, 1000))
        log.append_punct("SEAL", "late", 2, [q])
        for msg in tail:  # re-number the rest
            log.parts[q].append(
                Entry(STREAM, q, len(log.parts[q]), 0, msg.tracking_id, msg.source, msg.times, {})
                if isinstance(msg, Entry)
                else Punctuation(msg.kind, msg.producer, SUB, msg.time, q, len(log.parts[q]))
            )
    aligner = Aligner(SUB, STREAM, range(3))
    events = read_interleaved(aligner, log, rng)
    check_firm(events)
    check_order(events)
    released = {ev.entry.tracking_id for ev in events if isinstance(ev, Released)}
    late = {ev.entry.tracking_id for ev in events if isinstance(ev, Late)}
    assert late <= {1000}
    assert released | late == {e.tracking_id for e in records} | {1000}
    assert not released & late


def test_termination_waits_for_every_producer_in_every_partition() -> None:
    log = Log({0: [], 1: []})
    log.append_punct("REGISTER", "a", None)
    log.append_punct("REGISTER", "b", None)
    r = log.append_record("a", 0, 0, 1)
    aligner = Aligner(SUB, STREAM, [0, 1])
    events = [ev for msg in log.parts[0] for ev in feed(aligner, msg)]
    assert events == [Released(r)]
    # a seals in both partitions, b only in 0: not over
    events = aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 0, 0))
    events += aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 0, 1))
    events += aligner.on_punctuation(Punctuation("SEAL", "b", SUB, 0, 0))
    assert events == []
    # b's REGISTER in partition 1 was not read yet: b still blocks partition 1
    assert aligner.pending_times() == [0]
    events = [ev for msg in log.parts[1] for ev in feed(aligner, msg)]
    events += aligner.on_punctuation(Punctuation("SEAL", "b", SUB, 0, 1, sent_at_ms=42))
    assert events == [Terminated(SUB, 0, (OffsetRange(STREAM, 0, r.index, r.index + 1),), 1, 42)]


def test_producer_leaving_does_not_block() -> None:
    log = Log({0: [], 1: []})
    for p in ("a", "b"):
        log.append_punct("REGISTER", p, None)
    log.append_record("a", 1, 3, 1)
    log.append_punct("SEAL", "a", 3)
    aligner = Aligner(SUB, STREAM, [0, 1])
    events = read_interleaved(aligner, log, random.Random(1))
    assert not [ev for ev in events if isinstance(ev, Terminated)]
    for q in (0, 1):
        events = aligner.on_punctuation(Punctuation("UNREGISTER", "b", SUB, None, q))
    assert [ev.time for ev in events if isinstance(ev, Terminated)] == [3]


def test_late_producer_record_is_reported_not_merged() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    aligner.on_punctuation(Punctuation("REGISTER", "a", SUB, None, 0))
    r0 = Entry(STREAM, 0, 1, 0, 1, "a", {SUB: 0}, {})
    aligner.on_record(r0)
    assert [type(ev) for ev in aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 0, 0))] == [
        Terminated
    ]
    # c joins after time 0 is over and writes at time 0
    aligner.on_punctuation(Punctuation("REGISTER", "c", SUB, None, 0))
    late = Entry(STREAM, 0, 4, 0, 2, "c", {SUB: 0}, {})
    [ev] = aligner.on_record(late)
    assert isinstance(ev, Late) and ev.entry == late and "terminated" in ev.reason
    # c is registered with no start: it now blocks time 1 until it seals
    aligner.on_record(Entry(STREAM, 0, 5, 0, 3, "a", {SUB: 1}, {}))
    assert aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 1, 0)) == []
    assert [
        ev.time
        for ev in aligner.on_punctuation(Punctuation("SEAL", "c", SUB, 1, 0))
        if isinstance(ev, Terminated)
    ] == [1]


def test_register_with_start_constrains_only_later_times() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    aligner.on_punctuation(Punctuation("REGISTER", "a", SUB, None, 0))
    aligner.on_punctuation(Punctuation("REGISTER", "late", SUB, 5, 0))
    aligner.on_record(Entry(STREAM, 0, 2, 0, 1, "a", {SUB: 4}, {}))
    aligner.on_record(Entry(STREAM, 0, 3, 0, 2, "late", {SUB: 5}, {}))
    events = aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 5, 0))
    # 4 is not the late producer's business; 5 is
    assert [ev.time for ev in events if isinstance(ev, Terminated)] == [4]
    events = aligner.on_punctuation(Punctuation("SEAL", "late", SUB, 5, 0))
    assert [ev.time for ev in events if isinstance(ev, Terminated)] == [5]


def test_record_below_own_seal_is_late() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    aligner.on_punctuation(Punctuation("REGISTER", "a", SUB, None, 0))
    aligner.on_punctuation(Punctuation("REGISTER", "b", SUB, None, 0))
    aligner.on_punctuation(Punctuation("SEAL", "a", SUB, 2, 0))
    [ev] = aligner.on_record(Entry(STREAM, 0, 3, 0, 1, "a", {SUB: 1}, {}))
    assert isinstance(ev, Late) and "sealed" in ev.reason
    # b has not sealed: its record at 1 is fine
    [ok] = aligner.on_record(Entry(STREAM, 0, 4, 0, 2, "b", {SUB: 1}, {}))
    assert isinstance(ok, Released)


def test_partial_order_times_announce_in_a_linear_extension() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    aligner.on_punctuation(Punctuation("REGISTER", "a", SUB, None, 0))
    for i, t in enumerate([(0, 0), (1, 1), (0, 1), (1, 0)]):
        aligner.on_record(Entry(STREAM, 0, i + 1, 0, i, "a", {SUB: t}, {}))
    # (1,1) is held (firm): smaller known times are open
    assert aligner.held() == 3
    events = aligner.on_punctuation(Punctuation("SEAL", "a", SUB, (1, 1), 0))
    kinds = [(type(ev).__name__, getattr(ev, "time", None)) for ev in events]
    times = [t for k, t in kinds if k == "Terminated"]
    assert times == [(0, 0), (0, 1), (1, 0), (1, 1)]
    check_firm(events)
    assert aligner.held() == 0


def test_keyed_times_terminate_independently() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    aligner.on_punctuation(Punctuation("REGISTER", "a", SUB, None, 0))
    u1, u2 = Keyed("u1", 100), Keyed("u2", 50)
    r1 = Entry(STREAM, 0, 1, 0, 1, "a", {SUB: u1}, {})
    r2 = Entry(STREAM, 0, 2, 0, 2, "a", {SUB: u2}, {})
    # keyed times of different keys are incomparable: neither holds the other back
    assert aligner.on_record(r1) == [Released(r1)]
    assert aligner.on_record(r2) == [Released(r2)]
    events = aligner.on_punctuation(Punctuation("SEAL", "a", SUB, u2, 0))
    assert [ev.time for ev in events if isinstance(ev, Terminated)] == [u2]
    assert aligner.pending_times() == [u1]


def test_other_substreams_punctuations_are_ignored() -> None:
    aligner = Aligner(SUB, STREAM, [0])
    assert aligner.on_punctuation(Punctuation("REGISTER", "a", "other", None, 0)) == []
    assert aligner.producers() == {}


def test_punctuation_wire_round_trip() -> None:
    from substreams.streams.schemas import protocol_codec

    codec = protocol_codec("punctuation")
    for t in (None, 7, (1, 2), Keyed("k", 3)):
        p = Punctuation("SEAL" if t is not None else "REGISTER", "prod", SUB, t, 2, 9, 123)
        back = Punctuation.from_wire(codec.decode(codec.encode(p.to_wire())), 2, 9)
        assert back == p
