"""The trAcker's bookkeeping for one segment: XOR tables per time and the termination rule.

Pure (no Kafka, no clock): the service feeds it decoded acks and asks which times terminate,
so the rule is unit-testable with hypothesis and the state is a plain JSON-able value that
goes into the acker's checkpoint.

A *segment* is one substream with mechanism ``acker``: its stream plus, transitively, the
outputs of the configured stages that read a stream of the segment (a stage may write back
to its own input: a cycle).  A stream of the segment is *terminal* when no stage of the
segment reads it: its Kafka topic is the sink, so its writer reports RCV on delivery and
the notification's offset ranges name exactly the terminal streams' records.

Per open time the table keeps the XOR of every SND/RCV reported, the records delivered to
terminal streams, the hull of their offsets per partition, when it was first seen and when
the last seal covering it arrived.  Per registered source it keeps the seal antichain (a
seal of ``t`` promises no more records at times ``<= t``: seals are downward closed, so an
:class:`UpperAntichain` summarises them).  Time ``t`` terminates when

1. every registered SOURCE covers ``t`` (stages do not seal; a source that unregistered no
   longer counts; before the first source registered nothing terminates),
2. ``xor(t) == 0`` (every record sent at ``t`` was received), and
3. every open time ``t' < t`` terminated — so the order is consistent by construction.

Session segments (``gap_ms`` set) terminate *sessions*, not times: records carry
``Keyed(key, event_ts)`` and the open times of one key are cut into runs whose neighbours are
at most ``gap_ms`` apart (:mod:`substreams.frontier.sessions`).  The first run ``[s, e]`` of a
key terminates when every registered source covers ``Keyed(key, e + gap_ms)`` (no record can
join it any more) and every time of the run has ``xor == 0``; its termination is announced
as ``Keyed(key, s)`` with ``until = Keyed(key, e)``.  A source covers a keyed time by an
explicit seal of that key or by a *keyed seal* ("every key's times up to event time T"),
which also covers keys it never wrote: that is how several sources sharing keys close them.

Bounded state: what grows with every key ever seen (the terminated antichain, a source's
per-key seals) is pruned once every registered source's keyed seal covers it -- the *keyed
floor* (:meth:`SegmentTable.keyed_floor`).  A keyed time at or below the floor that is not
open is treated as terminated (a report for it is late: every source promised none), so
forgetting it cannot reopen it.  The highest floor anything was forgotten at is kept
(:attr:`SegmentTable.forgotten`): a source that registers later lowers the floor, but what
was forgotten stays final.

A time known only from a seal ("a sealed time closes whether or not data arrived") is an
open time too.  Simultaneous terminations are emitted in :func:`sort_key` order, a linear
extension of the partial order.  Reports for a time that already terminated (anything at or
below the maximal terminated times) are protocol violations: the caller dead-letters them.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any

from sortedcontainers import SortedList

from substreams.acker.protocol import SOURCE as SOURCE  # the roles are the protocol's
from substreams.acker.protocol import STAGE as STAGE
from substreams.config import Config
from substreams.control.messages import OffsetRange, offset_range
from substreams.frontier import (
    Keyed,
    Time,
    UpperAntichain,
    less_equal,
    less_than,
    sort_key,
    time_from_wire,
    time_to_wire,
)
from substreams.frontier.antichain import chain_class
from substreams.frontier.sessions import by_key, run_members

_INT_CLASS = chain_class(0)

TIMES_PER_STEP = 4096
"""Open times one step may close, per table (:attr:`SegmentTable.times_per_step`; a key's
closable sessions are closed together, so a step may close a little more): at ~20 us a time
(the table, the announcement, the changelog entry) under 100 ms.  Counted in times, not
sessions: a session of 100 records costs 100 times what one of one record does."""


def _the_int(elements: tuple[Time, ...]) -> int | None:
    """The element of an antichain's int class (:meth:`UpperAntichain.of_class`), if any."""
    e = elements[0] if elements else None
    return e if type(e) is int else None

# -- topology -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """The streams one acker substream tracks, and which of them are terminal."""

    substream: str
    streams: frozenset[str]
    terminal: frozenset[str]

    @staticmethod
    def of(config: Config, substream: str) -> Segment:
        root = config.substream(substream).stream
        streams = {root}
        changed = True
        while changed:
            changed = False
            for stage in config.stages:
                if stage.input in streams and stage.output not in streams:
                    streams.add(stage.output)
                    changed = True
        read = {st.input for st in config.stages if st.input in streams}
        return Segment(substream, frozenset(streams), frozenset(streams - read))


def acker_segments(config: Config) -> dict[str, Segment]:
    """Every substream tracked by the acker, by name (config order)."""
    return {s.name: Segment.of(config, s.name) for s in config.substreams if s.mechanism == "acker"}


def _at_or_below(t: Time, floor: int) -> bool:
    """``t`` is a keyed event time at or below the keyed floor ``floor``."""
    return type(t) is Keyed and type(t.time) is int and t.time <= floor


def _not_keyed_covered(state: SourceState, t: Time) -> bool:
    return not state._keyed_covers(t)


def _per_key_seals(state: SourceState) -> dict[str, int]:
    """A source's highest explicit seal per key, of the keyed seals with an int time."""
    out: dict[str, int] = {}
    for e in state.seals.elements():
        if type(e) is Keyed and type(e.time) is int and e.time > out.get(e.key, e.time - 1):
            out[e.key] = e.time
    return out


# -- the table ------------------------------------------------------------------------------


def _offset_ranges(
    streams: Sequence[str],
    stream_index: Sequence[int],
    partitions: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
) -> list[OffsetRange]:
    """A block's range columns as ranges (the reference path)."""
    return [OffsetRange(streams[i], p, lo, hi)
            for i, p, lo, hi in zip(stream_index, partitions, starts, ends, strict=True)]


@dataclass(slots=True)
class OpenEntry:
    """What is known about one open (not yet terminated) time."""

    xor: int = 0
    records: int = 0
    reports: int = 0
    ranges: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    first_seen_ms: int = 0
    sealed_at_ms: int = 0

    def add_ranges(self, ranges: Iterable[OffsetRange]) -> None:
        for r in ranges:
            key = (r.stream, r.partition)
            hull = self.ranges.get(key)
            if hull is None:
                self.ranges[key] = [r.start, r.end]
            else:
                if r.start < hull[0]:
                    hull[0] = r.start
                if r.end > hull[1]:
                    hull[1] = r.end

    def offset_ranges(self) -> tuple[OffsetRange, ...]:
        """The hulls, one per (stream, partition), sorted: already merged
        (:func:`~substreams.control.messages.merge_ranges` returns them unchanged).  Built
        here, once per time, since ranges arrive as columns (``AckBlock``), not objects."""
        if len(self.ranges) == 1:  # the common case: one data partition per time
            for (s, p), (lo, hi) in self.ranges.items():
                return (offset_range(s, p, lo, hi),)
        return tuple(offset_range(s, p, lo, hi) for (s, p), (lo, hi) in sorted(self.ranges.items()))


def new_entry(first_seen_ms: int) -> OpenEntry:
    """``OpenEntry(first_seen_ms=...)`` without the generated ``__init__``'s keyword call,
    defaults and ``ranges`` factory: one is made per newly open time, in the acker's hot
    loop.  Keep in step with the fields."""
    e = _new_object(OpenEntry)
    e.xor = 0
    e.records = 0
    e.reports = 0
    e.ranges = {}
    e.first_seen_ms = first_seen_ms
    e.sealed_at_ms = 0
    return e


_new_object = object.__new__


def open_entry(
    xor: int, records: int, reports: int, ranges: dict[tuple[str, int], list[int]],
    first_seen_ms: int, sealed_at_ms: int, last: int | None,
) -> OpenEntry:
    """An entry as a checkpoint or changelog holds it: a :class:`RunEntry` when it has a
    ``last`` (a session run), else an :class:`OpenEntry`."""
    if last is None:
        return OpenEntry(xor, records, reports, ranges, first_seen_ms, sealed_at_ms)
    run = new_run(last, first_seen_ms)
    run.xor, run.records, run.reports, run.ranges = xor, records, reports, ranges
    run.sealed_at_ms = sealed_at_ms
    return run


_PARTS: dict[tuple[str, int], tuple[str, int]] = {}
"""One ``(stream, partition)`` tuple per data partition, shared by every run's hull."""


