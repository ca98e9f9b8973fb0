"""The acker's rules (substreams.acker.core) on a simulated clock, without a broker: each
numbered rule of the module doc, and the liveness decisions as effects."""

from __future__ import annotations

from typing import Any

import pytest

from substreams.acker.core import AckerCore, Effects
from substreams.acker.protocol import (
    AckEntry,
    AckMessage,
    AckReport,
    Evict,
    Register,
    SealEntry,
    SourceHeartbeat,
    Unregister,
    ack_headers,
    encode_ack,
)
from substreams.acker.state import AckerState
from substreams.control.messages import OffsetRange, SourceEvicted, completions
from substreams.streams.deadletter import (
    REASON_MALFORMED,
    REASON_STALE,
    REASON_TERMINATED,
    REASON_UNKNOWN_SUBSTREAM,
    REASON_UNREGISTERED,
)

T = 3000


class Harness:
    """One core owning acks partitions ``owned`` of ``n``, substreams s (home 0) and o
    (home 1), fed messages with increasing offsets per partition."""

    def __init__(
        self, n: int = 1, owned: tuple[int, ...] = (0,), unsealed: int | None = None
    ) -> None:
        state = AckerState()
        home = {"s": 0, "o": 1 % n}
        for sub in home:
            if home[sub] in owned:
                state.ensure(sub, 100)
        self.core = AckerCore(
            "a", owned, home, {s: f"_control.{s}" for s in home if home[s] in owned},
            acks_partitions=n, source_timeout_ms=T, heartbeat_ms=200,
            unsealed_timeout_ms=unsealed, state=state,
        )
        self.offsets = dict.fromkeys(owned, 0)
        self.seq: dict[tuple[str, str], int] = {}
        self.core.started(0)

    def send(self, source: str, body: Any, now: int, *, inc: str = "i1", partition: int = 0,
             seq: int | None = None) -> list[tuple[str, str]]:
        if seq is None:
            seq = self.seq[(source, inc)] = self.seq.get((source, inc), -1) + 1
        raw = encode_ack(AckMessage(source, seq, now, body, inc))
        offset = self.offsets[partition]
        self.offsets[partition] += 1
        got = self.core.apply(partition, offset, raw, ack_headers(), now)
        return [(r.reason, r.detail) for r in got]

    def register(self, source: str, now: int = 0, **kw: Any) -> None:
        inc = kw.pop("inc", "i1")
        assert self.send(source, Register(("s",), writer=f"txn.{source}", **kw), now,
                         inc=inc) == []

    def tick(self, now: int) -> Effects:
        return self.core.tick(now, dict(self.offsets))

    def probe(self, now: int, lso: int | None = None, high: int | None = None) -> None:
        at = self.offsets[0]
        self.core.probed(0, now, at, at if lso is None else lso, at if high is None else high)


def report(t: int, n: int = 1, at: int = 0) -> AckReport:
    return AckReport((AckEntry("s", t, 0, n, 1, (OffsetRange("clicks", 0, at, at + n),)),))


def seal(t: int, at_ms: int = 5) -> AckReport:
    return AckReport((), (SealEntry("s", t, at_ms),))


def notified(effects: Effects) -> list[tuple[Any, int]]:
    return [(c.time, c.records) for _, body in effects.records for c in completions(body)]


def test_a_time_terminates_once_sealed_by_every_source_in_order() -> None:
    h = Harness()
    h.register("a")
    h.register("b")
    assert h.send("a", report(1, 2), 10) == [] and h.send("a", seal(1), 10) == []
    assert notified(h.tick(10)) == []  # b has not sealed
    assert h.send("b", seal(2), 20) == []  # covers 1 and 2
    assert notified(h.tick(20)) == [(1, 2)]  # 2 waits for a
    assert h.send("a", seal(2), 30) == []
    assert notified(h.tick(30)) == [(2, 0)]
    assert h.core.notifications == 2 and h.core.state.acks_offsets == {0: 6}


def test_duplicates_stale_unregistered_malformed() -> None:
    h = Harness()
    h.register("a")
    assert h.send("a", report(1), 1, seq=1) == []
    assert h.send("a", report(1), 1, seq=1) == []  # replayed after a crash: ignored
    assert h.core.duplicates == 1
    assert h.core.state.tables["s"].open[1].records == 1
    assert h.send("a", report(1), 2, inc="old", seq=9)[0][0] == REASON_STALE
    assert h.send("ghost", report(1), 2)[0][0] == REASON_UNREGISTERED
    h.offsets[0] += 1
    [bad] = h.core.apply(0, h.offsets[0], b"\x00garbage", ack_headers(), 3)
    assert bad.reason == REASON_MALFORMED
    assert h.send("a", Register(("nope",)), 3, seq=5)[0][0] == REASON_UNKNOWN_SUBSTREAM


