"""``check_invariants`` of the acker's pure state (SegmentTable, AckerCore, Liveness, Holds):
silent on states the rules build, and each check family fires -- with a message naming
what broke -- on a state corrupted on purpose.  The simulator calls them after every step
(tests/sim), so a check that could never fire would prove nothing there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from substreams.acker.liveness import Holds, Liveness
from substreams.acker.state import Blocker, Hold, SourceSession
from substreams.acker.table import SOURCE, RunEntry, SegmentTable
from substreams.control.messages import OffsetRange
from substreams.frontier import Keyed
from tests.unit.test_acker_core import Harness, report, seal


def _r(at: int) -> list[OffsetRange]:
    return [OffsetRange("clicks", 0, at, at + 1)]


def int_table() -> SegmentTable:
    """Times 1..3 open (2 with a nonzero xor), 0 terminated."""
    t = SegmentTable("s")
    t.register("a", SOURCE)
    for x in range(4):
        t.report(x, 7 if x == 2 else 0, 1, 1, _r(x), 10)
    t.seal("a", 0, 5, 10)
    assert [term.time for term in t.terminations()] == [0]
    return t


def keyed_table() -> SegmentTable:
    """Open Keyed(k, 5), Keyed(k, 6), Keyed(j, 1); Keyed(k, 1) terminated."""
    t = SegmentTable("s")
    t.register("a", SOURCE)
    for key, x in (("k", 1), ("k", 5), ("k", 6), ("j", 1)):
        t.report(Keyed(key, x), 0, 1, 1, _r(x), 10)
    t.seal("a", Keyed("k", 1), 5, 10)
    assert [term.time for term in t.terminations()] == [Keyed("k", 1)]
    return t


def session_table() -> SegmentTable:
    """gap 10: runs of k at [1, 5] and [30, 30] open; [100, 100] of k terminated."""
    t = SegmentTable("w", gap_ms=10)
    t.register("a", SOURCE)
    for x in (100, 1, 5, 30):
        t.report(Keyed("k", x), 0, 1, 1, _r(x), 10)
    t.seal("a", Keyed("k", 0), 5, 10)
    assert t.terminations() == []
    return t


def test_states_the_rules_build_pass() -> None:
    for table in (int_table(), keyed_table(), session_table()):
        table.check_invariants()
    h = Harness()
    h.register("a")
    h.send("a", report(1, 2), 10)
    h.send("a", seal(1), 10)
    h.probe(10)
    h.tick(10)
    h.core.check_invariants()


def _bad_session_runs(t: SegmentTable) -> None:
    """Two runs of k within the gap: one session kept as two entries."""
    e = t.open[Keyed("k", 1)]
    assert type(e) is RunEntry
    e.last = 25


def _not_a_run(t: SegmentTable) -> None:
    e = t.open[Keyed("k", 30)]
    fresh = type(e).__mro__[1]()  # an OpenEntry where a RunEntry belongs
    t.open[Keyed("k", 30)] = fresh


TABLE_CASES: list[tuple[str, Callable[[], SegmentTable], Callable[[SegmentTable], object],
                        str]] = [
    ("int index", int_table, lambda t: t._ints.remove(3), "_ints"),
    ("nonzero index", int_table, lambda t: t._nonzero.clear(), "_nonzero"),
    ("others count", keyed_table, lambda t: setattr(t, "_others", 1), "_others is 1"),
    ("consistent order", int_table, lambda t: t.terminated.insert(2),
     "open time 1 is at or below a terminated time"),
    ("keyed index", keyed_table, lambda t: t._keyed["k"].remove(6), "keys ['k']"),
    ("keyed count", keyed_table, lambda t: setattr(t, "_nkeyed", 9), "_nkeyed is 9"),
    ("by-time index", keyed_table, lambda t: t._by_time.remove((5, "k")), "_by_time"),
    ("session runs", session_table, _bad_session_runs, "within gap 10"),
    ("run entries", session_table, _not_a_run, "not a RunEntry"),
    ("prune heap", keyed_table, lambda t: t._term_heap.clear(), "prune heap"),
    ("start heaps", keyed_table, lambda t: t._starts.clear(), "start heap"),
    ("seal times", keyed_table, lambda t: t.sources["a"].seal_ms.update({Keyed("z", 1): 1}),
     "seal time for Keyed"),
    ("membership", int_table, lambda t: setattr(t, "had_source", False),
     "no source ever registered"),
]


@pytest.mark.parametrize(("build", "corrupt", "message"),
                         [c[1:] for c in TABLE_CASES], ids=[c[0] for c in TABLE_CASES])
def test_each_table_check_fires(
    build: Callable[[], SegmentTable], corrupt: Callable[[SegmentTable], object], message: str,
) -> None:
    table = build()
    table.check_invariants()
    corrupt(table)
    with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        table.check_invariants()


def _core() -> Harness:
    h = Harness()
    h.register("a")
    h.register("b")
    h.send("a", report(1), 10)
    h.tick(10)
    h.core.check_invariants()
    return h


def _evicted_but_registered(h: Harness) -> None:
    h.core.state.sessions[("a", 0)].evicted = True


def _evicting_nobody(h: Harness) -> None:
    h.core.evicting[("ghost", 0)] = (None, "r", "silent")


def _evicting_evicted(h: Harness) -> None:
    h.core.state.sessions[("b", 0)].evicted = True
    h.core.state.tables["s"].unregister("b")
    h.core.evicting[("b", 0)] = (3, "r", "silent")


def _foreign_session(h: Harness) -> None:
    h.core.state.sessions[("c", 5)] = SourceSession("i1", 0, 0)


def _foreign_table(h: Harness) -> None:
    h.core.home["s"] = 3


def _table_inside(h: Harness) -> None:
    h.core.state.tables["s"]._ints.clear()


CORE_CASES: list[tuple[str, Callable[[Harness], object], str]] = [
    ("rule 6: evicted yet registered", _evicted_but_registered,
     "evicted on acks partition 0, yet is still a registered SOURCE of 's'"),
    ("evicting without a session", _evicting_nobody, "evicting \\('ghost', 0\\)"),
    ("evicting an evicted session", _evicting_evicted, "evicted already"),
    ("rule 2: a session it does not own", _foreign_session, "acks partition 5"),
    ("rule 1: a table it does not own", _foreign_table, "home acks partition 3"),
    ("the tables' own checks", _table_inside, "table 's': _ints"),
    ("the offsets it owns", lambda h: h.core.state.acks_offsets.update({7: 1}), "partition 7"),
]


@pytest.mark.parametrize(("corrupt", "message"), [c[1:] for c in CORE_CASES],
                         ids=[c[0] for c in CORE_CASES])
def test_each_core_check_fires(corrupt: Callable[[Harness], object], message: str) -> None:
    h = _core()
    corrupt(h)
    with pytest.raises(AssertionError, match=message):
        h.core.check_invariants()


def _liveness() -> Liveness:
    live = Liveness(1000)
    live.probed(0, 100, 5, 5, 8)  # unread up to 8: the probe waits
    live.probed(0, 200, 6, 6, 9)
    live.probed(1, 100, 5, 3, 5)  # a transaction holds the LSO at 3, read up to it
    live.advance(0, 6)
    live.check_invariants()
    return live


def _probe_reached(live: Liveness) -> None:
    live._read[0] = 8


def _probes_swapped(live: Liveness) -> None:
    probes = live._probes[0]
    probes[0], probes[1] = probes[1], probes[0]


LIVENESS_CASES: list[tuple[str, Callable[[Liveness], object], str]] = [
    ("probe order", _probes_swapped, "probes out of order"),
    ("a reached probe", _probe_reached, "was reached by position 8"),
    ("horizon past a probe", lambda live: live.horizon.update({0: 150}),
     "horizon 150 ms is past its unreached probe at 100 ms"),
    ("blocker partition", lambda live: live.blockers.update({0: live.blockers[1]}),
     "the blocker of partition 0"),
    ("judged unread", lambda live: live.blockers.update(
        {1: replace(live.blockers[1], verdict="fenced")}), "before its first message"),
]


@pytest.mark.parametrize(("corrupt", "message"), [c[1:] for c in LIVENESS_CASES],
                         ids=[c[0] for c in LIVENESS_CASES])
def test_each_liveness_check_fires(corrupt: Callable[[Liveness], object], message: str) -> None:
    live = _liveness()
    assert isinstance(live.blockers[1], Blocker)
    corrupt(live)
    with pytest.raises(AssertionError, match=message):
        live.check_invariants()


def test_each_holds_check_fires() -> None:
    table = int_table()
    holds = Holds(None)
    [hold] = holds.update({"s": table}, 50)
    assert hold == Hold("s", "a", 1, 50)
    holds.check_invariants({"s": table})
    holds.held[("s", "a")] = replace(hold, since_ms=40)
    with pytest.raises(AssertionError, match="since 40 ms, before it was watched at 50 ms"):
        holds.check_invariants()
    holds.held.clear()
    holds.watched[("s", "ghost")] = 1
    with pytest.raises(AssertionError, match="'ghost' is watched in 's', where it never"):
        holds.check_invariants({"s": table})


def test_the_core_checks_its_liveness_and_holds() -> None:
    h = _core()
    h.probe(20, high=h.offsets[0] + 5)  # written, not read yet: the horizon waits
    h.core.check_invariants()
    h.core.live.horizon[0] = 30
    with pytest.raises(AssertionError, match="liveness: partition 0's horizon 30 ms"):
        h.core.check_invariants()
    h.core.live.horizon.clear()
    h.core.holds.watched[("s", "ghost")] = 1
    with pytest.raises(AssertionError, match="holds: source 'ghost'"):
        h.core.check_invariants()

