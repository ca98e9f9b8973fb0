"""A multiset of times with its frontier (Timely's ``MutableAntichain``).

Progress tracking keeps a *count* per time (outstanding messages, capabilities,
unacked tuples) and needs the frontier: the minimal times whose count is positive.
Counts go up and down; the frontier moves forwards (and, with new capabilities,
possibly backwards), and consumers want to hear only about frontier *changes*.

Semantics (as in Timely):

* counts may go negative transiently (a ``-1`` overtaking its ``+1``); only times
  with a strictly positive count belong to the frontier;
* :meth:`MutableAntichain.update_iter` applies a batch and returns the net frontier
  changes: ``(t, +1)`` for each time entering, ``(t, -1)`` for each time leaving.
  A time that leaves and re-enters within one call reports nothing.

Implementation. Times are partitioned into *chain classes* (plain ints; tuples of
one length; keyed times of one key and inner shape): times of different classes are
incomparable, so the frontier is the disjoint union of per-class frontiers, and each
class is maintained independently. An update only forces a class to recompute when
it could change that class's frontier (Timely's rule, checked against the frontier
*before* the batch):

* ``+d`` at a time not ``>=`` the frontier may add a new minimal element;
* ``-d`` at a frontier element may remove it.

Anything else is provably a no-op for the frontier: increments at/above the frontier
are dominated by frontier elements that keep their positive count, decrements
strictly above it cannot expose anything below the frontier, and decrements below
the frontier hit times whose count is already ``<= 0``.

Totally ordered classes (plain ints, and ``Keyed(k, int)`` per key -- the acker's hot
path) keep a lazy min-heap, so the frontier is recomputed in amortised O(log n).
Partially ordered classes (tuples) rebuild from the positive-count times sorted by a
linear extension, so the sweep never needs evictions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from substreams.frontier.antichain import Antichain
from substreams.frontier.time import Keyed, Time, less_equal, less_than, sort_key

__all__ = ["MutableAntichain"]

# Compact a lazy heap once stale entries could outnumber live counts; keeps memory
# bounded when times far above the minimum come and go.
_HEAP_SLACK = 64


class _TotalGroup:
    """Counts for one totally ordered chain class, keyed by the inner ``int``.

    ``key`` is ``None`` for plain ints, else the substream key of ``Keyed`` times.
    The heap lazily holds every inner time whose count went positive; entries whose
    count dropped to ``<= 0`` are discarded when they surface at the top.
    """

    __slots__ = ("counts", "dirty", "front", "heap", "in_heap", "key")

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.counts: dict[int, int] = {}
        self.heap: list[int] = []
        self.in_heap: set[int] = set()
        self.front: int | None = None
        self.dirty = False

    def apply(self, inner: int, delta: int) -> bool:
        """Apply one update; True iff it may change the (pre-batch) frontier."""
        counts = self.counts
        total = counts.get(inner, 0) + delta
        if total:
            counts[inner] = total
            if total > 0 and inner not in self.in_heap:
                heapq.heappush(self.heap, inner)
                self.in_heap.add(inner)
                if len(self.heap) > 2 * len(counts) + _HEAP_SLACK:
                    self._compact()
        else:
            del counts[inner]
        front = self.front
        if delta > 0:
            return front is None or inner < front
        return inner == front

    def apply_many(self, inners: Sequence[int], delta: int) -> bool:
        """:meth:`apply` of ``delta`` at each of ``inners`` in one loop (a run of times);
        True iff any of them may change the (pre-batch) frontier -- the same answer as
        or-ing the single updates' (the frontier is not recomputed in between)."""
        counts, heap, in_heap = self.counts, self.heap, self.in_heap
        front = self.front
        may = False
        for inner in inners:
            total = counts.get(inner, 0) + delta
            if total:
                counts[inner] = total
                if total > 0 and inner not in in_heap:
                    heapq.heappush(heap, inner)
                    in_heap.add(inner)
            else:
                del counts[inner]
            if (delta > 0 and (front is None or inner < front)) or (delta < 0 and inner == front):
                may = True
        if len(heap) > 2 * len(counts) + _HEAP_SLACK:
            self._compact()
        return may

    def recompute(self) -> None:
        """Pop stale heap tops until the top is the minimal positive-count time."""
        heap, counts = self.heap, self.counts
        while heap and counts.get(heap[0], 0) <= 0:
            self.in_heap.discard(heapq.heappop(heap))
        self.front = heap[0] if heap else None

    def _compact(self) -> None:
        counts = self.counts
        self.heap = [i for i in self.heap if counts.get(i, 0) > 0]
        heapq.heapify(self.heap)
        self.in_heap = set(self.heap)

    def wrap(self, inner: int) -> Time:
        return inner if self.key is None else Keyed(self.key, inner)

    def frontier(self) -> list[Time]:
        return [] if self.front is None else [self.wrap(self.front)]

    def count(self, inner: int) -> int:
        return self.counts.get(inner, 0)


