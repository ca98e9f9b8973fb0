"""The liveness rules (substreams.acker.liveness) on a simulated clock: read horizons, blockers
and what is decided about them, without a broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker.liveness import (
    Liveness,
    Silent,
    SilentBlocker,
    excuse_stall,
    probe_interval_ms,
)
from substreams.acker.state import Blocker, SourceSession

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
