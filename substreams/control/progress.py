"""Writer-side frontiers of one substream: the bookkeeping behind every control record.

Both progress writers (the acker and the punctuation aligner) use this class, so a
subscriber sees the same protocol whichever mechanism produced it.  The lower frontier is
Strymon's "antichain of minimal elements in active" (active = seen, not yet complete); the
upper frontier holds the maximal times seen.  Lower-frontier changes are not written on
their own: they ride inside the next ``EpochComplete`` (or a ``FrontierUpdate`` on the
writer's heartbeat when nothing completes), so a completed time costs one control record --
or less: :meth:`ProgressTracker.complete_many` announces a run of times in one
``EpochsComplete``.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from substreams.control.messages import (
    Completion,
    ControlBody,
    EpochComplete,
    EpochsComplete,
    FrontierSnapshot,
    FrontierUpdate,
    OffsetRange,
    merge_ranges,
)
from substreams.frontier import (
    ChangeBatch,
    Keyed,
    MutableAntichain,
    Time,
    UpperAntichain,
    time_from_wire,
    time_to_wire,
)


def event_time(t: Time) -> Time:
    """A keyed time's event time (``Keyed(k, t)`` -> ``t``); any other time itself: what a
    session substream's published frontiers are made of (:class:`ProgressTracker`)."""
    return t.time if type(t) is Keyed else t


