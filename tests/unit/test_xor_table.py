"""The acker's XOR table and termination rule, without Kafka (hypothesis-driven)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.table import SOURCE, STAGE, SegmentTable, Violation
from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed, Time, less_equal, less_than, sort_key


@dataclass
class Proc:
    """A process's outbound queue of messages to the acker (applied in order)."""

    name: str
    queue: list[tuple[str, Time, int]] = field(default_factory=list)


def apply(table: SegmentTable, proc: str, msg: tuple[str, Time, int]) -> None:
    kind, t, x = msg
    if kind == "seal":
        table.seal(proc, t, 0, 0)
    elif kind == "unregister":
        table.unregister(proc)
    else:
        table.report(t, x, 1 if kind == "rcv" else 0, 1, (), 0)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    sources=st.integers(1, 3),
    records=st.integers(0, 40),
    unregister=st.booleans(),
)
def test_random_interleavings_terminate_each_time_once_in_order_after_all_received(
    seed: int, sources: int, records: int, unregister: bool
) -> None:
    rng = random.Random(seed)
    table = SegmentTable("s")
    names = [f"src{i}" for i in range(sources)]
    procs = {n: Proc(n) for n in [*names, "sink"]}
    for n in names:
        table.register(n, SOURCE)
    table.register("sink", STAGE)
    # each source: non-decreasing times, seals the previous time when moving on
    plans = {n: sorted(rng.randrange(8) for _ in range(rng.randrange(records + 1))) for n in names}
    time_of: dict[int, Time] = {}
    in_flight: list[int] = []
    applied_rcv: set[int] = set()
    notified: list[Time] = []
    last_time = {n: -1 for n in names}
    done = set()

    def deliver(proc: Proc) -> None:
        msg = proc.queue.pop(0)
        apply(table, proc.name, msg)
        if msg[0] == "rcv":
            applied_rcv.add(msg[2])
        for term in table.terminations():
            t = term.time
            # firm: every record of t anywhere in the workload was received and applied
            mine = [x for x, tt in time_of.items() if tt == t]
            assert all(x in applied_rcv for x in mine)
            notified.append(t)

    while True:
        choices = []
        for n in names:
            if n not in done:
                choices.append(("emit", n))
        if in_flight:
            choices.append(("consume", ""))
        for p in procs.values():
            if p.queue:
                choices.append(("deliver", p.name))
        if not choices:
            break
        what, n = rng.choice(choices)
        if what == "emit":
            plan = plans[n]
            if not plan:
                if last_time[n] >= 0:
                    procs[n].queue.append(("seal", last_time[n], 0))
                if unregister:
                    procs[n].queue.append(("unregister", 0, 0))
                else:
                    procs[n].queue.append(("seal", 100, 0))
                done.add(n)
                continue
            t = plan.pop(0)
            if last_time[n] >= 0 and t > last_time[n]:
                procs[n].queue.append(("seal", last_time[n], 0))
            last_time[n] = t
            x = rng.getrandbits(64) - (1 << 63)
            time_of[x] = t
            in_flight.append(x)
            procs[n].queue.append(("snd", t, x))
        elif what == "consume":
            x = in_flight.pop(rng.randrange(len(in_flight)))
            procs["sink"].queue.append(("rcv", time_of[x], x))
        else:
            deliver(procs[n])

    expected = set(time_of.values()) | {t for n in names for t in [last_time[n]] if t >= 0}
    if not unregister:
        expected.add(100)
    assert sorted(notified, key=sort_key) == notified, "consistent order"
    assert len(notified) == len(set(notified)), "exactly once"
    assert set(notified) == expected
    assert not table.open


def test_sealed_empty_time_terminates_and_later_reports_are_violations() -> None:
    table = SegmentTable("s")
    table.register("a", SOURCE)
    assert table.seal("a", 3, 111, 5)
    [term] = table.terminations()
    assert (term.time, term.records, term.sealed_at_ms, term.ranges) == (3, 0, 111, ())
    with pytest.raises(Violation):
        table.report(3, 42, 0, 1, (), 0)
    with pytest.raises(Violation):
        table.report(2, 42, 0, 1, (), 0)  # below a terminated time: late
    assert table.report(4, 42, 0, 1, (), 0)  # a later time is fine (and new)


