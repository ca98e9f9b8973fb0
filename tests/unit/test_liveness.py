"""The liveness rules (substreams.acker.liveness) on a simulated clock: read horizons, blockers
and what is decided about them, without a broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.liveness import (
    Holds,
    Liveness,
    Silent,
    SilentBlocker,
    excuse_stall,
    holds_every_ms,
    probe_interval_ms,
)
from substreams.acker.state import AckerState, Blocker, Hold, SourceSession
from substreams.acker.table import SOURCE, STAGE, SegmentTable, Violation
from substreams.frontier import Keyed, Time, sort_key

T = 3000


def sessions(**last_seen: int) -> dict[tuple[str, int], SourceSession]:
    return {(name, 0): SourceSession(f"inc-{name}", 1, ms, f"w-{name}")
            for name, ms in last_seen.items()}


def test_silence_is_proven_only_up_to_the_read_horizon() -> None:
    live = Liveness(T)
    s = sessions(a=0)
    assert live.decide(s, 10_000) == []  # no probe yet: nothing is proven
    live.probed(0, 1000, position=5, lso=5, high=5)  # read to the end at 1 s
    assert live.silence(0, 0) == 1000
    live.probed(0, 2000, position=5, lso=5, high=9)  # blocked: the horizon stands
    live.probed(0, 9000, position=5, lso=5, high=12)
    assert live.horizon[0] == 1000 and live.decide(s, 9000) == []
    live.advance(0, 9)  # the transaction ended, the acker read up to 9: the 2 s probe passed
    assert live.horizon[0] == 2000
    live.advance(0, 12)
    assert live.decide(s, 9000) == [Silent(("a", 0), 9000, True)]


def test_a_busy_partition_still_moves_its_horizon() -> None:
    """Live writers keep a transaction open at every probe (the LSO below the high
    watermark), but the LSO moves: each probe is passed once its transactions commit."""
    live = Liveness(T)
    for i in range(10):
        now = 1000 * (i + 1)
        # position reaches the previous probe's high watermark (10 * i)
        live.probed(0, now, position=10 * i, lso=10 * i, high=10 * i + 7)
    assert live.horizon[0] == 9000
    assert [b.offset for b in live.blockers.values()] == [90]  # a fresh one, not silent


def test_a_blocker_held_for_the_timeout_is_evicted_once() -> None:
    live = Liveness(T)
    s = sessions(victim=900, live=950)
    live.probed(0, 1000, position=40, lso=40, high=41)
    assert live.to_name(1500) == []  # a third of the timeout first
    [b] = live.to_name(2000)
    live.named(b, "victim", "inc-victim", None)
    for now in (2000, 3000, 4000):
        live.probed(0, now, position=40, lso=40, high=50 + now // 100)
        assert live.decide(s, now) == []
    [d] = live.decide(s, 4001)
    assert isinstance(d, SilentBlocker) and d.key == ("victim", 0)
    assert d.blocker.verdict == "evicted"
    assert live.decide(s, 5000) == []  # decided once


def test_blockers_that_are_not_a_current_session() -> None:
    live = Liveness(T)
    s = sessions(a=0)
    live.probed(0, 0, position=7, lso=7, high=8)
    [b] = live.to_name(T)
    live.named(b, "new", "inc-new", "w-new")  # died in its first transaction: no session
    [d] = live.decide(s, T + 1)
    assert isinstance(d, SilentBlocker) and d.writer == "w-new" and d.key is None
    live.probed(1, 0, position=3, lso=3, high=4)
    [b1] = live.to_name(T)
    live.named(b1, None, None, None)  # another program's transaction
    [d1] = live.decide(s, T + 1)
    assert isinstance(d1, SilentBlocker) and d1.key is None and d1.writer is None
    assert d1.blocker.verdict == "reported"


def test_a_never_evicted_blocker_is_reported_not_fenced() -> None:
    live = Liveness(T)
    s = {("driver", 0): SourceSession("i", 1, 0, "w", evict_when_silent=False)}
    live.probed(0, 0, position=3, lso=3, high=4)
    [b] = live.to_name(T)
    live.named(b, "driver", "i", None)
    [d] = live.decide(s, T + 1)
    assert isinstance(d, SilentBlocker) and d.key is None and d.writer is None


def test_a_moved_lso_is_a_new_blocker_and_an_unblocked_partition_none() -> None:
    live = Liveness(T)
    live.probed(0, 0, position=3, lso=3, high=4)
    live.probed(0, 100, position=6, lso=6, high=8)
    assert live.blockers[0].offset == 6 and live.blockers[0].since_ms == 100
    live.probed(0, 200, position=8, lso=8, high=8)
    assert live.blockers == {}


def test_excuse_stall() -> None:
    s = sessions(a=100)
    excuse_stall(s, 1000, 1300, 200)  # within two heartbeats
    assert s[("a", 0)].last_seen_ms == 100
    excuse_stall(s, 1000, 6000, 200)
    assert s[("a", 0)].last_seen_ms == 100 + 5000 - 400


def test_probe_interval_and_blocker_round_trip() -> None:
    assert probe_interval_ms(30_000) == 1000 and probe_interval_ms(3000) == 300
    assert probe_interval_ms(500) == 100
    b = Blocker(1, 2, 3, "s", "i", "w", True, "evicted")
    assert Blocker.from_state(b.to_state()) == b


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 500), st.integers(0, 5), st.integers(0, 5)), max_size=40
    )
)
def test_the_horizon_never_passes_an_unread_write(steps: list[tuple[int, int, int]]) -> None:
    """Whatever the probes and reads: at the horizon's time, the acker had since read up to
    the high watermark that partition had then (the property rule 2 rests on)."""
    live = Liveness(T)
    now = position = high = 0
    seen: list[tuple[int, int]] = []  # (probe time, high) of every probe
    for dt, writes, reads in steps:
        now += dt
        high += writes
        position = min(high, position + reads)
        live.probed(0, now, position=position, lso=position, high=high)
        seen.append((now, high))
        horizon = live.horizon.get(0)
        if horizon is not None:
            [h] = [hw for t, hw in seen if t == horizon]
            assert h <= position
        # and it is the latest such probe
        passed = [t for t, hw in seen if hw <= position]
        assert horizon == (max(passed) if passed else None)


# -- rules 8 and 9: holds ----------------------------------------------------------------


def table_of(*sources: str, gap_ms: int | None = None) -> SegmentTable:
    table = SegmentTable("s", gap_ms)
    for name in sources:
        table.register(name, SOURCE)
    return table


def test_a_source_holds_its_oldest_unsealed_time_since_it_opened() -> None:
    table = table_of("a", "b")
    table.register("stage", STAGE)  # stages never seal: they hold nothing
    table.report(3, 0, 1, 1, (), 100)
    table.report(1, 0, 1, 1, (), 200)  # out of order: the lowest, opened later
    table.seal("a", 1, 0, 250)
    holds = Holds(None)
    assert holds.update({"s": table}, 50) == [Hold("s", "a", 3, 100), Hold("s", "b", 1, 200)]
    table.seal("b", 1, 0, 300)
    table.report(2, 0, 1, 1, (), 300)
    assert holds.update({"s": table}, 400) == [Hold("s", "a", 2, 300), Hold("s", "b", 2, 300)]
    table.seal("a", 5, 0, 500)
    assert holds.update({"s": table}, 500) == [Hold("s", "b", 2, 300)]  # 'a' holds nothing
    assert set(holds.watched) == {("s", "a"), ("s", "b")}
    table.unregister("b")
    assert holds.update({"s": table}, 600) == [] and set(holds.watched) == {("s", "a")}


def test_a_hold_starts_no_earlier_than_the_watch_and_keeps_its_start() -> None:
    table = table_of("a")
    table.report(0, 0, 1, 1, (), 100)
    holds = Holds(1000)
    [h] = holds.update({"s": table}, 5000)  # first seen by this acker at 5 s
    assert h.since_ms == 5000
    holds.excuse(700)
    assert holds.update({"s": table}, 6000) == [Hold("s", "a", 0, 5700)]
    table.report(1, 0, 1, 1, (), 6000)
    table.seal("a", 0, 0, 6100)  # a new oldest time: its own first sighting (or the watch)
    assert holds.update({"s": table}, 6200) == [Hold("s", "a", 1, 6000)]


def test_a_hold_is_overdue_only_on_the_read_horizon_and_only_when_on() -> None:
    table = table_of("a")
    table.report(0, 0, 1, 1, (), 100)
    for timeout, horizon, overdue in [
        (None, 10_000, []), (1000, 1100, []), (1000, 1101, [1001]), (1000, None, [])
    ]:
        holds = Holds(timeout)
        holds.update({"s": table}, 100)
        seen = {} if horizon is None else {0: horizon}
        assert [ms for _, ms in holds.overdue(seen, {"s": 0})] == overdue


def test_holds_every_and_the_checkpoint_round_trip() -> None:
    assert holds_every_ms(None) == 1000 and holds_every_ms(2000) == 200
    assert holds_every_ms(500) == 100 and holds_every_ms(60_000) == 1000
    state = AckerState(holds=[Hold("s", "a", Keyed("k", 3), 7), Hold("t", "b", (1, 2), 8)])
    assert AckerState.loads(state.dumps(), {}, 100).holds == state.holds
    assert excuse_stall(sessions(a=0), 1000, 1300, 200) == 0


def reference_oldest(table: SegmentTable, source: str) -> tuple[Time, int] | None:
    """The rule as stated, from :meth:`SegmentTable.unsealed_sources` alone: the lowest
    unsealed int time, the first unsealed other time to open; the one first seen earlier
    (ties: the int)."""
    unsealed = [t for t in table.open if source in table.unsealed_sources(t)]  # opening order
    if not unsealed:
        return None
    ints = [t for t in unsealed if type(t) is int]
    others = [t for t in unsealed if type(t) is not int]
    best = min(ints, key=sort_key) if ints else others[0]
    if ints and others and table.open[others[0]].first_seen_ms < table.open[best].first_seen_ms:
        best = others[0]
    return best, table.open[best].first_seen_ms


@st.composite
def table_ops(draw: st.DrawFn) -> tuple[int | None, list[tuple[str, str, Time]]]:
    """Reports, seals, keyed seals and terminations of ints, pairs and keyed times (keyed
    only in a session table)."""
    gap = draw(st.sampled_from([None, None, 3]))
    keyed = st.builds(Keyed, st.sampled_from(["k", "q"]), st.integers(0, 9))
    pairs = st.tuples(st.integers(0, 3), st.integers(0, 3))
    times: st.SearchStrategy[Time] = keyed if gap is not None else st.one_of(
        st.integers(0, 9), keyed, pairs
    )
    op = st.tuples(
        st.sampled_from(["report", "seal", "seal_keys", "terminate"]),
        st.sampled_from(["a", "b", "c"]),
        times,
    )
    return gap, draw(st.lists(op, max_size=40))


@settings(max_examples=300, deadline=None)
@given(table_ops())
def test_oldest_unsealed_is_the_stated_rule(
    case: tuple[int | None, list[tuple[str, str, Time]]],
) -> None:
    """Whatever the reports, seals and terminations: per source, the time the bisection
    and the walk find is the one the rule names from ``unsealed_sources`` alone."""
    gap, ops = case
    table = table_of("a", "b", "c", gap_ms=gap)
    for i, (kind, source, t) in enumerate(ops):
        now = i // 2  # two operations a millisecond: times first seen at the same moment
        try:
            if kind == "report":
                table.report(t, 0, 1, 1, (), now)
            elif kind == "seal":
                table.seal(source, t, now, now)
            elif kind == "seal_keys":
                if isinstance(t, Keyed) and isinstance(t.time, int):
                    table.seal_keys(source, t.time, now)
            else:
                table.terminations()
        except Violation:
            pass
        got = table.oldest_unsealed()
        for name in ("a", "b", "c"):
            assert got.get(name) == reference_oldest(table, name), (name, ops[: i + 1])