def test_a_report_after_its_time_terminated_is_refused() -> None:
    h = Harness()
    h.register("a")
    h.send("a", seal(1), 1)
    assert notified(h.tick(1)) == [(1, 0)]
    [(reason, detail)] = h.send("a", report(1), 2)
    assert reason == REASON_TERMINATED and "terminated" in detail


def test_a_substream_of_another_acks_partition_is_refused_on_this_one() -> None:
    h = Harness(n=2, owned=(0, 1))
    [(reason, detail)] = h.send("a", Register(("o",)), 0, partition=0)
    assert reason == REASON_UNKNOWN_SUBSTREAM and "belongs to acks partition 1" in detail


def test_a_new_incarnation_replaces_the_session_and_its_count() -> None:
    h = Harness()
    h.register("a")
    h.send("a", report(1), 1, seq=7)
    h.register("a", inc="i2")  # seq 0 of the new incarnation
    assert h.core.state.sessions[("a", 0)].incarnation == "i2"
    assert h.send("a", report(1), 2, inc="i2", seq=1) == []
    assert h.send("a", report(1), 2, inc="i1", seq=8)[0][0] == REASON_STALE


def test_heartbeats_refresh_only_the_current_incarnation() -> None:
    h = Harness()
    h.register("a")
    h.send("a", SourceHeartbeat(), 500, seq=-1)
    assert h.core.state.sessions[("a", 0)].last_seen_ms == 500
    h.send("a", SourceHeartbeat(), 900, inc="other", seq=-1)
    assert h.core.stale == 1 and h.core.state.sessions[("a", 0)].last_seen_ms == 500


def test_a_silent_source_is_fenced_then_evicted_after_what_it_committed() -> None:
    h = Harness()
    h.register("a")
    h.register("b")
    h.send("a", report(1), 0)
    for now in range(0, 5000, 300):  # b speaks, a does not; everything read at each probe
        h.send("b", SourceHeartbeat(), now, seq=-1)
        h.probe(now)
        effects = h.tick(now)
        if effects.evict:
            break
    [ev] = effects.evict
    assert ev.key == ("a", 0) and ev.writer == "txn.a" and "silent" in ev.reason
    assert now > T
    h.core.fenced(("a", 0), h.offsets[0] + 2)  # two more messages to read after the fence
    assert h.tick(now + 1).evicted == []
    h.send("a", report(2), now + 2)  # committed before the fence: applied, not stale
    h.send("b", SourceHeartbeat(), now + 2, seq=-1)
    effects = h.tick(now + 3)
    assert effects.evicted == [(("a", 0), ev.reason, "silent")]
    [(topic, body)] = [(t, b) for t, b in effects.records if isinstance(b, SourceEvicted)]
    assert topic == "_control.s" and body.source == "a"
    assert h.core.state.sessions[("a", 0)].evicted and h.core.evictions == 1
    assert h.core.state.tables["s"].open[2].records == 1