def test_nothing_terminates_without_a_registered_source_and_unregister_releases() -> None:
    table = SegmentTable("s")
    table.register("stage", STAGE)
    table.report(1, 7, 0, 1, (), 0)
    table.report(1, 7, 0, 1, (), 0)
    assert table.terminations() == []
    table.register("a", SOURCE)
    assert table.terminations() == []  # a has not sealed 1
    table.unregister("a")
    assert [t.time for t in table.terminations()] == [1]


def test_xor_not_zero_blocks_and_blocks_later_times() -> None:
    table = SegmentTable("s")
    table.register("a", SOURCE)
    table.report(1, 5, 0, 1, (), 0)  # SND only
    table.report(2, 9, 0, 1, (), 0)
    table.report(2, 9, 1, 1, [OffsetRange("out", 0, 4, 5)], 0)
    table.seal("a", 2, 10, 0)
    assert table.terminations() == []  # 1 open (xor != 0) blocks 2
    table.report(1, 5, 1, 1, [OffsetRange("out", 1, 0, 1)], 0)
    terms = table.terminations()
    assert [t.time for t in terms] == [1, 2]
    assert terms[1].ranges == (OffsetRange("out", 0, 4, 5),) and terms[1].records == 1


def test_partial_order_and_keys_terminate_independently() -> None:
    table = SegmentTable("s")
    table.register("a", SOURCE)
    times: list[Time] = [(0, 1), (1, 0), (1, 1), Keyed("u", 5), Keyed("v", 2)]
    for t in times:
        table.report(t, 3, 0, 1, (), 0)
        table.report(t, 3, 0, 1, (), 0)
    table.report((0, 1), 8, 0, 1, (), 0)  # (0,1) stays open -> (1,1) blocked, (1,0) not
    table.seal("a", (1, 1), 0, 0)
    table.seal("a", Keyed("v", 2), 0, 0)
    table.seal("a", Keyed("u", 5), 0, 0)
    got = [t.time for t in table.terminations()]
    assert got == [(1, 0), Keyed("u", 5), Keyed("v", 2)]
    assert all(not less_than(a, b) for i, b in enumerate(got) for a in got[i:])
    table.report((0, 1), 8, 0, 1, (), 0)
    assert [t.time for t in table.terminations()] == [(0, 1), (1, 1)]


def test_state_round_trip_continues_identically() -> None:
    rng = random.Random(7)
    a, ops = SegmentTable("s"), []
    a.register("p", SOURCE)
    a.register("q", SOURCE)
    for i in range(60):
        t = i // 6
        x = rng.getrandbits(63)
        ops.append((t, x))
        a.report(t, x, 0, 1, [OffsetRange("z", i % 2, i, i + 1)], i)
        if i % 6 == 5:
            a.seal("p", t, i, i)
    a.terminations()
    b = SegmentTable.from_state("s", a.to_state())
    assert b.to_state() == a.to_state()
    for table in (a, b):
        for t, x in ops:
            table.report(t, x, 1, 1, (), 0)
        table.seal("q", 20, 0, 0)
    assert [x.time for x in a.terminations()] == [x.time for x in b.terminations()]
    assert a.to_state() == b.to_state()


class _ScanningTable(SegmentTable):
    """The reference: every seal scans every open time (the definition of the fast path)."""

    def _newly_covered(self, state, t):  # type: ignore[no-untyped-def]
        return [(o, e) for o, e in self.open.items() if less_equal(o, t) and not state.covers(o)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["report", "report", "report", "seal"]),
            st.sampled_from(["a", "b"]),
            st.integers(0, 20),
        ),
        max_size=150,
    )
)
def test_int_seal_fast_path_agrees_with_scanning_every_open_time(
    ops: list[tuple[str, str, int]],
) -> None:
    fast, slow = SegmentTable("s"), _ScanningTable("s")
    out_fast: list[object] = []
    out_slow: list[object] = []
    for table, out in ((fast, out_fast), (slow, out_slow)):
        table.register("a", SOURCE)
        table.register("b", SOURCE)
        for now, (op, source, t) in enumerate(ops):
            if table.terminated.covers(t):
                continue
            if op == "report":
                table.report(t, 0, 1, 2, [], now)
            else:
                table.seal(source, t, 1000 + now, now)
            out.extend(table.terminations())
    assert out_fast == out_slow
    assert {t: e.sealed_at_ms for t, e in fast.open.items()} == {
        t: e.sealed_at_ms for t, e in slow.open.items()
    }