class RunEntry(OpenEntry):
    """An open *session run* of a session table: its members' entries merged (xor, counts,
    offset hulls, the earliest ``first_seen_ms``) and its last time; the table keys it by its
    first time.  Why: one entry per open session, not one per (key, event time) -- the
    acker's memory, changelog and close rate go with the sessions, not the records.  The
    termination rule needs no member's own xor: a run's xor is the XOR of every record id
    sent and received at its times, zero when each member's is (up to the 2^-64 chance of
    ids cancelling, the same as within one time: trAcker's own argument).

    The hull of the first data partition the run has records in is kept inline (``part``,
    ``lo``, ``hi``), the others' in ``more`` (a session's records usually lie in one
    partition: its key's): ``ranges`` is a fresh dict built from them, to read, not to
    write into -- a dict per run cost ~300 bytes of a session's ~1 KB."""

    __slots__ = ("hi", "last", "lo", "more", "part")

    last: int
    part: tuple[str, int] | None
    lo: int
    hi: int
    more: dict[tuple[str, int], list[int]] | None

    def __init__(self, last: int) -> None:
        super().__init__()
        self.last = last
        self.part, self.lo, self.hi, self.more = None, 0, 0, None

    @property  # type: ignore[override]
    def ranges(self) -> dict[tuple[str, int], list[int]]:
        out = {} if self.part is None else {self.part: [self.lo, self.hi]}
        if self.more:
            out.update(self.more)
        return out

    @ranges.setter
    def ranges(self, value: Mapping[tuple[str, int], Sequence[int]]) -> None:
        self.part, self.more = None, None
        for key, (lo, hi) in value.items():
            self.add_hull(key, lo, hi)

    def add_hull(self, key: tuple[str, int], lo: int, hi: int) -> bool:
        """Widen the hull of ``key`` by ``[lo, hi)``; True iff its start moved (or it is new):
        what the table's start heaps must hear of."""
        part = self.part
        if part is None:
            self.part = _PARTS.setdefault(key, key)
            self.lo, self.hi = lo, hi
            return True
        if part == key:
            if hi > self.hi:
                self.hi = hi
            if lo < self.lo:
                self.lo = lo
                return True
            return False
        more = self.more
        if more is None:
            self.more = {_PARTS.setdefault(key, key): [lo, hi]}
            return True
        hull = more.get(key)
        if hull is None:
            more[_PARTS.setdefault(key, key)] = [lo, hi]
            return True
        if hi > hull[1]:
            hull[1] = hi
        if lo < hull[0]:
            hull[0] = lo
            return True
        return False

    def add_ranges(self, ranges: Iterable[OffsetRange]) -> None:
        for r in ranges:
            self.add_hull((r.stream, r.partition), r.start, r.end)

    def offset_ranges(self) -> tuple[OffsetRange, ...]:
        part = self.part
        if part is None:
            return ()
        if not self.more:
            return (offset_range(part[0], part[1], self.lo, self.hi),)
        return tuple(offset_range(s, p, lo, hi) for (s, p), (lo, hi) in sorted(self.ranges.items()))

    def starts(self) -> list[tuple[tuple[str, int], int]]:
        """Per data partition, where the run's records begin."""
        if self.part is None:
            return []
        out = [(self.part, self.lo)]
        if self.more:
            out.extend((key, hull[0]) for key, hull in self.more.items())
        return out


def new_run(last: int, first_seen_ms: int) -> RunEntry:
    """:func:`new_entry` for a run ending at ``last``."""
    e = _new_object(RunEntry)
    e.xor = 0
    e.records = 0
    e.reports = 0
    e.first_seen_ms = first_seen_ms
    e.sealed_at_ms = 0
    e.last = last
    e.part = None
    e.lo = e.hi = 0
    e.more = None
    return e


def _keyed_order(term: Termination) -> tuple[str, int]:
    """:func:`sort_key` order for terminations of ``Keyed(k, int)`` times (the key, then the
    time: what ``sort_key`` compares for them), without building the whole key."""
    t: Keyed = term.time  # type: ignore[assignment]
    return t.key, t.time  # type: ignore[return-value]


def _start_in(e: OpenEntry, part: tuple[str, int]) -> int | None:
    """Where ``e``'s records begin in data partition ``part`` (None: none there)."""
    if type(e) is RunEntry:
        if e.part == part:
            return e.lo
        hull = None if e.more is None else e.more.get(part)
    else:
        hull = e.ranges.get(part)
    return None if hull is None else hull[0]


def merge_into(into: OpenEntry, other: OpenEntry) -> None:
    """Fold ``other``'s accounting into ``into`` (two runs joined by a time between them)."""
    into.xor ^= other.xor
    into.records += other.records
    into.reports += other.reports
    into.add_ranges(other.offset_ranges())
    into.first_seen_ms = min(into.first_seen_ms, other.first_seen_ms)
    into.sealed_at_ms = max(into.sealed_at_ms, other.sealed_at_ms)


@dataclass
class SourceState:
    """A registered process: its role and (for sources) what it sealed and when."""

    role: str
    seals: UpperAntichain = field(default_factory=UpperAntichain)
    seal_ms: dict[Time, int] = field(default_factory=dict)
    active: bool = True
    keys_upto: int | None = None
    """The keyed seal: no more records at ``Keyed(k, t)``, ``t <= keys_upto``, for any ``k``."""
    keys_upto_ms: int = 0
    waiting: list[tuple[int, str]] = field(default_factory=list, repr=False)
    """A heap of (event time, key): keys whose next session (or time) waits for this
    source's keyed seal to reach that time (:meth:`SegmentTable._close_key`).  Derived, not
    in the checkpoint: a loaded table re-examines every key once."""
    key_seals: list[tuple[int, str]] = field(default_factory=list, repr=False)
    """A heap of the per-key seals ``Keyed(k, t)`` (int ``t``) as (t, k): what
    :meth:`SegmentTable.prune` forgets once the keyed seal covers them, without a walk of
    every key's seal.  Derived (may hold entries already gone from ``seals``)."""

    def _keyed_covers(self, t: Time) -> bool:
        return (
            self.keys_upto is not None
            and type(t) is Keyed
            and type(t.time) is int
            and t.time <= self.keys_upto
        )

    def covers(self, t: Time) -> bool:
        return self._keyed_covers(t) or self.seals.covers(t)

    def int_seal(self) -> int | None:
        """The source's highest int seal (it covers the int times up to it), if any."""
        return _the_int(self.seals.of_class(_INT_CLASS))

    def covered_at(self, t: Time) -> int:
        """When this source's seals first covered ``t`` (as far as the antichain remembers).
        Only seals of ``t``'s chain class can cover it: looked up there, not in every key's."""
        if not self.seal_ms and self._keyed_covers(t):  # only the keyed seal (the usual case)
            return self.keys_upto_ms
        seal_ms = self.seal_ms
        times = [
            ms for s in self.seals.of_class(chain_class(t))
            if (ms := seal_ms.get(s)) is not None and less_equal(t, s)
        ]
        if self._keyed_covers(t):
            times.append(self.keys_upto_ms)
        return min(times) if times else 0

    def index_seals(self) -> None:
        """Rebuild :attr:`key_seals` from ``seals`` (after a load)."""
        self.key_seals = [
            (e.time, e.key) for e in self.seals
            if type(e) is Keyed and type(e.time) is int
        ]
        heapq.heapify(self.key_seals)


@dataclass(frozen=True)
class Termination:
    """A time that terminated: what its EpochComplete announces."""

    substream: str
    time: Time
    ranges: tuple[OffsetRange, ...]
    records: int
    sealed_at_ms: int
    first_seen_ms: int
    until: Time | None = None
    """A session's last time (``time`` is its first); None for a single time."""
    members: tuple[Time, ...] = ()
    """Every open time the termination retired (a session's times; else just ``time``)."""


