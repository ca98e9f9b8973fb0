"""The acker's per-run path for int times against the generic reference, step by step.

The per-run path (``SegmentTable.int_runs``, ``ProgressTracker.int_runs``) must be invisible:
random sequences of register / unregister / report / report_block / seal / keyed seal /
terminations / checkpoint reloads are applied to a table and tracker on each path, and after
every step the outputs (violations, newly open times, terminations, the control bodies
``announce`` writes, the metrics' sealed-at times) and the states (``to_state``) must be
equal.  Times mix plain ints (the fast path) with tuples and keyed times (the generic path
inside the same table), so the split between the two is exercised too.
"""

from __future__ import annotations

import dataclasses
import json
from itertools import pairwise
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.acker import core
from substreams.acker.core import announce, apply_block
from substreams.acker.protocol import AckBlock
from substreams.acker.table import SOURCE, STAGE, RunEntry, SegmentTable, Violation
from substreams.control.messages import OffsetRange
from substreams.control.progress import ProgressTracker
from substreams.frontier import Keyed, Time

SOURCES = ["a", "b", "c"]

ints = st.integers(0, 7)
times: st.SearchStrategy[Time] = st.one_of(
    ints, ints, ints,
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.builds(Keyed, st.sampled_from(["k", "j"]), st.integers(0, 5)),
)
xors = st.sampled_from([0, 0, 1, 2, 3])
ranges = st.builds(
    OffsetRange, st.sampled_from(["s", "s", "t"]), st.integers(0, 1), st.integers(0, 20),
    st.integers(20, 40),
)


@st.composite
def blocks(draw: st.DrawFn) -> AckBlock:
    n = draw(st.integers(1, 8))
    ts = draw(st.lists(ints, min_size=n, max_size=n))
    xs = draw(st.one_of(st.just([]), st.lists(xors, min_size=n, max_size=n)))
    counts = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    rs = draw(st.lists(ranges, min_size=sum(counts), max_size=sum(counts)))
    recs = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    reps = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    return AckBlock.pack("x", ts, xs, recs, reps, counts, rs)


ops = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(SOURCES),
              st.sampled_from([SOURCE, SOURCE, STAGE])),
    st.tuples(st.just("unregister"), st.sampled_from(SOURCES)),
    st.tuples(st.just("report"), times, xors, st.integers(0, 2),
              st.lists(ranges, max_size=2)),
    st.tuples(st.just("block"), blocks()),
    st.tuples(st.just("block"), blocks()),
    st.tuples(st.just("seal"), st.sampled_from(SOURCES), times, st.integers(0, 9)),
    st.tuples(st.just("seal"), st.sampled_from(SOURCES), ints, st.integers(0, 9)),
    st.tuples(st.just("seal_keys"), st.sampled_from(SOURCES), st.integers(0, 5)),
    st.tuples(st.just("announce")),
    st.tuples(st.just("announce")),
    st.tuples(st.just("terminations")),
    st.tuples(st.just("reload")),
)


class Side:
    """One path: a table and its tracker, driven as the acker service drives them."""

    def __init__(self, fast: bool, gap: int | None = None) -> None:
        self.fast = fast
        self.gap = gap
        self.table = SegmentTable("x", gap)
        self.tracker = ProgressTracker("x", 3, keyed_floor=gap is not None)  # as the acker
        self.table.int_runs = self.tracker.int_runs = fast

    def apply(self, op: tuple[Any, ...], now: int) -> Any:
        table, tracker = self.table, self.tracker
        kind = op[0]
        try:
            if kind == "register":
                table.register(op[1], op[2])
            elif kind == "unregister":
                table.unregister(op[1])
            elif kind == "report":
                _, t, x, records, rs = op
                core.apply_entry(table, tracker, t, x, records, 1, rs, now)
            elif kind == "block":
                columns = op[1].unpack()
                assert not isinstance(columns, str), columns
                return [v.reason for v in apply_block(table, tracker, columns, now)]
            elif kind == "seal":
                if table.seal(op[1], op[2], op[3], now):
                    tracker.activate(op[2])
            elif kind == "seal_keys":
                table.seal_keys(op[1], op[2], now)
            elif kind == "announce":
                result = announce(table, tracker, now)
                if result[2] is not None:  # as the core does after every notifying step
                    tracker.prune_keyed(table.keyed_floor())
                return result
            elif kind == "terminations":
                # a session run's entry does not list its member times: compare without them
                return [dataclasses.replace(t, members=()) if self.gap is not None else t
                        for t in table.terminations()]
            elif kind == "reload":
                self.table = SegmentTable.from_state(
                    "x", json.loads(json.dumps(table.to_state())), int_runs=self.fast
                )
                self.tracker = ProgressTracker.from_state(
                    "x", json.loads(json.dumps(tracker.to_state())), 3
                )
                self.table.int_runs = self.tracker.int_runs = self.fast
        except Violation as v:
            return ("violation", v.reason)
        return None

    def state(self) -> tuple[Any, Any]:
        if self.gap is None:
            return self.table.to_state(), self.state_of(self.tracker)
        # Sessions: the reference keeps an entry per open time, the per-run path one per
        # run; the reference's, folded into runs, must be the runs.  The tracker counts a
        # run by its first time (the reference: every time): equal lower frontiers.
        folded = SegmentTable.from_state("x", json.loads(json.dumps(self.table.to_state())))
        table = folded.to_state()
        table["open"] = sorted(
            ([*row[:4], sorted(row[4]), *row[5:]] for row in table["open"]),
            key=lambda row: json.dumps(row, sort_keys=True),
        )
        tracker = self.state_of(self.tracker)
        tracker["active"] = sorted(json.dumps(t) for t in self.tracker.lower.frontier())
        return table, tracker

    @staticmethod
    def state_of(tracker: ProgressTracker) -> dict[str, Any]:
        state = tracker.to_state()
        # a set's iteration order is not part of the state
        state["active"] = sorted(json.dumps(t, sort_keys=True) for t in state["active"])
        return state