class _PartialGroup:
    """Counts for one partially ordered chain class (same-length tuples, maybe keyed)."""

    __slots__ = ("counts", "dirty", "front", "front_set", "positive")

    def __init__(self) -> None:
        self.counts: dict[Time, int] = {}
        self.positive: set[Time] = set()
        self.front: list[Time] = []
        self.front_set: set[Time] = set()
        self.dirty = False

    def apply(self, t: Time, delta: int) -> bool:
        """Apply one update; True iff it may change the (pre-batch) frontier."""
        counts = self.counts
        total = counts.get(t, 0) + delta
        if total:
            counts[t] = total
        else:
            del counts[t]
        if total > 0:
            self.positive.add(t)
        else:
            self.positive.discard(t)
        if delta > 0:
            return not any(less_equal(f, t) for f in self.front)
        return t in self.front_set

    def recompute(self) -> None:
        """Minimal positive-count times, swept in linear-extension order.

        Sorting by :func:`sort_key` guarantees no later candidate is below an
        earlier one, so a candidate joins iff no kept element is ``<=`` it.
        """
        front: list[Time] = []
        for t in sorted(self.positive, key=sort_key):
            if not any(less_equal(f, t) for f in front):
                front.append(t)
        self.front = front
        self.front_set = set(front)

    def frontier(self) -> list[Time]:
        return list(self.front)

    def count(self, t: Time) -> int:
        return self.counts.get(t, 0)


_PartialKey = tuple[str | None, int]