class ProgressTracker:
    """Frontiers of one substream as its writer publishes them.

    ``keyed_floor`` (session substreams): the published frontiers hold *event times*, not
    keyed times -- the lower frontier is the lowest event time of any open keyed time ("every
    key is complete below T"), the upper the highest event time seen.  Why: keyed times of
    different keys are incomparable, so their exact frontiers hold one element per open key,
    and a snapshot or update listed them all (1 MB at ~28k keys, O(keys) work per change for
    the writer and every reader).  The floor is exact as a statement about all keys and
    costs O(1) per change; a reader that needs one session's completion has its
    ``EpochComplete``.  Notifications still name keyed times; ``active`` holds them (so a
    time is activated and retired once), and the lower frontier counts them per event time.
    """

    def __init__(
        self, substream: str, snapshot_every: int = 100, *, keyed_floor: bool = False
    ) -> None:
        self.substream = substream
        self.snapshot_every = snapshot_every
        self.keyed_floor = keyed_floor
        self.lower = MutableAntichain()
        self.upper = UpperAntichain()
        self.active: set[Time] = set()
        self.completed = 0
        self.last_completed: Time | None = None
        self._pending = ChangeBatch()
        self.data_end: dict[tuple[str, int], int] = {}
        self.int_runs = True
        """Runs of int times are retired in bulk (False: one time at a time, the reference)."""
        self._keyed_upper: list[tuple[int, str]] = []
        """A heap of the retired ``Keyed(k, int)`` times that were elements of ``upper``, as
        (t, k): what :meth:`prune_keyed` may forget, found without a walk of every key (an
        active time is never in it; it may hold entries already gone from ``upper``)."""

    def restore_active(self, times: Iterable[Time]) -> None:
        """The active times are ``times`` (the acker's open times, after a restore from its
        changelog, which does not write them twice): the lower frontier and the prune heap
        rebuilt from them and ``upper``."""
        self.active = set(times)
        self.lower = MutableAntichain()
        floor = self.keyed_floor
        self.lower.update_iter([(event_time(t) if floor else t, 1) for t in self.active])
        self._keyed_upper = [
            (t.time, t.key) for t in self.upper
            if type(t) is Keyed and type(t.time) is int and t not in self.active
        ]
        heapq.heapify(self._keyed_upper)

    def use_keyed_floor(self) -> None:
        """Switch a tracker loaded from a checkpoint written before session substreams
        published event-time frontiers to :attr:`keyed_floor`: the per-key lower elements
        readers know are retired and the floor announced, in the next published change
        (readers apply changes idempotently, so unpublished ones consolidate away)."""
        if self.keyed_floor:
            return
        old = list(self.lower.frontier())
        self.keyed_floor = True
        self.lower = MutableAntichain()
        self.lower.update_iter([(event_time(t), 1) for t in self.active])
        self.upper = UpperAntichain(event_time(t) for t in self.upper)
        self._keyed_upper = []
        self._pending.extend([(t, -1) for t in old])
        self._pending.extend([(t, 1) for t in self.lower.frontier()])

    def activate(self, time: Time) -> None:
        """``time`` was seen (a record or a seal of it): it is active until completed."""
        if time in self.active:
            return
        self.active.add(time)
        if self.keyed_floor:
            time = event_time(time)
        self._pending.extend(self.lower.update_iter([(time, 1)]))
        self.upper.insert(time)

    def observe(self, time: Time) -> None:
        """``time`` was seen again, or joined an active time's session run without being
        active itself (the acker counts a session by its first time): only the upper
        frontier may move."""
        self.upper.insert(event_time(time) if self.keyed_floor else time)

    def rekey(self, old: Time, new: Time | None) -> None:
        """The active time ``old`` stands for a session run whose first time is now ``new``
        (a record before it joined it), or (``new`` None) that run was merged into the one
        before it: the lower frontier counts ``new`` instead of ``old``, or nothing.  Not
        a completion: no ``EpochComplete`` is owed for ``old``."""
        if old not in self.active:
            if new is not None:
                self.activate(new)
            return
        floor = self.keyed_floor
        self.active.discard(old)
        changes = [(event_time(old) if floor else old, -1)]
        if new is not None:
            self.active.add(new)
            changes.append((event_time(new) if floor else new, 1))
            self.upper.insert(event_time(new) if floor else new)
        self._pending.extend(self.lower.update_iter(changes))

    def activate_many(self, times: Sequence[Time]) -> None:
        """:meth:`activate` for each of ``times`` (a report block's new times), in one
        lower-frontier update when they are all ints.  Same result: the pending changes are
        the frontier's net change either way (consolidated), and inserting the highest int
        into the upper frontier is inserting each (an int covers the ints below it)."""
        if not self.int_runs or not all(type(t) is int for t in times):
            for t in times:
                self.activate(t)
            return
        active = self.active
        fresh = [t for t in times if t not in active]
        if not fresh:
            return
        active.update(fresh)
        ints: list[int] = fresh  # type: ignore[assignment]  # checked above
        self._pending.extend(self.lower.update_ints(ints, 1))
        self.upper.insert(max(ints))

    def complete(
        self,
        time: Time,
        ranges: Iterable[OffsetRange],
        records: int,
        sealed_at_ms: int,
        open_starts: Mapping[tuple[str, int], int] | None = None,
        *,
        until: Time | None = None,
        members: Iterable[Time] = (),
    ) -> list[ControlBody]:
        """The control records announcing that ``time`` is complete (plus a snapshot every
        ``snapshot_every`` completions; ``open_starts`` as for `snapshot`).  A session is
        announced as its first time with ``until`` its last; ``members`` are its times, all
        retired from the lower frontier with it."""
        merged = self._retire(time, ranges, members)
        out: list[ControlBody] = [
            EpochComplete(
                self.substream,
                time,
                merged,
                records,
                sealed_at_ms,
                tuple(self._pending.drain()),
                until,
            )
        ]
        if self.completed % self.snapshot_every == 0:
            out.append(self.snapshot(open_starts))
        return out

    def complete_many(
        self,
        done: Sequence[tuple[Completion, Iterable[Time]]],
        open_starts: Mapping[tuple[str, int], int] | None = None,
    ) -> list[ControlBody]:
        """Like :meth:`complete` for a run of times (each with its session ``members``), in
        the given order, announced in ONE record: an ``EpochComplete`` for a single time, an
        ``EpochsComplete`` otherwise; then a snapshot if the run crossed a multiple of
        ``snapshot_every`` (taken after the whole run, which is what a reader joining at it
        has seen)."""
        if len(done) == 1:
            c, members = done[0]
            return self.complete(c.time, c.ranges, c.records, c.sealed_at_ms, open_starts,
                                 until=c.until, members=members)
        before = self.completed // self.snapshot_every
        if self.keyed_floor and self.int_runs:
            epochs = self._retire_sessions(done)
        else:
            epochs = tuple(
                Completion(c.time, self._retire(c.time, c.ranges, members), c.records,
                           c.sealed_at_ms, c.until)
                for c, members in done
            )
        out: list[ControlBody] = [
            EpochsComplete(self.substream, epochs, tuple(self._pending.drain()))
        ]
        if self.completed // self.snapshot_every > before:
            out.append(self.snapshot(open_starts))
        return out

    def complete_run(
        self,
        done: Sequence[Completion],
        open_starts: Mapping[tuple[str, int], int] | None = None,
    ) -> list[ControlBody]:
        """:meth:`complete_many` for int times without session members whose ``ranges`` are
        already merged (one hull per data partition, sorted: what the acker's table gives),
        with the frontier bookkeeping once for the whole run instead of once per time.
        Same records as :meth:`complete_many` (the property tests compare them)."""
        if len(done) == 1 or not self.int_runs:
            return self.complete_many([(c, ()) for c in done], open_starts)
        before = self.completed // self.snapshot_every
        times = [c.time for c in done]
        active = self.active
        missing = [t for t in times if t not in active]
        if missing:  # retired without being seen: seen first, as _retire does
            self.activate_many(missing)
        active.difference_update(times)
        self._pending.extend(self.lower.update_ints(times, -1))  # type: ignore[arg-type]
        data_end = self.data_end
        for c in done:
            for r in c.ranges:
                key = (r.stream, r.partition)
                if r.end > data_end.get(key, 0):
                    data_end[key] = r.end
                elif key not in data_end:
                    data_end[key] = 0
        self.completed += len(done)
        self.last_completed = times[-1]
        out: list[ControlBody] = [
            EpochsComplete(self.substream, tuple(done), tuple(self._pending.drain()))
        ]
        if self.completed // self.snapshot_every > before:
            out.append(self.snapshot(open_starts))
        return out

    def _retire(
        self, time: Time, ranges: Iterable[OffsetRange], members: Iterable[Time]
    ) -> tuple[OffsetRange, ...]:
        """Account for ``time`` (and its session members) completing; its merged ranges."""
        retired = [time, *(m for m in members if m != time)]
        active, floor = self.active, self.keyed_floor
        for t in retired:
            if t not in active:
                self.activate(t)
            active.discard(t)
            # (an event-time upper frontier holds no keyed time: nothing to prune later)
            if not floor and type(t) is Keyed and type(t.time) is int and t in self.upper:
                heapq.heappush(self._keyed_upper, (t.time, t.key))
        if floor:
            retired = [event_time(t) for t in retired]
        self._pending.extend(self.lower.update_iter([(t, -1) for t in retired]))
        merged = merge_ranges(list(ranges))
        for r in merged:
            key = (r.stream, r.partition)
            self.data_end[key] = max(self.data_end.get(key, 0), r.end)
        self.completed += 1
        self.last_completed = time
        return merged

    def _retire_sessions(
        self, done: Sequence[tuple[Completion, Iterable[Time]]]
    ) -> tuple[Completion, ...]:
        """:meth:`_retire` for a run of completions of an event-time tracker, with one
        lower-frontier update for the run (the same net change as one per time: only the
        frontier's changes are published, and they consolidate)."""
        active = self.active
        lowered: list[tuple[Time, int]] = []
        data_end = self.data_end
        epochs: list[Completion] = []
        for c, members in done:
            for t in (c.time, *(m for m in members if m != c.time)):
                if t not in active:
                    self.activate(t)
                active.discard(t)
                lowered.append((event_time(t), -1))
            merged = merge_ranges(list(c.ranges))
            for r in merged:
                key = (r.stream, r.partition)
                data_end[key] = max(data_end.get(key, 0), r.end)
            epochs.append(Completion(c.time, merged, c.records, c.sealed_at_ms, c.until))
        self._pending.extend(self.lower.update_iter(lowered))
        self.completed += len(epochs)
        self.last_completed = epochs[-1].time
        return tuple(epochs)

    def prune_keyed(self, floor: int | None) -> None:
        """Forget upper-frontier keyed times at or below ``floor`` that are complete: every
        source promised nothing more there (the acker's keyed floor), so no reader needs
        them to filter; without this the upper frontier grows with every key ever seen."""
        if floor is None or len(self.upper) < 2:
            return
        if not self.int_runs:  # the reference: a walk of every element
            self.upper = self.upper.retain(
                lambda u: not (
                    type(u) is Keyed
                    and type(u.time) is int
                    and u.time <= floor
                    and u not in self.active
                )
            )
            return
        heap, upper = self._keyed_upper, self.upper
        while heap and heap[0][0] <= floor:
            t, key = heapq.heappop(heap)
            upper.discard(Keyed(key, t))

    def pending_update(self) -> FrontierUpdate | None:
        """Lower-frontier changes not yet published (for a heartbeat tick), if any."""
        if self._pending.is_empty():
            return None
        return FrontierUpdate(self.substream, tuple(self._pending.drain()))

    def snapshot(
        self, open_starts: Mapping[tuple[str, int], int] | None = None
    ) -> FrontierSnapshot:
        """Both frontiers now.  ``data_from`` per data partition: the earliest known start of
        an active time (``open_starts``), else the end of the completed data."""
        starts = dict(self.data_end)
        for key, start in (open_starts or {}).items():
            starts[key] = min(start, starts.get(key, start))
        data_from = tuple(OffsetRange(s, p, o, o) for (s, p), o in sorted(starts.items()))
        return FrontierSnapshot(self.substream, self.lower.frontier(), self.upper.copy(), data_from)

    # -- recovery ------------------------------------------------------------------------

    def to_state(self, light: bool = False) -> dict[str, Any]:
        """The checkpoint form; ``light``: without the active times and the upper frontier
        (the acker's changelog derives the first from its table and writes the second as it
        changes)."""
        return {
            "active": [] if light else [time_to_wire(t) for t in self.active],
            "upper": [] if light else [time_to_wire(t) for t in self.upper.elements()],
            "completed": self.completed,
            "last_completed": None
            if self.last_completed is None
            else time_to_wire(self.last_completed),
            "pending": [[time_to_wire(t), d] for t, d in self._pending.iter()],
            "data_end": [[s, p, o] for (s, p), o in self.data_end.items()],
            "keyed_floor": self.keyed_floor,
        }

    @classmethod
    def from_state(
        cls, substream: str, state: Mapping[str, Any], snapshot_every: int = 100
    ) -> ProgressTracker:
        floor = bool(state.get("keyed_floor", False))
        tracker = cls(substream, snapshot_every, keyed_floor=floor)
        for wire in state["active"]:
            t = time_from_wire(wire)
            tracker.active.add(t)
            tracker.lower.update_iter([(event_time(t) if floor else t, 1)])
        for wire in state["upper"]:
            t = time_from_wire(wire)
            tracker.upper.insert(t)
            if type(t) is Keyed and type(t.time) is int and t not in tracker.active:
                tracker._keyed_upper.append((t.time, t.key))
        heapq.heapify(tracker._keyed_upper)
        tracker.completed = int(state["completed"])
        lc = state.get("last_completed")
        tracker.last_completed = None if lc is None else time_from_wire(lc)
        for wire, delta in state.get("pending", ()):
            tracker._pending.update(time_from_wire(wire), int(delta))
        tracker.data_end = {(s, int(p)): int(o) for s, p, o in state.get("data_end", ())}
        return tracker

    def dumps(self) -> str:
        return json.dumps(self.to_state(), sort_keys=True)