def check_equivalent(steps: list[tuple[Any, ...]], gap: int | None = None) -> None:
    fast, ref = Side(True, gap), Side(False, gap)
    for i, op in enumerate(steps):
        now = 1000 + i
        got, want = fast.apply(op, now), ref.apply(op, now)
        assert got == want, (i, op)
        assert fast.state() == ref.state(), (i, op)
        # the indexes the per-run path keeps are what the open times say
        table = fast.table
        assert table._ints == sorted(t for t in table.open if type(t) is int)
        assert table._nonzero == {t for t in table._ints if table.open[t].xor}
        assert table._others == sum(1 for t in table.open if type(t) is not int)
        check_keyed_index(table)


def check_keyed_index(table: SegmentTable) -> None:
    """The keyed index's invariants (SegmentTable.__init__): per key the sorted open
    ``Keyed(k, int)`` times, the same pairs by event time, their count; and every
    invariant the table checks itself."""
    table.check_invariants()
    keyed: dict[str, list[int]] = {}
    for t in table.open:
        if type(t) is Keyed and type(t.time) is int:
            keyed.setdefault(t.key, []).append(t.time)
    assert table._keyed == {k: sorted(v) for k, v in keyed.items()}
    assert table._nkeyed == sum(len(v) for v in keyed.values())
    if table.gap_ms is None:
        assert list(table._by_time) == sorted((x, k) for k, v in keyed.items() for x in v)
    else:  # sessions: no by-time index; the runs of a key are disjoint, more than gap apart
        assert not table._by_time
        for key, starts in table._keyed.items():
            runs = [(x, table.open[Keyed(key, x)]) for x in starts]
            assert all(type(e) is RunEntry and x <= e.last for x, e in runs)
            assert all(b - a.last > table.gap_ms for (_, a), (b, _) in pairwise(runs))
    walked: dict[tuple[str, int], int] = {}  # the data_from a snapshot gives, by a walk
    for e in table.open.values():
        for key, (lo, _) in e.ranges.items():
            walked[key] = min(lo, walked.get(key, lo))
    assert table.open_starts() == walked
    for t in table.terminated:  # every keyed int terminated time can be pruned by its heap
        if type(t) is Keyed and type(t.time) is int:
            assert (t.time, t.key) in table._term_heap


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=40))
def test_per_run_path_equals_generic(steps: list[tuple[Any, ...]]) -> None:
    with mock.patch.object(core, "MAX_COMPLETIONS_PER_RECORD", 3):
        check_equivalent([("register", "a", SOURCE), *steps])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(ops, st.tuples(st.just("long_run"), st.integers(1, 60))),
                max_size=20))
def test_long_runs_equal_generic(steps: list[tuple[Any, ...]]) -> None:
    """Runs longer than a record (500 times) and several snapshots per run."""
    expanded: list[tuple[Any, ...]] = [("register", "a", SOURCE)]
    top = 0
    for op in steps:
        if op[0] != "long_run":
            expanded.append(op)
            continue
        n = op[1] * 20
        ts = tuple(range(top, top + n))
        top += n
        expanded.append(("block", AckBlock.pack(
            "x", ts, (), (1,) * n, (1,) * n, (1,) * n,
            [OffsetRange("s", 0, t, t + 1) for t in ts],
        )))
        expanded.append(("seal", "a", top - 1, 5))
        expanded.append(("announce",))
    check_equivalent(expanded)


