"""Sessions over keyed event times and the keyed seal, without Kafka (hypothesis-driven).

The property: several sources write the same keys in any interleaving, each sealing "every
key up to its event time" as it goes; the acker's table announces every session of the
union of their records exactly once, in start order per key, with exactly its records, and
only after each of them was received.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.table import SOURCE, STAGE, SegmentTable, Termination, Violation
from substreams.control.messages import OffsetRange, epoch_covers
from substreams.frontier import Keyed
from substreams.frontier.sessions import closed_runs, session_runs


@given(st.lists(st.integers(-50, 50), max_size=30), st.integers(0, 10))
def test_session_runs_partition_the_times_at_gaps_wider_than_gap(
    times: list[int], gap: int
) -> None:
    runs = session_runs(times, gap)
    covered = sorted({t for t in times})
    assert [t for a, b in runs for t in covered if a <= t <= b] == covered
    for (_, e1), (s2, _) in itertools.pairwise(runs):
        assert s2 - e1 > gap  # a wider gap separates runs
    for a, b in runs:
        inside = [t for t in covered if a <= t <= b]
        assert inside[0] == a and inside[-1] == b
        assert all(y - x <= gap for x, y in itertools.pairwise(inside))


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(0, 10), st.integers(-1, 80))
def test_closed_runs_are_the_leading_runs_the_seal_passed_by_gap(
    times: list[int], gap: int, bound: int
) -> None:
    members = closed_runs(times, gap, bound)
    closed = [(run[0], run[-1]) for run in members]
    runs = session_runs(times, gap)
    assert closed == runs[: len(closed)]
    # each run lists exactly the distinct times between its ends
    assert [sorted({t for t in times if a <= t <= b}) for a, b in closed] == members
    assert all(e + gap <= bound for _, e in closed)
    if len(closed) < len(runs):
        assert runs[len(closed)][1] + gap > bound
    assert closed_runs(times, gap, None) == []


def _ranges(offset: int) -> tuple[OffsetRange, ...]:
    return (OffsetRange("clicks", 0, offset, offset + 1),)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    sources=st.integers(1, 4),
    keys=st.integers(1, 3),
    records=st.integers(0, 30),
    gap=st.integers(0, 6),
)
def test_sources_sharing_keys_close_each_session_of_their_union_once_in_order(
    seed: int, sources: int, keys: int, records: int, gap: int
) -> None:
    rng = random.Random(seed)
    table = SegmentTable("s", gap_ms=gap)
    names = [f"src{i}" for i in range(sources)]
    for n in names:
        table.register(n, SOURCE)
    table.register("sink", STAGE)
    # each source: its own records at non-decreasing event times, any key
    plans = {
        n: sorted(
            (
                (rng.randrange(40), f"k{rng.randrange(keys)}")
                for _ in range(rng.randrange(records + 1))
            ),
        )
        for n in names
    }
    queues: dict[str, list[tuple[str, object, int]]] = {n: [] for n in [*names, "sink"]}
    record_time: dict[int, Keyed] = {}
    received: set[int] = set()
    in_flight: list[int] = []
    notified: list[Termination] = []
    offset = 0

    def apply(proc: str) -> None:
        kind, arg, x = queues[proc].pop(0)
        if kind == "snd":
            assert isinstance(arg, Keyed)
            table.report(arg, x, 0, 1, (), 0)
        elif kind == "rcv":
            assert isinstance(arg, tuple)
            t, off = arg
            table.report(t, x, 1, 1, _ranges(off), 0)
            received.add(x)
        else:
            assert isinstance(arg, int)
            table.seal_keys(proc, arg, 0)
        for term in table.terminations():
            # firm: every record anywhere in the workload inside the session was received
            assert term.until is not None
            inside = [x for x, t in record_time.items() if epoch_covers(term.time, term.until, t)]
            assert all(x in received for x in inside)
            notified.append(term)

    while True:
        choices: list[tuple[str, str]] = [("emit", n) for n in names if plans[n] is not None]
        if in_flight:
            choices.append(("consume", ""))
        choices += [("apply", p) for p, q in queues.items() if q]
        if not choices:
            break
        what, n = rng.choice(choices)
        if what == "emit":
            plan = plans[n]
            assert plan is not None
            if not plan:
                queues[n].append(("seal", 10**6, 0))
                plans[n] = None  # type: ignore[assignment]
                continue
            ts, key = plan.pop(0)
            queues[n].append(("seal", ts - 1, 0))  # the watermark moved to ts
            x = rng.getrandbits(64) - (1 << 63)
            record_time[x] = Keyed(key, ts)
            in_flight.append(x)
            queues[n].append(("snd", Keyed(key, ts), x))
        elif what == "consume":
            x = in_flight.pop(rng.randrange(len(in_flight)))
            queues["sink"].append(("rcv", (record_time[x], offset), x))
            offset += 1
        else:
            apply(n)

    expected = []
    for key in {t.key for t in record_time.values()}:
        times = [t.time for t in record_time.values() if t.key == key]
        for start, end in session_runs(times, gap):  # type: ignore[arg-type]
            count = sum(1 for t in record_time.values() if t.key == key and start <= t.time <= end)  # type: ignore[operator]
            expected.append((Keyed(key, start), Keyed(key, end), count))
    got = [(term.time, term.until, term.records) for term in notified]
    assert sorted(got, key=repr) == sorted(expected, key=repr), "each session once, exact"
    for key in {t.key for t, _, _ in got}:
        starts = [t.time for t, _, _ in got if t.key == key]
        assert starts == sorted(starts), "a key's sessions in start order"
    assert sum(t.records for t in notified) == len(record_time)
    assert all(len(t.ranges) == 1 or t.records == 0 for t in notified)
    assert not table.open


def test_a_source_that_never_wrote_a_key_holds_its_session_until_its_keyed_seal() -> None:
    table = SegmentTable("s", gap_ms=5)
    table.register("a", SOURCE)
    table.register("b", SOURCE)
    table.report(Keyed("u", 10), 0, 1, 2, _ranges(0), 1)
    table.report(Keyed("u", 12), 0, 1, 2, _ranges(1), 1)
    table.seal_keys("a", 100, 50)
    assert table.terminations() == []  # b may still write u at 12..17
    assert table.unsealed_sources(Keyed("u", 12)) == ["b"]
    table.seal_keys("b", 16, 60)
    assert table.terminations() == []  # 17 would still join the session
    table.seal_keys("b", 17, 70)
    [term] = table.terminations()
    assert (term.time, term.until, term.records, term.sealed_at_ms) == (
        Keyed("u", 10),
        Keyed("u", 12),
        2,
        70,
    )
    assert term.ranges == (OffsetRange("clicks", 0, 0, 2),)
    with pytest.raises(Violation):  # inside a closed session: late, dead-lettered
        table.report(Keyed("u", 11), 0, 1, 2, (), 1)
    assert table.report(Keyed("u", 18), 0, 1, 2, (), 1)  # a new session may start after it


def test_a_seal_opens_no_session_and_unkeyed_times_are_refused() -> None:
    table = SegmentTable("s", gap_ms=5)
    table.register("a", SOURCE)
    assert not table.seal("a", Keyed("u", 3), 0, 0)
    assert table.terminations() == []
    with pytest.raises(Violation, match="Keyed"):
        table.report(7, 1, 0, 1, (), 0)


def test_keyed_seal_closes_per_key_substreams_of_keys_the_source_never_wrote() -> None:
    table = SegmentTable("p")
    table.register("a", SOURCE)
    table.register("b", SOURCE)
    table.report(Keyed("x", 0), 0, 1, 2, _ranges(0), 0)
    table.report(Keyed("y", 0), 0, 1, 2, _ranges(1), 0)
    table.seal("a", Keyed("x", 0), 5, 0)
    table.seal("a", Keyed("y", 0), 5, 0)
    assert table.terminations() == []  # b never wrote x or y, and said nothing
    table.seal_keys("b", 0, 9)
    assert [(t.time, t.records) for t in table.terminations()] == [
        (Keyed("x", 0), 1),
        (Keyed("y", 0), 1),
    ]


def test_keyed_seals_survive_the_checkpoint_form() -> None:
    table = SegmentTable("s", gap_ms=5)
    table.register("a", SOURCE)
    table.report(Keyed("u", 10), 0, 1, 2, _ranges(0), 1)
    table.seal_keys("a", 12, 40)
    again = SegmentTable.from_state("s", table.to_state())
    assert again.gap_ms == 5
    assert again.sources["a"].keys_upto == 12
    assert again.terminations() == []
    again.seal_keys("a", 15, 41)
    assert [t.until for t in again.terminations()] == [Keyed("u", 10)]


def test_state_does_not_grow_with_keys_once_the_keyed_floor_passes_them() -> None:
    """Bounded state: a thousand keys' sessions leave nothing behind once every source's
    keyed seal passed them, and a late report for a forgotten key is still refused."""
    table = SegmentTable("s", gap_ms=5)
    for name in ("a", "b"):
        table.register(name, SOURCE)
    for i in range(1000):
        table.report(Keyed(f"user{i}", i), 0, 1, 2, _ranges(i), 0)
        table.seal("a", Keyed(f"user{i}", i + 5), 0, 0)  # explicit per-key seals pile up
    table.seal_keys("a", 2000, 1)
    table.seal_keys("b", 2000, 1)
    terms = table.terminations()
    assert len(terms) == 1000
    assert len(table.terminated) <= 1
    assert len(table.sources["a"].seals) == 0 and not table.sources["a"].seal_ms
    with pytest.raises(Violation):  # forgotten, and still terminated
        table.report(Keyed("user7", 7), 0, 1, 2, (), 0)
    with pytest.raises(Violation):  # a brand-new key below the floor is late too
        table.report(Keyed("newcomer", 1999), 0, 1, 2, (), 0)
    assert table.report(Keyed("newcomer", 2001), 0, 1, 2, (), 0)


def test_per_key_seal_of_a_pruned_key_does_not_notify_it_again() -> None:
    table = SegmentTable("p")
    table.register("a", SOURCE)
    for k in ("x", "y"):
        table.report(Keyed(k, 0), 0, 1, 2, _ranges(0), 0)
    table.seal_keys("a", 0, 1)
    assert [t.time for t in table.terminations()] == [Keyed("x", 0), Keyed("y", 0)]
    assert len(table.terminated) <= 1
    assert not table.seal("a", Keyed("x", 0), 2, 2)
    assert table.terminations() == []


def test_the_upper_frontier_forgets_complete_keyed_times_below_the_floor() -> None:
    from substreams.control.progress import ProgressTracker

    tracker = ProgressTracker("s")
    for i in range(100):
        tracker.activate(Keyed(f"k{i}", i))
    for i in range(99):
        tracker.complete(Keyed(f"k{i}", i), (), 1, 0)
    tracker.prune_keyed(None)
    assert len(tracker.upper) == 100
    tracker.prune_keyed(1000)
    assert tracker.upper.elements() == (Keyed("k99", 99),)  # still active: kept


def test_a_source_that_registers_later_cannot_reopen_what_the_floor_forgot() -> None:
    """Found by the simulator (a source paused before its first commit, registered after
    the others had sealed every key and left): the terminated keyed times forgotten below
    the floor stay final when a newcomer lowers the floor again.  Before, its records
    there opened them anew and the key's times (and sessions) were notified twice, out of
    order."""
    for gap in (None, 5):
        table = SegmentTable("s", gap_ms=gap)
        table.register("a", SOURCE)
        for k in ("x", "y"):
            table.report(Keyed(k, 10), 0, 1, 2, _ranges(0), 0)
            table.report(Keyed(k, 30), 0, 1, 2, _ranges(1), 0)
        table.seal_keys("a", 40, 1)
        assert len(table.terminations()) == 4
        assert len(table.terminated) <= 1  # forgotten below the floor
        table.unregister("a")
        table.register("b", SOURCE)  # no keyed seal yet: the floor is None again
        assert table.keyed_floor() is None
        for t in (5, 10, 20, 40):  # at or below what was forgotten: late
            with pytest.raises(Violation):
                table.report(Keyed("x", t), 0, 1, 2, (), 2)
        assert not table.seal("b", Keyed("y", 20), 2, 2)  # opens nothing
        assert table.terminations() == []
        assert table.report(Keyed("x", 41), 0, 1, 2, (), 2)  # above it: a new time
        again = SegmentTable.from_state("s", table.to_state())
        assert again.forgotten == 40
        with pytest.raises(Violation):
            again.report(Keyed("y", 30), 0, 1, 2, (), 2)


def test_a_seal_that_closes_many_sessions_is_spread_over_steps_in_each_keys_order() -> None:
    """``times_per_step``: a keyed seal closing every session of 50 keys (2 sessions of 3
    times each) closes at most the budget's worth of times per step (a key's closable
    sessions together), every session once, each key's in start order."""
    table = SegmentTable("s", gap_ms=10)
    table.times_per_step = 8
    table.register("a", SOURCE)
    for k in range(50):
        for t in (0, 5, 9, 100, 105, 109):  # runs [0, 9] and [100, 109]
            table.report(Keyed(f"k{k:02d}", t), 0, 1, 1, [], 1)
    table.seal_keys("a", 1_000, 2)
    steps: list[list[Keyed]] = []
    while True:
        _run, _, terms = table.termination_runs()
        if not terms:
            break
        steps.append([term.time for term in terms])  # type: ignore[misc]
        assert sum(len(term.members) for term in terms) <= 8 + 6, terms
    closed = [t for step in steps for t in step]
    assert len(steps) > 10 and len(closed) == 100 == len(set(closed)) and not table.open
    for k in range(50):
        mine = [t.time for t in closed if t.key == f"k{k:02d}"]
        assert mine == [0, 100], (k, mine)