class Violation(Exception):
    """A report that breaks the protocol (the service dead-letters the message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SegmentTable:
    """XOR tables, sources and seals of one segment."""

    def __init__(self, substream: str, gap_ms: int | None = None) -> None:
        self.substream = substream
        self.gap_ms = gap_ms
        """Set for a session substream: terminate sessions of keyed times (module doc)."""
        self.open: dict[Time, OpenEntry] = {}
        self.sources: dict[str, SourceState] = {}
        self.had_source = False
        self.terminated = UpperAntichain()
        self.forgotten: int | None = None
        """The highest keyed floor at which :meth:`prune` forgot terminated keyed times: a
        keyed time at or below it that is not open is final even once the floor is lower
        again (a source registered since), so forgetting never reopens a time or a session."""
        self.dirty = False
        self.int_runs = True
        """Plain int times take the per-run path (False: the generic reference algorithm)."""
        # Indexes of ``open`` for the per-run path (kept on both paths; rebuilt by
        # from_state).  Invariants: ``_ints`` is the sorted list of the open int times;
        # ``_nonzero`` the open int times whose xor is not 0; ``_others`` the number of open
        # times that are not ints.  Every change of ``open`` goes through _entry (adds) and
        # the termination methods (removes); every xor change through report/report_block.
        self._ints: list[int] = []
        self._nonzero: set[int] = set()
        self._others = 0
        # The keyed index (module doc, "keyed times at scale"): the open ``Keyed(k, int)``
        # times per key, sorted (``_keyed``) and by event time over all keys
        # (``_by_time``: what a keyed seal newly covers, by a range query); the keys to
        # re-examine (``_kdirty``: a report, a per-key seal, a keyed seal reaching what
        # the key waits for; ``_kall``: every key, after a load or a membership change);
        # the terminated keyed times by event time (``_term_heap``, for prune).
        # Invariants: ``_keyed[k]`` is the sorted inner times of the open ``Keyed(k, int)``
        # times, no list is empty; ``_by_time`` holds exactly (t, k) for each of them;
        # ``_nkeyed`` is their number.  A key none of whose open times terminates now is in
        # ``_kdirty``, or ``_kall`` is set, or it waits in the heap of a source whose keyed
        # seal does not cover its next bound, or its next time has a nonzero xor (a report
        # dirties it), or a source without a keyed seal blocks it (a per-key seal or that
        # source's first keyed seal dirties it).
        self._keyed: dict[str, list[int]] = {}
        self._by_time: SortedList = SortedList()
        self._nkeyed = 0
        self._kdirty: dict[str, None] = {}  # an insertion-ordered set: first dirtied, first seen
        self._kall = False
        self._term_heap: list[tuple[int, str]] = []
        self._starts: dict[tuple[str, int], list[tuple[int, str, int]]] = {}
        """Per data partition, a heap of (offset, key, event time): where an open keyed time's
        records begin there (lazily: an entry whose time closed or whose hull starts lower
        now is passed over), so :meth:`open_starts` does not walk every open session."""
        self.times_per_step: int | None = TIMES_PER_STEP
        """How many open times one :meth:`termination_runs` closes at most (None: no bound),
        looking at 16 times as many keys at most; the rest wait for the next step, which the
        table's ``dirty`` asks for.  Why: a keyed seal may close a million sessions at once,
        and no step may hold the acker longer than its heartbeat (a standby would take a live
        acker for dead)."""
        self.touched: set[Time] | None = None
        """With :meth:`track_open`: the times whose entry was added, changed or removed
        since the changelog last drained it (:mod:`substreams.acker.changelog`)."""
        self.rekeyed: list[tuple[Time, Time | None]] = []
        """Session runs (:class:`RunEntry`) whose first time changed since the caller last
        drained this: ``(old, new)`` when a record before a run joined it, ``(old, None)``
        when a record between two runs merged the later one into the earlier.  The progress
        tracker counts a run by its first time (:meth:`ProgressTracker.rekey`)."""

    @property
    def runs(self) -> bool:
        """Open keyed times are kept as session runs (:class:`RunEntry`): a session table on
        the per-run path.  The reference path keeps one entry per time."""
        return self.gap_ms is not None and self.int_runs

    def track_open(self) -> None:
        """Record from now on which open times change (:attr:`touched`)."""
        if self.touched is None:
            self.touched = set()

    # -- membership ----------------------------------------------------------------------

    def register(self, source: str, role: str) -> None:
        """A process joins; a returning source keeps the seals it made before."""
        state = self.sources.get(source)
        if state is None:
            self.sources[source] = SourceState(role)
        else:
            state.role = role
            state.active = True
        if role == SOURCE:
            self.had_source = True
        self.dirty = True
        self._kall = True  # a role change may unblock a key: every key is looked at again

    def unregister(self, source: str) -> None:
        """A process leaves: as if it sealed everything (it no longer counts)."""
        state = self.sources.get(source)
        if state is not None:
            state.active = False
            state.waiting = []
        self.dirty = True
        self._kall = True

    def is_registered(self, source: str) -> bool:
        state = self.sources.get(source)
        return state is not None and state.active

    def is_active_source(self, source: str) -> bool:
        """Registered with role SOURCE: a process whose seals this table waits for."""
        state = self.sources.get(source)
        return state is not None and state.active and state.role == SOURCE

    # -- reports -------------------------------------------------------------------------

    def keyed_floor(self) -> int | None:
        """The lowest keyed seal of the registered sources: every source promised no record
        at ``Keyed(k, t)``, ``t <= floor``, for any key.  None while some source has none."""
        floor: int | None = None
        for s in self.sources.values():
            if s.role == SOURCE and s.active:
                if s.keys_upto is None:
                    return None
                floor = s.keys_upto if floor is None else min(floor, s.keys_upto)
        return floor

    def _below_floor(self, t: Time) -> bool:
        """``t`` is a keyed time at or below the keyed floor, or at or below the highest floor
        :meth:`prune` forgot terminated times at (a source that registers later lowers the
        floor, but what was forgotten stays final)."""
        if type(t) is not Keyed or type(t.time) is not int:
            return False  # the floor (a walk over the sources) only for keyed times
        forgotten = self.forgotten
        if forgotten is not None and t.time <= forgotten:
            return True
        floor = self.keyed_floor()
        return floor is not None and t.time <= floor

    def prune(self) -> None:
        """Forget what no report can touch any more (module doc, "bounded state"): terminated
        keyed times and per-key seals at or below the keyed floor / the source's own keyed
        seal.  Called after terminations; cheap when there is nothing keyed."""
        floor = self.keyed_floor()
        if not self.int_runs:  # the reference: a walk of every terminated time and seal
            self._prune_by_walk(floor)
            return
        if floor is not None and len(self.terminated) > 1:
            # = retain(not _at_or_below(u, floor)): every keyed int element has a heap entry
            heap, terminated = self._term_heap, self.terminated
            while heap and heap[0][0] <= floor:
                t, key = heapq.heappop(heap)
                terminated.discard(Keyed(key, t))
            if self.forgotten is None or floor > self.forgotten:
                self.forgotten = floor
        for state in self.sources.values():
            upto = state.keys_upto
            if upto is not None and len(state.seals) > 1:
                heap, seals, seal_ms = state.key_seals, state.seals, state.seal_ms
                while heap and heap[0][0] <= upto:
                    t, key = heapq.heappop(heap)
                    u = Keyed(key, t)
                    if seals.discard(u):
                        seal_ms.pop(u, None)

    def _prune_by_walk(self, floor: int | None) -> None:
        """:meth:`prune` as the reference: a walk of every terminated time and seal."""
        if floor is not None and len(self.terminated) > 1:
            self.terminated = self.terminated.retain(lambda u: not _at_or_below(u, floor))
            if self.forgotten is None or floor > self.forgotten:
                self.forgotten = floor
        for state in self.sources.values():
            if state.keys_upto is not None and len(state.seals) > 1:
                keep = state.seals.retain(partial(_not_keyed_covered, state))
                if len(keep) != len(state.seals):
                    state.seals = keep
                    state.seal_ms = {u: ms for u, ms in state.seal_ms.items() if u in keep}

    def _late(self, t: Time) -> Violation:
        """The violation of a report for ``t``, which already terminated."""
        return Violation(
            f"substream '{self.substream}': report for time {t!r}, which already terminated"
        )

    def _check_open(self, t: Time) -> None:
        if t not in self.open and (self.terminated.covers(t) or self._below_floor(t)):
            if self.gap_ms is not None and self._inside_open_session(t):
                return  # its session is still open: the record joins it (rule as for runs)
            raise self._late(t)

    def _inside_open_session(self, t: Time) -> bool:
        """``t`` lies between the first and last time of an open session of its key (the
        reference: the key's open times cut into runs)."""
        if type(t) is not Keyed or type(t.time) is not int:
            return False
        x, gap = t.time, self.gap_ms or 0
        times = by_key(u for u in self.open if type(u) is Keyed and u.key == t.key)
        return any(run[0] <= x <= run[-1] for run in run_members(times.get(t.key, []), gap))

    def _entry(self, t: Time, now_ms: int) -> tuple[OpenEntry, bool]:
        entry = self.open.get(t)
        if entry is not None:
            return entry, False
        entry = new_entry(now_ms)
        if self.gap_ms is None:  # a session's sealed-at is its bound's (_session_termination)
            sealed = [
                s.covered_at(t) for s in self.sources.values()
                if s.role == SOURCE and s.covers(t)
            ]
            entry.sealed_at_ms = max(sealed, default=0)
        self.open[t] = entry
        self._index(t)
        if self.touched is not None:
            self.touched.add(t)
        return entry, True

    def _touch(self, times: Iterable[Time]) -> None:
        if self.touched is not None:
            self.touched.update(times)

    def _index(self, t: Time) -> None:
        """Add a new open time to the indexes (its xor is still 0)."""
        if type(t) is int:
            ints = self._ints
            if not ints or t > ints[-1]:
                ints.append(t)
            else:
                insort(ints, t)
        else:
            self._others += 1
            if type(t) is Keyed and type(t.time) is int:
                key, inner = t.key, t.time
                times = self._keyed.get(key)
                if times is None:
                    self._keyed[key] = [inner]
                elif inner > times[-1]:
                    times.append(inner)
                else:
                    insort(times, inner)
                if self.gap_ms is None:  # a keyed seal's sealed-at look-up (not sessions)
                    self._by_time.add((inner, key))
                self._nkeyed += 1
                self._kdirty[key] = None

    def _unindex_keyed(self, key: str, inners: Sequence[int]) -> None:
        """Remove ``Keyed(key, t)``, t in ``inners`` (closed: no longer open), from the keyed
        index (the caller removes them from ``open`` and counts ``_others``)."""
        times = self._keyed[key]
        if len(inners) == len(times):
            del self._keyed[key]
        elif list(inners) == times[:len(inners)]:  # the usual case: the key's first times
            del times[:len(inners)]
        else:
            gone = set(inners)
            self._keyed[key] = [x for x in times if x not in gone]
        if self.gap_ms is None:
            by_time = self._by_time
            for inner in inners:
                by_time.remove((inner, key))
        self._nkeyed -= len(inners)

    def _closed_keyed(self, t: Time) -> None:
        """``t`` terminated: into ``terminated`` (with its prune-heap entry if keyed)."""
        self.terminated.insert(t)
        if type(t) is Keyed and type(t.time) is int:
            heapq.heappush(self._term_heap, (t.time, t.key))

    def open_starts(self) -> dict[tuple[str, int], int]:
        """Per data partition, the earliest offset of a record of a still-open time (what a
        snapshot's ``data_from`` says).  Keyed times from their heaps; the others (ints, in
        a table that rarely holds many) by a walk."""
        starts: dict[tuple[str, int], int] = {}
        open_ = self.open
        if self._nkeyed:
            for key, heap in list(self._starts.items()):
                while heap:
                    lo, k, x = heap[0]
                    e = open_.get(Keyed(k, x))
                    if e is not None and _start_in(e, key) == lo:
                        break
                    heapq.heappop(heap)
                if heap:
                    starts[key] = heap[0][0]
                else:
                    del self._starts[key]
        if len(open_) > self._nkeyed:
            for t, entry in open_.items():
                if type(t) is Keyed and type(t.time) is int:
                    continue
                for key, (lo, _) in entry.ranges.items():
                    if lo < starts.get(key, lo + 1):
                        starts[key] = lo
        return starts

    def _index_starts(self) -> None:
        """Rebuild the start heaps from the open keyed times (after a load)."""
        starts: dict[tuple[str, int], list[tuple[int, str, int]]] = {}
        for u, e in self.open.items():
            if type(u) is Keyed and type(u.time) is int:
                for key, (lo, _) in e.ranges.items():
                    starts.setdefault(key, []).append((lo, u.key, u.time))
        for heap in starts.values():
            heapq.heapify(heap)
        self._starts = starts

    def reindexed(self) -> None:
        """Rebuild every index from ``open``, ``terminated`` and the seals (after they were
        filled in from a changelog)."""
        self._reindex()
        self.dirty = True

    def _fold_runs(self) -> None:
        """Per-time entries of a session table as runs (a checkpoint written before runs, or
        a table filled in by the reference path): each key's open times cut by ``gap``, each
        run's entries merged into one :class:`RunEntry` keyed by its first time."""
        gap = self.gap_ms or 0
        per_key: dict[str, list[tuple[int, OpenEntry]]] = {}
        for t, e in self.open.items():
            if type(t) is Keyed and type(t.time) is int:  # (a session table holds no other)
                per_key.setdefault(t.key, []).append((t.time, e))
        folded: dict[Time, OpenEntry] = {}
        for key, items in per_key.items():
            items.sort(key=lambda item: item[0])
            run: RunEntry | None = None
            for x, e in items:
                last = e.last if type(e) is RunEntry else x
                if run is not None and x - run.last <= gap:
                    merge_into(run, e)
                    run.last = max(run.last, last)
                    continue
                run = new_run(last, e.first_seen_ms)
                merge_into(run, e)
                folded[Keyed(key, x)] = run
        self.open = folded

    def _reindex(self) -> None:
        """Rebuild the indexes from ``open`` (after a load or a generic termination)."""
        if self.runs and any(type(e) is not RunEntry for e in self.open.values()):
            self._fold_runs()
        self._ints = sorted(t for t in self.open if type(t) is int)
        self._nonzero = {t for t in self._ints if self.open[t].xor}
        self._others = len(self.open) - len(self._ints)
        keyed: dict[str, list[int]] = {}
        for t in self.open:
            if type(t) is Keyed and type(t.time) is int:
                keyed.setdefault(t.key, []).append(t.time)
        for times in keyed.values():
            times.sort()
        self._keyed = keyed
        self._by_time = SortedList(
            () if self.gap_ms is not None
            else ((x, k) for k, times in keyed.items() for x in times)
        )
        self._nkeyed = sum(len(times) for times in keyed.values())
        self._kdirty = {}
        self._kall = True
        self._term_heap = [
            (t.time, t.key) for t in self.terminated
            if type(t) is Keyed and type(t.time) is int
        ]
        heapq.heapify(self._term_heap)
        for state in self.sources.values():
            state.index_seals()
            state.waiting = []
        self._index_starts()

    def report(
        self,
        t: Time,
        xor: int,
        records: int,
        reports: int,
        ranges: Iterable[OffsetRange],
        now_ms: int,
    ) -> bool:
        """Apply one aggregated entry; True iff ``t`` was not known before (newly open).
        Raises :class:`Violation` for a time that already terminated, and for a session
        substream's time that is not ``Keyed(key, event_ms)``."""
        if self.gap_ms is not None and not (type(t) is Keyed and type(t.time) is int):
            raise Violation(
                f"substream '{self.substream}' is a session substream: times must be "
                f"Keyed(key, event_ms), got {t!r}"
            )
        if self.runs:
            return self._report_run(t, xor, records, reports, ranges, now_ms)  # type: ignore[arg-type]
        self._check_open(t)
        entry, new = self._entry(t, now_ms)
        entry.xor ^= xor
        if type(t) is int:
            if entry.xor:
                self._nonzero.add(t)
            else:
                self._nonzero.discard(t)
        elif type(t) is Keyed:
            self._kdirty[t.key] = None
        entry.records += records
        entry.reports += reports
        entry.add_ranges(ranges)
        self.dirty = True
        if self.touched is not None:
            self.touched.add(t)
        if type(t) is Keyed and entry.ranges and type(t.time) is int:
            for part, (lo, _) in entry.ranges.items():
                self._push_start(part, lo, t.key, t.time)
        return new

    def _report_run(
        self,
        t: Keyed,
        xor: int,
        records: int,
        reports: int,
        ranges: Iterable[OffsetRange],
        now_ms: int,
    ) -> bool:
        """:meth:`report` into a session table's runs (:class:`RunEntry`): the time joins
        the run it lies in or within ``gap`` of (extending it, or merging the two runs it
        joins), or opens a run of its own (True).  Same runs as cutting the open times at
        every step (:func:`~substreams.frontier.sessions.run_members`): adding a time only
        ever joins runs, and a run's entry is its members' merged."""
        key, x = t.key, t.time
        assert type(x) is int
        gap = self.gap_ms or 0
        open_ = self.open
        starts = self._keyed.get(key)
        i = -1 if starts is None else bisect_right(starts, x) - 1
        left: RunEntry | None = None
        if starts is not None and i >= 0:
            left = open_[Keyed(key, starts[i])]  # type: ignore[assignment]
        new = restart = False
        touched = self.touched
        if left is not None and x <= left.last:
            entry: RunEntry = left
            run = Keyed(key, starts[i])  # type: ignore[index]
        else:
            if self.terminated.covers(t) or self._below_floor(t):
                raise self._late(t)
            right = None if starts is None or i + 1 >= len(starts) else starts[i + 1]
            joins_left = left is not None and x - left.last <= gap
            joins_right = right is not None and right - x <= gap
            if joins_left and joins_right:  # t bridges two runs: the later one merges in
                assert left is not None and starts is not None and right is not None
                gone = Keyed(key, right)
                later: RunEntry = open_.pop(gone)  # type: ignore[assignment]
                merge_into(left, later)
                left.last = later.last
                del starts[i + 1]
                self._others -= 1
                self._nkeyed -= 1
                self.rekeyed.append((gone, None))
                if touched is not None:
                    touched.add(gone)
                entry, run, restart = left, Keyed(key, starts[i]), True
            elif joins_left:
                assert left is not None and starts is not None
                left.last = x
                entry, run = left, Keyed(key, starts[i])
            elif joins_right:  # t comes first in the run after it: the run's key moves
                assert starts is not None and right is not None
                moved = Keyed(key, right)
                entry = open_.pop(moved)  # type: ignore[assignment]
                open_[t] = entry
                starts[i + 1] = x
                self.rekeyed.append((moved, t))
                if touched is not None:
                    touched.add(moved)
                run, restart = t, True
            else:
                entry = new_run(x, now_ms)
                open_[t] = entry
                if starts is None:
                    self._keyed[key] = [x]
                else:
                    starts.insert(i + 1, x)
                self._others += 1
                self._nkeyed += 1
                run, new = t, True
        entry.xor ^= xor
        entry.records += records
        entry.reports += reports
        first = run.time
        assert type(first) is int
        for r in ranges:  # a start heap hears of a hull's start when it moves down
            part = (r.stream, r.partition)
            if entry.add_hull(part, r.start, r.end) and not restart:
                self._push_start(part, r.start, key, first)
        if restart:  # the run's key moved, or it absorbed another: every start anew
            for part, lo in entry.starts():
                self._push_start(part, lo, key, first)
        self._kdirty[key] = None
        self.dirty = True
        if touched is not None:
            touched.add(run)
        return new

    def _push_start(self, part: tuple[str, int], lo: int, key: str, start: int) -> None:
        """Where the open keyed time ``Keyed(key, start)``'s records now begin in ``part``
        (:attr:`_starts`; an entry it supersedes is passed over lazily)."""
        heap = self._starts.get(part)
        if heap is None:
            self._starts[part] = [(lo, key, start)]
            return
        heapq.heappush(heap, (lo, key, start))
        if len(heap) > 4 * self._nkeyed + 64:  # mostly passed-over entries
            self._index_starts()

    def drain_rekeyed(self) -> list[tuple[Time, Time | None]]:
        """The run-start changes since the last call (:attr:`rekeyed`), oldest first."""
        out, self.rekeyed = self.rekeyed, []
        return out

    def report_block(
        self,
        times: Sequence[int],
        xors: Sequence[int],
        records: Sequence[int],
        reports: Sequence[int],
        range_counts: Sequence[int],
        streams: Sequence[str],
        stream_index: Sequence[int],
        partitions: Sequence[int],
        starts: Sequence[int],
        ends: Sequence[int],
        now_ms: int,
    ) -> tuple[list[Time], list[Violation]]:
        """:meth:`report` for a block of int-time entries (``AckBlock``'s columns: the caller
        checked their shape), in one loop.  Entry i's ranges are items ``at .. at+n-1`` of the
        range columns (``n = range_counts[i]``, ``at`` the sum of the counts before it), of
        stream ``streams[stream_index[j]]``.  Returns the newly open times and the violations
        of the entries that were refused (the others are applied, as separate entries would
        be)."""
        if self.gap_ms is not None:
            return [], [Violation(
                f"substream '{self.substream}' is a session substream: times must be "
                f"Keyed(key, event_ms), got a block of int times"
            )]
        if not self.int_runs:
            return self._report_block_generic(
                times, xors, records, reports, range_counts,
                _offset_ranges(streams, stream_index, partitions, starts, ends), now_ms,
            )
        return self._report_int_block(
            times, xors, records, reports, range_counts,
            streams, stream_index, partitions, starts, ends, now_ms,
        )

    def _int_block_bounds(self) -> tuple[int | None, int | None]:
        """Once per block, not per time (int times only meet int seals): the highest int
        terminated time (a report at or below it is late unless open) and the highest int
        seal of any SOURCE (a time above it is covered by none: sealed_at_ms 0)."""
        done = _the_int(self.terminated.of_class(_INT_CLASS))
        seals = [s.int_seal() for s in self.sources.values() if s.role == SOURCE]
        return done, max((b for b in seals if b is not None), default=None)

    def _report_int_block(
        self,
        times: Sequence[int],
        xors: Sequence[int],
        records: Sequence[int],
        reports: Sequence[int],
        range_counts: Sequence[int],
        streams: Sequence[str],
        stream_index: Sequence[int],
        partitions: Sequence[int],
        starts: Sequence[int],
        ends: Sequence[int],
        now_ms: int,
    ) -> tuple[list[Time], list[Violation]]:
        """:meth:`report_block`'s loop while every time so far is an int (``int_runs``)."""
        new: list[Time] = []
        refused: list[Violation] = []
        open_ = self.open
        ints = self._ints
        nonzero = self._nonzero
        done, sealed_hi = self._int_block_bounds()
        if self.touched is not None:
            self.touched.update(times)  # a refused one is not open: written as absent
        at = 0
        for i, t in enumerate(times):
            n = range_counts[i]
            entry = open_.get(t)
            if entry is None:
                if done is not None and t <= done:
                    refused.append(self._late(t))
                    at += n
                    continue
                if sealed_hi is not None and t <= sealed_hi:
                    entry, _ = self._entry(t, now_ms)
                else:
                    entry = open_[t] = new_entry(now_ms)
                    if not ints or t > ints[-1]:
                        ints.append(t)
                    else:
                        insort(ints, t)
                new.append(t)
            if xors:
                x = xors[i]
                if x:
                    entry.xor ^= x
                    if entry.xor:
                        nonzero.add(t)
                    else:
                        nonzero.discard(t)
            entry.records += records[i]
            entry.reports += reports[i]
            if n == 1 and not entry.ranges:  # the common case: no OffsetRange built
                entry.ranges[(streams[stream_index[at]], partitions[at])] = [starts[at], ends[at]]
                at += 1
            elif n:
                entry.add_ranges(
                    OffsetRange(streams[stream_index[j]], partitions[j], starts[j], ends[j])
                    for j in range(at, at + n)
                )
                at += n
        self.dirty = True
        return new, refused

    def _report_block_generic(
        self,
        times: Sequence[int],
        xors: Sequence[int],
        records: Sequence[int],
        reports: Sequence[int],
        range_counts: Sequence[int],
        ranges: Sequence[OffsetRange],
        now_ms: int,
    ) -> tuple[list[Time], list[Violation]]:
        """The reference for :meth:`report_block`: one :meth:`report` per entry."""
        new: list[Time] = []
        refused: list[Violation] = []
        at = 0
        for i, t in enumerate(times):
            n = range_counts[i]
            try:
                if self.report(t, xors[i] if xors else 0, records[i], reports[i],
                               ranges[at:at + n], now_ms):
                    new.append(t)
            except Violation as v:
                refused.append(v)
            at += n
        self.dirty = True
        return new, refused

    def seal(self, source: str, t: Time, sealed_at_ms: int, now_ms: int) -> bool:
        """Source ``source`` writes nothing more at times ``<= t``.  True iff ``t`` became a
        newly open time (a seal without data still gets its notification)."""
        state = self.sources.get(source)
        if state is None:
            raise Violation(
                f"substream '{self.substream}': seal from unregistered source '{source}'"
            )
        if state.covers(t):
            return False
        if self.gap_ms is None:  # a session's sealed-at is its bound's (_session_termination)
            for u, entry in self._newly_covered(state, t):
                entry.sealed_at_ms = max(entry.sealed_at_ms, sealed_at_ms)
                if self.touched is not None:
                    self.touched.add(u)
        # the seals ``t`` evicts are of its own chain class (one per key: not a walk of all)
        for gone in state.seals.of_class(chain_class(t)):
            if less_equal(gone, t):
                state.seal_ms.pop(gone, None)
        state.seals.insert(t)
        state.seal_ms[t] = sealed_at_ms
        if type(t) is Keyed and type(t.time) is int:
            heapq.heappush(state.key_seals, (t.time, t.key))
            self._kdirty[t.key] = None
        self.dirty = True
        if (
            self.gap_ms is not None
            or t in self.open
            or self.terminated.covers(t)
            or self._below_floor(t)
        ):
            return False  # a session exists only by its records: a seal opens none
        entry, _ = self._entry(t, now_ms)
        entry.sealed_at_ms = max(entry.sealed_at_ms, sealed_at_ms)
        return True

    def seal_keys(self, source: str, upto: int, sealed_at_ms: int) -> None:
        """The keyed seal: ``source`` writes nothing more at ``Keyed(k, t)``, ``t <= upto``,
        for any key ``k`` (also keys it never wrote).  Monotone: a lower one changes nothing."""
        state = self.sources.get(source)
        if state is None:
            raise Violation(
                f"substream '{self.substream}': keyed seal from unregistered source '{source}'"
            )
        old = state.keys_upto
        if old is not None and upto <= old:
            return
        newly: list[Time]
        if self.gap_ms is not None:
            # A session's sealed-at is its bound's coverage (:meth:`_session_termination`),
            # not its times': a keyed seal that closes a million sessions touches none.
            newly = []
        elif not self.int_runs:  # the reference: a walk of every open time
            newly = [
                t for t in self.open
                if type(t) is Keyed and type(t.time) is int and t.time <= upto
                and not state.covers(t)
            ]
        else:  # the open keyed times in (old, upto], by a range query
            newly = [
                t for inner, key in self._by_time.irange(
                    None if old is None else (old + 1,), (upto + 1,), inclusive=(True, False)
                )
                if not state.covers(t := Keyed(key, inner))
            ]
        open_ = self.open
        for u in newly:
            entry = open_[u]
            entry.sealed_at_ms = max(entry.sealed_at_ms, sealed_at_ms)
        self._touch(newly)
        state.keys_upto = upto
        state.keys_upto_ms = sealed_at_ms
        self.dirty = True
        if old is None:
            self._kall = True  # keys this source blocked were not waiting on its keyed seal
        waiting = state.waiting
        while waiting and waiting[0][0] <= upto:
            self._kdirty[heapq.heappop(waiting)[1]] = None

    def _newly_covered(self, state: SourceState, t: Time) -> list[tuple[Time, OpenEntry]]:
        """The open entries at times ``<= t`` that ``state``'s seals did not cover yet.

        Why the fast path: a source sealing epoch after epoch (granularity 1) would scan
        every open time per seal, quadratic in the epochs of one acks message.  For plain
        int times the source's seals are one int ``s``, and the answer is the open times in
        ``(s, t]``: looked up one by one when that interval is shorter than the table."""
        seal = _the_int(state.seals.of_class(_INT_CLASS)) if type(t) is int else None
        if type(t) is int and seal is not None:  # only the int seal covers int times
            lo = seal + 1
            if t - lo < len(self.open):
                return [(x, e) for x in range(lo, t + 1) if (e := self.open.get(x)) is not None]
        if type(t) is Keyed and type(t.time) is int and self.int_runs:
            # only the key's own times can be below t: its index, not every open time
            key, open_ = t.key, self.open
            return [
                (u, open_[u]) for x in self._keyed.get(t.key, ())
                if x <= t.time and not state.covers(u := Keyed(key, x))
            ]
        return [
            (open_t, entry)
            for open_t, entry in self.open.items()
            if less_equal(open_t, t) and not state.covers(open_t)
        ]

    # -- termination ---------------------------------------------------------------------

    def _sealed(self, t: Time, sources: list[SourceState]) -> bool:
        return all(s.covers(t) for s in sources)

    def terminations(self) -> list[Termination]:
        """Remove and return every time that terminates now, in a consistent order."""
        run, entries, rest = self.termination_runs()
        if not run:
            return rest
        sub = self.substream
        out = [
            Termination(sub, t, e.offset_ranges(), e.records, e.sealed_at_ms, e.first_seen_ms)
            for t, e in zip(run, entries, strict=True)
        ]
        out.extend(rest)
        return out

    def termination_runs(self) -> tuple[list[int], list[OpenEntry], list[Termination]]:
        """:meth:`terminations` without a :class:`Termination` per int time: the run of int
        times that terminates now (ascending) with their removed entries, then the other
        terminations.  The order is the same: ints come first in :func:`sort_key` order, and
        ints and other times are never ordered against each other (blocked only by their
        own class), so the two parts are decided independently."""
        if not self.dirty or not self.open:
            self.dirty = False
            return [], [], []
        self.dirty = False
        if not self.had_source:
            return [], [], []
        sources = [s for s in self.sources.values() if s.role == SOURCE and s.active]
        if self.gap_ms is not None:
            if not self.int_runs:
                return [], [], self._session_terminations(sources, self.gap_ms)
            out = self._keyed_terminations(sources, self.gap_ms)
            if out:
                self.prune()
            return [], [], out
        if not self.int_runs:
            return [], [], self._generic_terminations(sources, list(self.open))
        run, entries = self._int_run(sources)
        rest: list[Termination] = []
        if self._others > self._nkeyed:  # tuples (or keyed tuples): the generic path
            rest = self._generic_terminations(
                sources,
                [t for t in self.open
                 if type(t) is not int and not (type(t) is Keyed and type(t.time) is int)],
                prune=False,
            )
        if self._keyed:
            keyed = self._keyed_terminations(sources, None)
            if keyed:
                rest.extend(keyed)
                rest.sort(key=lambda term: sort_key(term.time))
        if run or rest:
            self.prune()
        return run, entries, rest

    def _keyed_terminations(
        self, sources: list[SourceState], gap: int | None
    ) -> list[Termination]:
        """The ``Keyed(k, int)`` times (``gap`` None) or sessions (``gap`` set) that
        terminate now, removed, in :func:`sort_key` order: the same as the reference
        (:meth:`_generic_terminations`, :meth:`_session_terminations`), but only the keys
        that may have changed are looked at (the keyed index's invariant), so a step costs
        what changed, not one look per open key."""
        if any(s.keys_upto is None and not len(s.seals) for s in sources):
            # A source that sealed nothing covers no key: none closes, and none waits in a
            # heap (its first seal of a key dirties that key; its first keyed seal, all).
            self._kdirty = {}
            return []
        if self._kall:
            self._kall = False
            self._kdirty = dict.fromkeys(self._keyed)
        dirty = self._kdirty
        budget = self.times_per_step
        out: list[Termination] = []
        if budget is None:
            self._kdirty = {}
            for key in dirty:
                if key in self._keyed:
                    self._close_key(key, sources, gap, out)
        else:  # keys in the order they became dirty, until ``budget`` times closed
            keyed = self._keyed
            closed = looked = 0
            for key in dirty:
                looked += 1
                times = keyed.get(key)
                if times is not None:
                    before = len(times)
                    self._close_key(key, sources, gap, out)
                    closed += before - len(keyed.get(key, ()))
                if closed >= budget or looked >= 16 * budget:
                    break
            if looked == len(dirty):
                self._kdirty = {}
            else:  # the rest at the next step (still dirty)
                for key in list(islice(dirty, looked)):
                    del dirty[key]
                self.dirty = True
        out.sort(key=_keyed_order)
        return out

    def _blocker(self, bound: Keyed, sources: list[SourceState]) -> SourceState | bool | None:
        """False if every source covers ``bound``; else a source whose keyed seal is what
        is missing (the key waits in its heap), or None if some source without a keyed seal
        does not cover it (only its per-key seal or first keyed seal can: both dirty the key)."""
        waits_on: SourceState | None = None
        for s in sources:
            if not s.covers(bound):
                if s.keys_upto is None:
                    return None
                waits_on = waits_on or s
        return False if waits_on is None else waits_on

    def _close_key(
        self, key: str, sources: list[SourceState], gap: int | None, out: list[Termination]
    ) -> None:
        """Terminate the leading times (``gap`` None) or sessions of ``key`` that may
        terminate; register what the next one waits for."""
        if gap is not None and self.runs:
            self._close_runs(key, sources, gap, out)
            return
        times = self._keyed[key]
        open_ = self.open
        sub = self.substream
        closed = 0
        n = len(times)
        while closed < n:
            last = closed
            if gap is not None:
                while last + 1 < n and times[last + 1] - times[last] <= gap:
                    last += 1
            start, end = times[closed], times[last]
            at = end + (gap or 0)
            blocker = self._blocker(Keyed(key, at), sources)
            if blocker is not False:
                if blocker is not None:
                    heapq.heappush(blocker.waiting, (at, key))  # type: ignore[union-attr]
                break
            members = [Keyed(key, t) for t in times[closed:last + 1]]
            entries = [open_[m] for m in members]
            if any(e.xor != 0 for e in entries):
                break  # a report for it dirties the key
            if gap is None:
                e = entries[0]
                out.append(Termination(sub, members[0], e.offset_ranges(), e.records,
                                       e.sealed_at_ms, e.first_seen_ms))
            else:
                out.append(self._session_termination(key, start, end, gap, members, entries,
                                                     sources))
            for m in members:
                del open_[m]
            self._touch(members)
            self._closed_keyed(members[-1])
            closed = last + 1
        if closed:
            self._others -= closed
            self._unindex_keyed(key, times[:closed])

    def _close_runs(
        self, key: str, sources: list[SourceState], gap: int, out: list[Termination]
    ) -> None:
        """:meth:`_close_key` over ``key``'s session runs: one entry, one look, per session."""
        starts = self._keyed[key]
        open_ = self.open
        sub = self.substream
        closed = 0
        touched = self.touched
        for start in starts:
            run = Keyed(key, start)
            e: RunEntry = open_[run]  # type: ignore[assignment]
            bound = Keyed(key, e.last + gap)
            blocker = self._blocker(bound, sources)
            if blocker is not False:
                if blocker is not None:
                    heapq.heappush(blocker.waiting, (bound.time, key))  # type: ignore[union-attr,arg-type]
                break
            if e.xor != 0:
                break  # a report for it dirties the key
            until = Keyed(key, e.last)
            sealed_at = 0
            for s in sources:
                ms = s.covered_at(bound)
                if ms > sealed_at:
                    sealed_at = ms
            out.append(Termination(sub, run, e.offset_ranges(), e.records, sealed_at,
                                   e.first_seen_ms, until=until))
            del open_[run]
            if touched is not None:
                touched.add(run)
            self._closed_keyed(until)
            closed += 1
        if closed:
            self._others -= closed
            self._nkeyed -= closed
            if closed == len(starts):
                del self._keyed[key]
            else:
                del starts[:closed]

    def _session_termination(
        self, key: str, start: int, end: int, gap: int, members: Sequence[Time],
        entries: list[OpenEntry], sources: list[SourceState],
    ) -> Termination:
        """What the session ``[start, end]`` of ``key`` announces (its entries merged)."""
        hull = OpenEntry()
        for e in entries:
            hull.add_ranges(e.offset_ranges())
        bound = Keyed(key, end + gap)
        sealed_at = max((s.covered_at(bound) for s in sources), default=0)
        return Termination(
            self.substream,
            Keyed(key, start),
            hull.offset_ranges(),
            sum(e.records for e in entries),
            sealed_at,
            min(e.first_seen_ms for e in entries),
            until=Keyed(key, end),
            members=tuple(members),
        )

    def _int_run(self, sources: list[SourceState]) -> tuple[list[int], list[OpenEntry]]:
        """The open int times that terminate now, removed, with their entries.

        An int time terminates iff every active source has an int seal ``>= t``, its xor is
        0 and every open int time below it terminates: so the run is the prefix of the
        sorted open ints up to ``end = min(lowest int seal of the sources, lowest open int
        time with a nonzero xor - 1)`` -- found by one bisection, not a check per time."""
        ints = self._ints
        if not ints:
            return [], []
        end: int | None = None  # None: no bound (no active source left)
        for s in sources:
            b = s.int_seal()
            if b is None:
                return [], []
            if end is None or b < end:
                end = b
        if self._nonzero:
            blocked = min(self._nonzero) - 1
            if end is None or blocked < end:
                end = blocked
        k = len(ints) if end is None else bisect_right(ints, end)
        if not k:
            return [], []
        run = ints[:k]
        del ints[:k]
        pop = self.open.pop
        entries = [pop(t) for t in run]
        self._touch(run)
        if k >= 1024 and k > len(self.open):
            # A dict never shrinks on pop: every later walk of the open times (snapshots'
            # starts, gauges, checkpoints) would step over the k emptied slots (at g=1 a
            # backlog of 200 000 times made each snapshot's walk ~0.4 ms).  A copy is compact.
            self.open = dict(self.open)
        self.terminated.insert(run[-1])  # = inserting each: an int covers the ints below it
        return run, entries

    def _generic_terminations(
        self, sources: list[SourceState], times: list[Time], prune: bool = True
    ) -> list[Termination]:
        """The reference algorithm (every open time checked on its own), over ``times``:
        all the open times, or the non-int ones when the ints take :meth:`_int_run`."""
        out: list[Termination] = []
        # Blocked (still open) times: for totally ordered classes the minimum per class is
        # enough; partially ordered ones (tuples) keep a list.
        blocked_min: dict[tuple[int, str, int], int] = {}
        blocked_other: list[Time] = []
        for t in sorted(times, key=sort_key):
            key = sort_key(t)
            cls = key[:3]
            entry = self.open[t]
            if cls[2] == -1:
                is_blocked = cls in blocked_min
            else:
                is_blocked = any(less_than(b, t) for b in blocked_other)
            if not is_blocked and entry.xor == 0 and self._sealed(t, sources):
                out.append(
                    Termination(
                        self.substream,
                        t,
                        entry.offset_ranges(),
                        entry.records,
                        entry.sealed_at_ms,
                        entry.first_seen_ms,
                    )
                )
                continue
            if cls[2] == -1:
                blocked_min.setdefault(cls, key[3][0])
            else:
                blocked_other.append(t)
        for term in out:
            del self.open[term.time]
            self._closed_keyed(term.time)
        self._touch(term.time for term in out)
        if out:
            if any(type(term.time) is int for term in out):
                self._reindex()
            else:
                self._others -= len(out)
                for term in out:
                    t = term.time
                    if type(t) is Keyed and type(t.time) is int:
                        self._unindex_keyed(t.key, [t.time])
            if prune:
                self.prune()
        return out

    def _session_terminations(
        self, sources: list[SourceState], gap: int
    ) -> list[Termination]:
        """Close the leading sessions of every key (module doc); in :func:`sort_key` order."""
        out: list[Termination] = []
        for key, times in sorted(by_key(self.open).items()):  # report() admits only Keyed
            for run in run_members(times, gap):
                start, end = run[0], run[-1]
                bound = Keyed(key, end + gap)
                if not self._sealed(bound, sources):
                    break
                members = [Keyed(key, t) for t in run]
                entries = [self.open[m] for m in members]
                if any(e.xor != 0 for e in entries):
                    break
                out.append(self._session_termination(key, start, end, gap, members, entries,
                                                     sources))
                for m in members:
                    del self.open[m]
                self._touch(members)
                self._others -= len(members)
                self._unindex_keyed(key, run)
                self._closed_keyed(Keyed(key, end))
        out.sort(key=lambda term: sort_key(term.time))
        if out:
            self.prune()
        return out

    def oldest_unsealed(self) -> dict[str, tuple[Time, int]]:
        """Per registered SOURCE that has not sealed every open time, the oldest open time
        it has not sealed and when that time was first seen: of the int times the lowest
        (they terminate in order, so it holds every later one back; found by bisection),
        of the other times the first that opened (``open`` keeps the order times opened
        in); of the two, the one first seen earlier (ties: the int).  A session time counts
        as unsealed as in :meth:`unsealed_sources`.

        Why this shape: it runs about once a second over a table that may hold a backlog.
        The int part is one bisection per source; the walk of the other times stops, per
        source, at its first unsealed time, and checks a keyed time against the source's
        per-key seals in a dict built once (``UpperAntichain.covers`` is a scan of every
        per-key seal: quadratic over thousands of keys)."""
        sources = {n: s for n, s in self.sources.items() if s.role == SOURCE and s.active}
        out: dict[str, tuple[Time, int]] = {}
        if not sources or not self.open:
            return out
        ints = self._ints
        if ints:
            for name, s in sources.items():
                seal = s.int_seal()
                i = 0 if seal is None else bisect_right(ints, seal)
                if i < len(ints):
                    out[name] = (ints[i], self.open[ints[i]].first_seen_ms)
        if not self._others:
            return out
        waiting = {name: (s, _per_key_seals(s)) for name, s in sources.items()}
        gap = self.gap_ms or 0
        for t, e in self.open.items():
            if type(t) is int:
                continue
            key: str | None = None
            at = 0
            if isinstance(t, Keyed) and isinstance(t.time, int):
                last = e.last if type(e) is RunEntry else t.time
                key, at = t.key, last + gap  # a session's time: the bound that closes it
            for name, (s, per_key) in list(waiting.items()):
                if key is not None:  # covered by the keyed seal, or by the key's own
                    upto = s.keys_upto
                    if (upto is not None and at <= upto) or at <= per_key.get(key, at - 1):
                        continue
                elif s.seals.covers(t):
                    continue
                del waiting[name]
                held = out.get(name)
                if held is None or e.first_seen_ms < held[1]:
                    out[name] = (t, e.first_seen_ms)
            if not waiting:
                break
        return out

    def unsealed_sources(self, t: Time) -> list[str]:
        if self.gap_ms is not None and type(t) is Keyed and type(t.time) is int:
            e = self.open.get(t)
            last = e.last if type(e) is RunEntry else t.time
            t = Keyed(t.key, last + self.gap_ms)  # what closes a session ending at last
        return sorted(
            name
            for name, s in self.sources.items()
            if s.role == SOURCE and s.active and not s.covers(t)
        )

    # -- invariants ----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise :class:`AssertionError` naming the first broken invariant of this table
        (the termination rules' consequences, the indexes of :meth:`__init__`, the runs of
        :class:`RunEntry`).  Pure and O(state): for the simulator and tests, never on the
        acker's own path."""
        where = f"table '{self.substream}'"
        open_ = self.open
        # rule 1: nothing terminates before a source registered
        if self.terminated and not self.had_source:
            raise AssertionError(f"{where}: times terminated, yet no source ever registered")
        if any(s.role == SOURCE for s in self.sources.values()) and not self.had_source:
            raise AssertionError(f"{where}: a SOURCE is registered, yet had_source is False")
        for name, s in self.sources.items():
            if not s.active and s.waiting:
                raise AssertionError(f"{where}: unregistered source '{name}' has keys waiting "
                                     f"for its keyed seal: {s.waiting[:3]!r}")
        # rule 3: an open time is never at or below a terminated one (it would have had to
        # terminate first; a report for it is refused as late)
        terminated = self.terminated
        for t in open_:
            if terminated.covers(t):
                raise AssertionError(f"{where}: open time {t!r} is at or below a terminated "
                                     f"time ({terminated!r})")
        # the int index
        ints = sorted(t for t in open_ if type(t) is int)
        if self._ints != ints:
            raise AssertionError(f"{where}: _ints {self._ints[:8]!r}... is not the sorted "
                                 f"open int times {ints[:8]!r}...")
        nonzero = {t for t in ints if open_[t].xor}
        if self._nonzero != nonzero:
            raise AssertionError(f"{where}: _nonzero differs from the open int times with a "
                                 f"nonzero xor by {sorted(self._nonzero ^ nonzero)[:8]!r}")
        if self._others != len(open_) - len(ints):
            raise AssertionError(f"{where}: _others is {self._others}, but "
                                 f"{len(open_) - len(ints)} open times are not ints")
        # the keyed index
        keyed: dict[str, list[int]] = {}
        for t in open_:
            if type(t) is Keyed and type(t.time) is int:
                keyed.setdefault(t.key, []).append(t.time)
        for times in keyed.values():
            times.sort()
        if self._keyed != keyed:
            bad = sorted(k for k in set(keyed) | set(self._keyed)
                         if keyed.get(k) != self._keyed.get(k))
            raise AssertionError(f"{where}: the keyed index differs from the open keyed "
                                 f"times at keys {bad[:5]!r} (index "
                                 f"{[self._keyed.get(k) for k in bad[:2]]!r}, open "
                                 f"{[keyed.get(k) for k in bad[:2]]!r})")
        nkeyed = sum(len(v) for v in keyed.values())
        if self._nkeyed != nkeyed:
            raise AssertionError(f"{where}: _nkeyed is {self._nkeyed}, but {nkeyed} open "
                                 "keyed times")
        if self.gap_ms is None:
            by_time = sorted((x, k) for k, v in keyed.items() for x in v)
            if list(self._by_time) != by_time:
                raise AssertionError(f"{where}: _by_time does not hold exactly the open keyed "
                                     "times by event time")
        elif self._by_time:
            raise AssertionError(f"{where}: a session table keeps no _by_time index")
        # session runs: one RunEntry per open run, disjoint, more than gap apart
        if self.runs:
            gap = self.gap_ms or 0
            for key, starts in keyed.items():
                prev: RunEntry | None = None
                for x in starts:
                    e = open_[Keyed(key, x)]
                    if type(e) is not RunEntry:
                        raise AssertionError(f"{where}: open session time Keyed({key!r}, {x}) "
                                             f"is a {type(e).__name__}, not a RunEntry")
                    if e.last < x:
                        raise AssertionError(f"{where}: run Keyed({key!r}, {x}) ends at "
                                             f"{e.last}, before it starts")
                    if e.part is None and e.more:
                        raise AssertionError(f"{where}: run Keyed({key!r}, {x}) has hulls in "
                                             "'more' but none inline")
                    if prev is not None and x - prev.last <= gap:
                        raise AssertionError(f"{where}: runs of key {key!r} ending at "
                                             f"{prev.last} and starting at {x} are within "
                                             f"gap {gap}: one session")
                    prev = e
        # the prune heap: every terminated keyed int time can be forgotten by it
        heap = set(self._term_heap)
        for t in terminated:
            if type(t) is Keyed and type(t.time) is int and (t.time, t.key) not in heap:
                raise AssertionError(f"{where}: terminated {t!r} has no entry in the prune "
                                     "heap (it would never be forgotten)")
        # the start heaps: every open keyed time's start in each partition has an entry
        entries = {part: set(h) for part, h in self._starts.items()}
        for t, e in open_.items():
            if type(t) is Keyed and type(t.time) is int:
                for part, (lo, _) in e.ranges.items():
                    if (lo, t.key, t.time) not in entries.get(part, ()):
                        raise AssertionError(f"{where}: open {t!r} begins at offset {lo} of "
                                             f"{part!r}, but its start heap has no entry "
                                             "(a snapshot's data_from would be too late)")
        for name, s in self.sources.items():
            for t in s.seal_ms:
                if t not in s.seals:
                    raise AssertionError(f"{where}: source '{name}' has a seal time for "
                                         f"{t!r}, which is not in its seals")

    # -- checkpoint form -----------------------------------------------------------------

    def to_state(self, light: bool = False) -> dict[str, Any]:
        """The checkpoint form; ``light``: without what grows with the times and keys (open
        entries, terminated times, seals), which a changelog writes as it changes."""
        if light:
            return {
                "open": [],
                "sources": {
                    name: {
                        "role": s.role,
                        "active": s.active,
                        "seals": [],
                        "keys_upto": (None if s.keys_upto is None
                                      else [s.keys_upto, s.keys_upto_ms]),
                    }
                    for name, s in self.sources.items()
                },
                "had_source": self.had_source,
                "gap_ms": self.gap_ms,
                "terminated": [],
                "forgotten": self.forgotten,
            }
        return {
            "open": [
                [
                    time_to_wire(t),
                    e.xor,
                    e.records,
                    e.reports,
                    [[s, p, lo, hi] for (s, p), (lo, hi) in e.ranges.items()],
                    e.first_seen_ms,
                    e.sealed_at_ms,
                    *((e.last,) if type(e) is RunEntry else ()),
                ]
                for t, e in self.open.items()
            ],
            "sources": {
                name: {
                    "role": s.role,
                    "active": s.active,
                    "seals": [[time_to_wire(t), s.seal_ms.get(t, 0)] for t in s.seals.elements()],
                    "keys_upto": None if s.keys_upto is None else [s.keys_upto, s.keys_upto_ms],
                }
                for name, s in self.sources.items()
            },
            "had_source": self.had_source,
            "gap_ms": self.gap_ms,
            "terminated": [time_to_wire(t) for t in self.terminated.elements()],
            "forgotten": self.forgotten,
        }

    @classmethod
    def from_state(
        cls, substream: str, state: Mapping[str, Any], *, int_runs: bool = True
    ) -> SegmentTable:
        """The table a checkpoint holds (``int_runs``: which path it is loaded for; a session
        table's per-time entries, as written before runs, are folded into runs)."""
        gap = state.get("gap_ms")
        table = cls(substream, None if gap is None else int(gap))
        table.int_runs = int_runs
        for wire, xor, records, reports, ranges, first, sealed, *last in state["open"]:
            table.open[time_from_wire(wire)] = open_entry(
                int(xor), int(records), int(reports),
                {(s, int(p)): [int(lo), int(hi)] for s, p, lo, hi in ranges},
                int(first), int(sealed), int(last[0]) if last else None,
            )
        for name, s in state["sources"].items():
            src = SourceState(str(s["role"]), active=bool(s["active"]))
            for wire, ms in s["seals"]:
                t = time_from_wire(wire)
                src.seals.insert(t)
                src.seal_ms[t] = int(ms)
            keyed = s.get("keys_upto")
            if keyed is not None:
                src.keys_upto, src.keys_upto_ms = int(keyed[0]), int(keyed[1])
            table.sources[name] = src
        table.had_source = bool(state["had_source"])
        table.terminated = UpperAntichain(time_from_wire(w) for w in state["terminated"])
        forgotten = state.get("forgotten")
        table.forgotten = None if forgotten is None else int(forgotten)
        table._reindex()
        table.dirty = True
        return table