def test_a_run_is_announced_like_single_times() -> None:
    """A concrete case: 1 000 times, one record each, one source sealing the last."""
    steps: list[tuple[Any, ...]] = [("register", "a", SOURCE)]
    ts = tuple(range(1000))
    steps.append(("block", AckBlock.pack("x", ts, (), (1,) * 1000, (1,) * 1000, (1,) * 1000,
                                         [OffsetRange("s", 0, t, t + 1) for t in ts])))
    steps += [("seal", "a", 499, 7), ("announce",), ("seal", "a", 999, 8), ("announce",)]
    check_equivalent(steps)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(times, max_size=12),
    st.lists(st.tuples(ints, st.lists(ranges, max_size=2)), min_size=2, max_size=10,
             unique_by=lambda c: c[0]),
)
def test_complete_run_equals_complete_many(active: list[Time], run: list[Any]) -> None:
    """Tracker level, including times retired without having been activated (the acker
    activates every open time first; the tracker must not depend on it)."""
    from substreams.control.messages import Completion, merge_ranges

    fast, ref = ProgressTracker("x", 3), ProgressTracker("x", 3)
    ref.int_runs = False
    for tracker in (fast, ref):
        for t in active:
            tracker.activate(t)
    done = [Completion(t, merge_ranges(rs), 1, 5) for t, rs in sorted(run)]
    got = fast.complete_run(done)
    want = ref.complete_many([(c, ()) for c in done])
    assert got == want
    assert Side.state_of(fast) == Side.state_of(ref)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 30), max_size=12),
                          st.sampled_from([-2, -1, 1, 2])), max_size=12))
def test_update_ints_equals_update_iter(batches: list[tuple[list[int], int]]) -> None:
    """The MutableAntichain's run update: same frontier changes, counts and frontier."""
    from substreams.frontier import MutableAntichain

    fast, ref = MutableAntichain(), MutableAntichain()
    for ts, delta in batches:
        assert fast.update_ints(ts, delta) == ref.update_iter([(t, delta) for t in ts])
        assert fast.frontier() == ref.frontier()
        assert all(fast.count_for(t) == ref.count_for(t) for t in range(31))
        assert fast.is_empty() == ref.is_empty()


KEYS = ["k", "j", "m"]
keyed_times = st.builds(Keyed, st.sampled_from(KEYS), st.integers(0, 12))
kxors = st.sampled_from([0, 0, 1])  # an xor of 1 twice cancels: a time blocked, then not
KEYED_SOURCES = ["a", "a", "b"]


@st.composite
def session_op(draw: st.DrawFn) -> tuple[Any, ...]:
    """Weighted towards what moves a key (reports, seals, announcements): membership changes
    and reloads re-examine every key, which would hide a key the index forgot to look at."""
    kind = draw(st.sampled_from(
        ["report"] * 6 + ["announce"] * 4 + ["seal_keys"] * 3
        + ["seal", "register", "unregister", "reload"]
    ))
    if kind == "report":
        # A record id is reported at its own time (SND and RCV share it): one bit per
        # (key, time), so ids of different times never cancel.
        t = draw(keyed_times)
        assert type(t.time) is int
        x = draw(kxors) << (KEYS.index(t.key) * 16 + t.time)
        return (kind, t, x, draw(st.integers(0, 2)), draw(st.lists(ranges, max_size=2)))
    if kind == "seal_keys":
        return (kind, draw(st.sampled_from(KEYED_SOURCES)), draw(st.integers(0, 16)))
    if kind == "seal":
        return (kind, draw(st.sampled_from(KEYED_SOURCES)), draw(keyed_times),
                draw(st.integers(0, 9)))
    if kind == "register":
        return (kind, draw(st.sampled_from(SOURCES)), draw(st.sampled_from([SOURCE, STAGE])))
    if kind == "unregister":
        return (kind, draw(st.sampled_from(SOURCES)))
    return (kind,)


session_ops = session_op()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6), st.lists(session_ops, min_size=15, max_size=60))
def test_keyed_index_equals_reference_for_sessions(gap: int, steps: list[tuple[Any, ...]]) -> None:
    """Sessions: the keyed index (only the keys that may have changed are looked at)
    against the reference (every open time grouped by key at every step); several sources
    mixing keyed and per-key seals, stages, leaving and returning, reloads."""
    with mock.patch.object(core, "MAX_COMPLETIONS_PER_RECORD", 3):
        check_equivalent([("register", "a", SOURCE), ("register", "b", SOURCE), *steps], gap)


@settings(max_examples=300, deadline=None)
@given(st.lists(session_ops, min_size=15, max_size=60))
def test_keyed_index_equals_reference_for_keyed_times(steps: list[tuple[Any, ...]]) -> None:
    """Per-key substreams (keyed times, no gap): the same."""
    with mock.patch.object(core, "MAX_COMPLETIONS_PER_RECORD", 3):
        check_equivalent([("register", "a", SOURCE), ("register", "b", SOURCE), *steps])