class MutableAntichain:
    """A multiset of times plus the antichain of its minimal positive-count times.

    Like Timely's ``MutableAntichain``: apply batches of ``(time, delta)`` with
    :meth:`update_iter` and consume the returned frontier changes; query the current
    frontier with :meth:`frontier`, :meth:`less_equal` and :meth:`less_than`.
    """

    __slots__ = ("_frontier_size", "_ints", "_partial", "_total")

    def __init__(self) -> None:
        self._ints = _TotalGroup(None)
        self._total: dict[str | None, _TotalGroup] = {}
        self._partial: dict[_PartialKey, _PartialGroup] = {}
        self._frontier_size = 0
        self.clear()

    # -- updates -------------------------------------------------------------------

    def update_iter(self, updates: Iterable[tuple[Time, int]]) -> list[tuple[Time, int]]:
        """Apply ``updates`` and return the frontier changes, sorted by time.

        Each returned ``(t, +1)`` is a time that entered the frontier and ``(t, -1)``
        one that left it: exactly the symmetric difference between the frontier
        before and after the batch.
        """
        dirty_total: list[_TotalGroup] = []
        dirty_partial: list[tuple[_PartialKey, _PartialGroup]] = []
        ints = self._ints
        for t, delta in updates:
            if not delta:
                continue
            if type(t) is int:  # hot path
                if ints.apply(t, delta) and not ints.dirty:
                    ints.dirty = True
                    dirty_total.append(ints)
            elif type(t) is Keyed and type(t.time) is int:
                group = self._total.get(t.key)
                if group is None:
                    group = self._total[t.key] = _TotalGroup(t.key)
                if group.apply(t.time, delta) and not group.dirty:
                    group.dirty = True
                    dirty_total.append(group)
            else:
                pkey = _partial_key(t)
                pgroup = self._partial.get(pkey)
                if pgroup is None:
                    pgroup = self._partial[pkey] = _PartialGroup()
                if pgroup.apply(t, delta) and not pgroup.dirty:
                    pgroup.dirty = True
                    dirty_partial.append((pkey, pgroup))
        if not dirty_total and not dirty_partial:
            return []

        changes: list[tuple[Time, int]] = []
        for group in dirty_total:
            self._recompute_total(group, changes)
        for pkey, pgroup in dirty_partial:
            self._recompute_partial(pkey, pgroup, changes)
        if len(changes) > 1:
            changes.sort(key=lambda change: sort_key(change[0]))
        return changes

    def update_ints(self, times: Sequence[int], delta: int) -> list[tuple[Time, int]]:
        """``update_iter((t, delta) for t in times)`` for plain int times (a run of them),
        in one loop and one recompute of the ints' frontier; same counts, same changes."""
        if not delta or not times or not self._ints.apply_many(times, delta):
            return []
        changes: list[tuple[Time, int]] = []
        self._recompute_total(self._ints, changes)
        if len(changes) > 1:
            changes.sort(key=lambda change: sort_key(change[0]))
        return changes

    def _recompute_total(self, group: _TotalGroup, changes: list[tuple[Time, int]]) -> None:
        """Recompute a totally ordered group's frontier (at most one time), appending what
        left and entered it to ``changes``."""
        group.dirty = False
        old = group.front
        group.recompute()
        new = group.front
        if old != new:
            if old is not None:
                changes.append((group.wrap(old), -1))
                self._frontier_size -= 1
            if new is not None:
                changes.append((group.wrap(new), 1))
                self._frontier_size += 1
        if group.key is not None and not group.counts:
            del self._total[group.key]  # forget finished keys (sessions come and go)

    def _recompute_partial(
        self, pkey: _PartialKey, pgroup: _PartialGroup, changes: list[tuple[Time, int]]
    ) -> None:
        """Recompute a partially ordered group's frontier, appending what left and entered
        it to ``changes``."""
        pgroup.dirty = False
        old_set = pgroup.front_set
        pgroup.recompute()
        new_set = pgroup.front_set
        changes.extend((t, -1) for t in old_set - new_set)
        changes.extend((t, 1) for t in new_set - old_set)
        self._frontier_size += len(new_set) - len(old_set)
        if not pgroup.counts:
            del self._partial[pkey]

    def update(self, t: Time, delta: int) -> list[tuple[Time, int]]:
        """Single-update shorthand for :meth:`update_iter`."""
        return self.update_iter(((t, delta),))

    def clear(self) -> None:
        """Forget all counts (without reporting frontier changes)."""
        self._ints = _TotalGroup(None)
        self._total = {None: self._ints}
        self._partial = {}
        self._frontier_size = 0

    # -- queries -------------------------------------------------------------------

    def frontier(self) -> Antichain:
        """A fresh :class:`Antichain` of the minimal times with positive count."""
        elements: list[Time] = []
        for group in self._total.values():
            elements.extend(group.frontier())
        for pgroup in self._partial.values():
            elements.extend(pgroup.front)
        # Different chain classes are incomparable, so the union is an antichain.
        return Antichain._unchecked(elements)

    def less_equal(self, t: Time) -> bool:
        """True iff some frontier element is ``<= t`` (``t`` is not complete)."""
        if type(t) is int:
            front = self._ints.front
            return front is not None and front <= t
        if type(t) is Keyed and type(t.time) is int:
            group = self._total.get(t.key)
            return group is not None and group.front is not None and group.front <= t.time
        pgroup = self._partial.get(_partial_key(t))
        return pgroup is not None and any(less_equal(f, t) for f in pgroup.front)

    def less_than(self, t: Time) -> bool:
        """True iff some frontier element is strictly ``< t``."""
        if type(t) is int:
            front = self._ints.front
            return front is not None and front < t
        if type(t) is Keyed and type(t.time) is int:
            group = self._total.get(t.key)
            return group is not None and group.front is not None and group.front < t.time
        pgroup = self._partial.get(_partial_key(t))
        return pgroup is not None and any(less_than(f, t) for f in pgroup.front)

    def is_empty(self) -> bool:
        """True iff the frontier is empty (no time has a positive count)."""
        return self._frontier_size == 0

    def count_for(self, t: Time) -> int:
        """The accumulated count at ``t`` (possibly negative mid-protocol)."""
        if type(t) is int:
            return self._ints.count(t)
        if type(t) is Keyed and type(t.time) is int:
            group = self._total.get(t.key)
            return 0 if group is None else group.count(t.time)
        pgroup = self._partial.get(_partial_key(t))
        return 0 if pgroup is None else pgroup.count(t)

    def __repr__(self) -> str:
        return f"MutableAntichain(frontier={list(self.frontier().elements())!r})"


def _partial_key(t: Time) -> _PartialKey:
    """Chain class of a tuple-based time: ``(key or None, tuple length)``."""
    if type(t) is tuple:
        if not all(type(c) is int for c in t):
            raise TypeError(f"tuple time coordinates must be ints: {t!r}")
        return (None, len(t))
    if type(t) is Keyed:
        inner = t.time
        assert isinstance(inner, tuple)
        return (t.key, len(inner))
    raise TypeError(f"not a logical time: {t!r}")