def test_no_one_is_judged_silent_behind_an_open_transaction() -> None:
    h = Harness()
    h.register("a")
    h.probe(100)  # read to the end at 100 ms
    for now in range(400, 20_000, 300):  # then a transaction holds offset 1, others write
        h.probe(now, lso=1, high=1 + now // 300)
        assert h.tick(now).evict == [], now


def test_a_never_evicted_source_is_warned_of_once() -> None:
    h = Harness()
    h.register("driver", evict_when_silent=False)
    warnings = []
    for now in range(0, 8000, 300):
        h.probe(now)
        effects = h.tick(now)
        assert effects.evict == []
        warnings += effects.warnings
    assert len(warnings) == 1 and "never evicted for silence" in warnings[0]


def test_an_operators_evict() -> None:
    h = Harness()
    h.register("a")
    assert h.send("op", Evict("a", "gone"), 1, seq=-1) == []
    [ev] = h.tick(1).evict
    assert ev.reason == "evicted by hand: gone"
    assert h.send("op", Evict("a", "again"), 2, seq=-1) == []  # on its way out: nothing
    assert h.tick(2).evict == []
    [(reason, _)] = h.send("op", Evict("ghost", "x"), 3, seq=-1)
    assert reason == REASON_UNREGISTERED
    two = Harness(n=2, owned=(0,))
    assert two.send("op", Evict("ghost", "x"), 3, seq=-1) == []
    assert "nothing to evict" in two.tick(3).warnings[0]


def test_a_new_incarnation_cancels_an_eviction_in_progress() -> None:
    h = Harness()
    h.register("a")
    h.send("op", Evict("a", "gone"), 1, seq=-1)
    assert h.tick(1).evict
    h.register("a", inc="i2")
    h.core.fenced(("a", 0), 0)
    assert h.tick(2).evicted == [] and not h.core.state.sessions[("a", 0)].evicted


@pytest.mark.parametrize(("session_writer", "effect"), [(True, "evict"), (False, "fence")])
def test_a_silent_blocker_is_evicted_or_its_writer_fenced(
    session_writer: bool, effect: str
) -> None:
    h = Harness()
    h.register("victim")
    h.probe(0, lso=h.offsets[0], high=h.offsets[0] + 1)
    [b] = h.core.to_name(T // 3)
    if session_writer:
        h.core.named(b, "victim", "i1", None)  # its session names the writer
    else:
        h.core.named(b, "newcomer", "i9", "txn.newcomer")  # died in its first transaction
    effects = h.tick(T + 1)
    if effect == "evict":
        [ev] = effects.evict
        assert ev.key == ("victim", 0) and "open transaction held" in ev.reason
        assert h.core.state.blockers[0].verdict == "evicted"
    else:
        [f] = effects.fence
        assert f.writer == "txn.newcomer" and effects.evict == []


def test_the_acker_own_stall_evicts_no_one() -> None:
    h = Harness()
    h.register("a")
    h.probe(0)
    h.tick(100)
    # the acker did not step for 60 s (a broker outage): then everything is read at once
    h.probe(60_000)
    assert h.tick(60_000).evict == []


def test_unregister_and_left_sources_hold_nothing() -> None:
    h = Harness()
    h.register("a")
    h.register("b")
    h.send("b", seal(3), 1)
    assert h.send("a", Unregister(("s",)), 2) == []
    assert notified(h.tick(2)) == [(3, 0)]


def test_departed_sessions_are_forgotten_and_state_stays_flat() -> None:
    """Sources come, go (closing or evicted) and are replaced: the sessions kept do not grow
    with them, and a forgotten incarnation's message is still refused."""
    from substreams.acker.core import DEPARTED_KEEP_MS

    h = Harness()
    now = 0
    sizes = []
    for i in range(120):
        h.register(f"s{i}", now)
        h.send(f"s{i}", seal(i), now)
        h.send(f"s{i}", Unregister(("s",)), now)
        for _ in range(80):  # 20 s between sources, a step every 250 ms
            now += 250
            h.probe(now)
            h.tick(now)
        sizes.append(len(h.core.state.sessions))
    assert max(sizes[40:]) <= DEPARTED_KEEP_MS // 20_000 + 2, sizes
    [(reason, _)] = h.send("s0", report(500), now + 1)
    assert reason == REASON_UNREGISTERED


def test_a_newer_incarnation_dead_in_its_first_transaction_supersedes_the_session() -> None:
    """Its init_transactions fenced the session's incarnation (maybe an idle zombie that
    heartbeats on): the session is evicted, not kept alive by the zombie's heartbeats."""
    h = Harness()
    h.register("a")
    h.probe(0, lso=h.offsets[0], high=h.offsets[0] + 1)
    [b] = h.core.to_name(T // 3)
    h.core.named(b, "a", "i2", "txn.a")  # its Register, in the open transaction
    for now in range(T // 3, T + 1, 300):
        h.send("a", SourceHeartbeat(), now, seq=-1)  # the zombie of i1
        h.probe(now, lso=b.offset, high=b.offset + 1)
        assert h.tick(now).evict == []
    [ev] = h.tick(T + 301).evict
    assert ev.key == ("a", 0) and ev.reason.startswith("superseded: incarnation i2")


# -- rule 9: holds and the unsealed timeout ------------------------------------------------

U = 2000


def run_holder(h: Harness, until: int, *, every: int = 100) -> list[Effects]:
    """'a' writes and seals epochs 0, 1, 2 (one every 300 ms from 0), 'b' heartbeats and
    never seals; everything read at each probe.  The effects of every tick up to ``until``
    (stops after the first eviction begins)."""
    out = []
    for now in range(0, until, every):
        if now % 300 == 0 and now // 300 <= 2:
            e = now // 300
            h.send("a", report(e, 1, at=e), now)
            h.send("a", seal(e, now), now)
        if now % 300 == 0:
            h.send("b", SourceHeartbeat(), now, seq=-1)
            h.send("a", SourceHeartbeat(), now, seq=-1)
        h.probe(now)
        out.append(h.tick(now))
        if out[-1].evict:
            break
    return out


def test_a_live_source_that_never_seals_holds_the_oldest_time_since_it_opened() -> None:
    h = Harness()
    h.register("a")
    h.register("b")
    effects = run_holder(h, 6000)
    assert not any(e.evict for e in effects)  # off by default
    assert [n for e in effects for n in notified(e)] == []
    [hold] = h.core.state.holds  # 'a' sealed all it wrote: it holds nothing
    assert (hold.substream, hold.source, hold.time, hold.since_ms) == ("s", "b", 0, 0)


def test_an_overdue_hold_evicts_its_source_then_the_held_times_are_notified_in_order() -> None:
    h = Harness(unsealed=U)
    h.register("a")
    h.register("b")
    effects = run_holder(h, 6000)
    [ev] = effects[-1].evict
    evicted_at = (len(effects) - 1) * 100
    assert U < evicted_at <= U + 1000  # the time opened at 0; judged at most every 200 ms
    assert ev.key == ("b", 0) and ev.writer == "txn.b" and ev.cause == "unsealed"
    assert "held s time 0 unsealed for" in ev.reason and "unsealed_timeout_ms: 2000" in ev.reason
    h.core.fenced(("b", 0), h.offsets[0])
    done = h.tick(evicted_at + 1)
    assert done.evicted == [(("b", 0), ev.reason, "unsealed")]
    assert notified(done) == [(0, 1), (1, 1), (2, 1)]  # in order, 'a''s records only
    [body] = [b for _, b in done.records if isinstance(b, SourceEvicted)]
    assert body.source == "b" and body.reason == ev.reason
    assert h.tick(evicted_at + 500).evict == [] and h.core.state.holds == []


def test_a_hold_is_judged_on_the_read_horizon_not_the_clock() -> None:
    """A seal waiting behind another transaction's open one (the LSO held) is not read
    yet: the horizon stands still, so the hold is not proven overdue, however long."""
    h = Harness(unsealed=U)
    h.register("a")
    h.register("b")
    h.send("a", report(0), 0)
    h.send("a", seal(0), 0)
    h.probe(0)
    for now in range(100, 20_000, 100):  # then a transaction holds the partition
        h.probe(now, lso=h.offsets[0], high=h.offsets[0] + 1 + now // 100)
        assert h.tick(now).evict == [], now
    assert h.core.state.holds[0].source == "b"


def test_a_hold_starts_when_the_acker_starts_watching() -> None:
    """A source that registers after a time opened, and an acker that restarts, count
    nothing from before they could see the hold."""
    h = Harness(unsealed=U)
    h.register("a")
    h.send("a", report(0), 0)
    h.probe(0)
    h.tick(0)
    h.register("b", now=5000)
    h.probe(5000)
    h.tick(5000)
    [hold] = [x for x in h.core.state.holds if x.source == "b"]
    assert hold.time == 0 and hold.since_ms == 5000
    assert h.tick(5000 + U).evict == []
    restarted = AckerCore(
        "a", (0,), {"s": 0, "o": 0}, {"s": "_control.s"}, acks_partitions=1,
        source_timeout_ms=T, heartbeat_ms=200, unsealed_timeout_ms=U, state=h.core.state,
    )
    restarted.started(9000)
    restarted.probed(0, 9000, h.offsets[0], h.offsets[0], h.offsets[0])
    restarted.tick(9000, dict(h.offsets))
    assert {x.source: x.since_ms for x in restarted.state.holds} == {"a": 9000, "b": 9000}


def test_the_acker_s_own_stall_moves_every_hold_on() -> None:
    h = Harness(unsealed=U)
    h.core.started(1000)
    h.register("b", now=1000)
    h.send("b", report(0), 1000)
    h.probe(1000)
    h.tick(1000)
    assert h.core.state.holds[0].since_ms == 1000
    h.send("b", SourceHeartbeat(), 11_000, seq=-1)
    h.probe(11_000)  # a 10 s gap between two steps: 9.6 s of it excused
    assert h.tick(11_000).evict == []
    assert h.core.holds.held[("s", "b")].since_ms == 1000 + 10_000 - 400
    for now in range(11_100, 20_000, 100):  # the rest of it counts
        h.send("b", SourceHeartbeat(), now, seq=-1)
        h.probe(now)
        if h.tick(now).evict:
            break
    assert 10_600 + U < now <= 10_600 + U + 300


def test_a_never_evicted_source_that_holds_a_time_is_warned_of_not_evicted() -> None:
    h = Harness(unsealed=U)
    h.register("a")
    h.register("driver", evict_when_silent=False)
    h.send("a", report(0), 0)
    h.send("a", seal(0), 0)
    warnings = []
    for now in range(0, 8000, 100):
        h.send("driver", SourceHeartbeat(), now, seq=-1)
        h.send("a", SourceHeartbeat(), now, seq=-1)
        h.probe(now)
        effects = h.tick(now)
        assert effects.evict == []
        warnings += effects.warnings
    assert len(warnings) == 1
    assert "'driver' held s time 0 unsealed" in warnings[0] and "never evicted" in warnings[0]
