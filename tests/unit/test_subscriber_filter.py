"""The subscriber's pure logic: Strymon's epoch-atomicity filter and frontier merging."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.control.messages import EpochComplete, FrontierSnapshot, FrontierUpdate
from substreams.control.progress import ProgressTracker
from substreams.control.subscription import SubscriptionFrontiers
from substreams.frontier import Antichain, Time, UpperAntichain


def test_seed_example_drops_active_and_hole_times_until_passed() -> None:
    # completed 0..2, active {3, 5}, latent {4, 6, ...}: Strymon's example.
    f = SubscriptionFrontiers()
    f.start("a", lower=[3], upper=[5])
    assert [t for t in range(8) if f.admits(t)] == [6, 7]  # no hole at 5, 4 dropped too
    assert f.apply("a", [(3, -1), (4, 1)]) == Antichain([4])  # 3 done, 4 became active
    assert not f.admits(4)
    assert f.apply("a", [(4, -1), (5, 1)]) == Antichain([5])
    assert not f.admits(5)  # 5 still active: its start was missed
    assert f.apply("a", [(5, -1), (6, 1)]) == Antichain([6])
    assert f.upper.is_empty()  # the lower frontier passed 5: the filter is off
    assert f.admits(5) and f.admits(0)


def test_partial_order_filter_keeps_only_elements_not_passed() -> None:
    f = SubscriptionFrontiers()
    f.start("a", lower=[(0, 2), (2, 0)], upper=[(1, 2), (2, 1)])
    assert not f.admits((1, 1)) and not f.admits((2, 1))
    assert f.admits((0, 3)) and f.admits((3, 0)) and f.admits((2, 2))
    # (2, 0) completes; (0, 2) <= (1, 2) still active, so (1, 2) stays, (2, 1) goes.
    f.apply("a", [((2, 0), -1)])
    assert f.upper == UpperAntichain([(1, 2)])
    assert f.admits((2, 1)) and not f.admits((1, 1))


def test_merged_lower_is_meet_and_merged_upper_is_union() -> None:
    f = SubscriptionFrontiers()
    f.start("a", lower=[(1, 0)], upper=[(1, 3)])
    f.start("b", lower=[(0, 2)], upper=[(3, 1)])
    assert f.lower == Antichain([(1, 0), (0, 2)])
    assert f.upper == UpperAntichain([(1, 3), (3, 1)])
    assert not f.admits((3, 1)) and not f.admits((1, 3))  # each part's upper filters all
    # b advances past (1, 3) only in the second coordinate: the meet keeps a's element
    assert f.apply("b", [((0, 2), -1), ((2, 4), 1)]) == Antichain([(1, 0), (2, 4)])
    assert f.apply("a", [((1, 0), -1), ((5, 5), 1)]) == Antichain([(2, 4)])
    assert f.upper.is_empty()


def test_updates_are_idempotent_against_a_snapshot_that_already_has_them() -> None:
    f = SubscriptionFrontiers()
    f.start("a", lower=[7], upper=[7])
    assert f.apply("a", [(7, 1)]) is None  # published after the snapshot, already in it
    assert f.apply("a", [(7, -1)]) == Antichain()
    assert f.apply("a", [(9, -1)]) is None  # a removal the snapshot already reflects


def test_completion_removes_the_time_even_without_its_delta() -> None:
    f = SubscriptionFrontiers()
    f.start("a", lower=[(1, 0)], upper=[(1, 0)])
    # the writer snapshotted while (1, 0)'s +1 was pending; completing it consolidated the
    # pending +1 and the -1 away, so the EpochComplete carries no delta for it
    assert f.complete("a", (1, 0), ()) == Antichain()


# --- property: a subscriber starting at any snapshot never yields part of an epoch ---------


@dataclass(frozen=True)
class Rec:
    part: int
    time: Time


@dataclass(frozen=True)
class Ctl:
    part: int
    body: EpochComplete | FrontierUpdate | FrontierSnapshot


INT_TIMES = st.integers(0, 5)
TUPLE_TIMES = st.tuples(st.integers(0, 2), st.integers(0, 2))


def ops(times: st.SearchStrategy[Time]) -> st.SearchStrategy[list[tuple[str, int, Time]]]:
    kind = st.sampled_from(["rec", "rec", "rec", "complete", "complete", "snap", "beat"])
    return st.lists(st.tuples(kind, st.integers(0, 1), times), max_size=60)


def write_log(
    script: list[tuple[str, int, Time]], parts: int
) -> tuple[list[Rec | Ctl], list[ProgressTracker]]:
    """Run progress writers (one per part) over ``script``; the log a subscriber would read.
    A "snap" writes a snapshot of every part at once (a place where a subscriber may start),
    each right after publishing the part's pending lower-frontier changes, as the writers'
    ``ProgressTracker.complete`` does (a snapshot ahead of the deltas before it would make
    the deltas after it inconsistent for a subscriber starting there)."""
    trackers = [ProgressTracker(f"s{p}", snapshot_every=10**9) for p in range(parts)]
    done: list[set[Time]] = [set() for _ in range(parts)]
    log: list[Rec | Ctl] = []
    for kind, part, t in script:
        part %= parts
        tr = trackers[part]
        if kind == "rec" and t not in done[part]:
            tr.activate(t)
            log.append(Rec(part, t))
        elif kind == "complete" and t not in done[part]:
            done[part].add(t)
            for b in tr.complete(t, (), 0, 0):
                assert isinstance(b, EpochComplete | FrontierSnapshot)
                log.append(Ctl(part, b))
        elif kind == "snap":
            for p, other in enumerate(trackers):
                upd = other.pending_update()
                if upd is not None:
                    log.append(Ctl(p, upd))
            log.extend(Ctl(p, trackers[p].snapshot()) for p in range(parts))
        elif kind == "beat":
            upd = tr.pending_update()
            if upd is not None:
                log.append(Ctl(part, upd))
    for p, tr in enumerate(trackers):  # finally, publish what is still pending
        upd = tr.pending_update()
        if upd is not None:
            log.append(Ctl(p, upd))
    return log, trackers


def check_from(log: list[Rec | Ctl], start: int, trackers: list[ProgressTracker]) -> None:
    """Subscribe at log[start:start+parts] (snapshots of all parts), or at the beginning."""
    parts = len(trackers)
    f = SubscriptionFrontiers()
    begin = start + parts if start >= 0 else 0
    snap_upper = UpperAntichain()
    for p in range(parts):
        if start >= 0:
            item = log[start + p]
            assert isinstance(item, Ctl) and isinstance(item.body, FrontierSnapshot)
            f.start(str(item.part), item.body.lower, item.body.upper)
            snap_upper = snap_upper.union(item.body.upper)
        else:
            f.start(str(p), (), ())
    before = Counter((r.part, r.time) for r in log[:begin] if isinstance(r, Rec))
    total = Counter((r.part, r.time) for r in log if isinstance(r, Rec))
    soft: Counter[tuple[int, Time]] = Counter()
    firm: list[tuple[int, Time]] = []
    completed_after: list[tuple[int, Time]] = []
    for item in log[begin:]:
        if isinstance(item, Rec):
            if f.admits(item.time):
                soft[(item.part, item.time)] += 1
            continue
        body = item.body
        if isinstance(body, EpochComplete):
            completed_after.append((item.part, body.time))
            if f.admits(body.time):
                firm.append((item.part, body.time))
            f.complete(str(item.part), body.time, body.lower_updates)
        elif isinstance(body, FrontierUpdate):
            f.apply(str(item.part), body.updates)
    # soft mode: every time yielded is yielded whole
    for key, n in soft.items():
        assert n == total[key], f"{key}: saw {n} of {total[key]} records"
    # firm mode: never an epoch that had records before the subscriber joined
    for key in firm:
        assert before[key] == 0, f"{key} had {before[key]} records before the snapshot"
    # and every epoch above the snapshot's upper frontier is delivered
    for part, t in completed_after:
        if not snap_upper.covers(t):
            assert (part, t) in firm
    # the lower frontier tracked from the snapshot on is the writers' (meet of the parts)
    assert f.lower == Antichain(t for tr in trackers for t in tr.active)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from(["int", "tuple"]), st.integers(1, 2))
def test_no_partial_epoch_from_any_snapshot(data: st.DataObject, domain: str, parts: int) -> None:
    script = data.draw(ops(INT_TIMES if domain == "int" else TUPLE_TIMES))
    log, trackers = write_log(script, parts)
    starts = [-1] + [
        i
        for i, item in enumerate(log)
        if isinstance(item, Ctl) and isinstance(item.body, FrontierSnapshot) and item.part == 0
    ]
    for start in starts:
        check_from(log, start, trackers)


@settings(max_examples=150, deadline=None)
@given(ops(TUPLE_TIMES))
def test_merged_lower_is_meet_of_parts(script: list[tuple[str, int, Time]]) -> None:
    log, trackers = write_log(script, 2)
    f = SubscriptionFrontiers()
    for p in range(2):
        f.start(str(p), (), ())
    for item in log:
        if isinstance(item, Ctl):
            body = item.body
            if isinstance(body, EpochComplete):
                f.complete(str(item.part), body.time, body.lower_updates)
            elif isinstance(body, FrontierUpdate):
                f.apply(str(item.part), body.updates)
    expected = trackers[0].lower.frontier().meet(trackers[1].lower.frontier())
    assert f.lower == expected
    assert f.lower == Antichain([*trackers[0].active, *trackers[1].active])
