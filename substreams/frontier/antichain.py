"""Antichains: sets of mutually incomparable times (Timely's ``progress/frontier.rs``).

A *lower* frontier (:class:`Antichain`) is the set of minimal times that may still
appear; everything not ``>=`` some element is complete. An *upper* frontier
(:class:`UpperAntichain`, after Strymon) is the set of maximal times seen/active so
far. Both keep only extremal elements, so their size is bounded by the width of the
partial order over the inserted times (one element per key for keyed int times).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Self

from substreams.frontier.time import Time, less_equal, less_than, sort_key

__all__ = ["Antichain", "UpperAntichain"]


class _AntichainBase:
    """Shared container behaviour: storage, deterministic order, equality, hashing."""

    __slots__ = ("_elements", "_sorted")

    def __init__(self, iterable: Iterable[Time] = ()) -> None:
        self._elements: list[Time] = []
        self._sorted: tuple[Time, ...] | None = ()
        for t in iterable:
            self.insert(t)

    def insert(self, t: Time) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def _unchecked(cls, elements: list[Time]) -> Self:
        """Wrap ``elements`` that the caller guarantees to be an antichain (no re-check)."""
        result = cls.__new__(cls)
        result._elements = elements
        result._sorted = None
        return result

    def extend(self, iterable: Iterable[Time]) -> bool:
        """Insert every time; True iff at least one insertion changed the antichain."""
        added = False
        for t in iterable:
            added = self.insert(t) or added
        return added

    def elements(self) -> tuple[Time, ...]:
        """The elements in a deterministic order (:func:`~substreams.frontier.time.sort_key`)."""
        s = self._sorted
        if s is None:
            s = self._sorted = tuple(sorted(self._elements, key=sort_key))
        return s

    def is_empty(self) -> bool:
        """True iff there are no elements (an empty lower frontier means: all done)."""
        return not self._elements

    def clear(self) -> None:
        """Remove all elements."""
        self._elements = []
        self._sorted = ()

    def copy(self) -> Self:
        """An independent copy (antichains are mutable through :meth:`insert`)."""
        return self._unchecked(list(self._elements))

    def __iter__(self) -> Iterator[Time]:
        return iter(self.elements())

    def __len__(self) -> int:
        return len(self._elements)

    def __bool__(self) -> bool:
        return bool(self._elements)

    def __contains__(self, t: object) -> bool:
        return t in self._elements

    def __eq__(self, other: object) -> bool:
        # Set equality; a lower and an upper antichain are never equal even with the
        # same elements because they denote different sets of times.
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _AntichainBase)
        if len(self._elements) != len(other._elements):
            return False
        return self._elements == other._elements or set(self._elements) == set(other._elements)

    def __hash__(self) -> int:
        # Content-based: do not mutate an antichain while it is a dict key / set member.
        return hash((type(self).__name__, frozenset(self._elements)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.elements())!r})"


class Antichain(_AntichainBase):
    """The *minimal* elements of all times inserted: a lower frontier.

    Invariant: no element is ``<=`` another. ``less_equal(t)`` answers "may data at
    ``t`` still arrive?"; once it is False, ``t`` is complete (notifications fire).
    Equality is set equality; iteration order is deterministic.
    """

    __slots__ = ()

    def insert(self, t: Time) -> bool:
        """Add ``t`` unless some element is already ``<= t``; evict elements ``>= t``.

        Returns True iff the antichain changed (``t`` was added).
        """
        elements = self._elements
        for e in elements:
            if less_equal(e, t):
                return False
        self._elements = [e for e in elements if not less_equal(t, e)]
        self._elements.append(t)
        self._sorted = None
        return True

    def less_equal(self, t: Time) -> bool:
        """True iff some element is ``<= t``, i.e. ``t`` is *not* complete yet."""
        return any(less_equal(e, t) for e in self._elements)

    def less_than(self, t: Time) -> bool:
        """True iff some element is strictly ``< t``."""
        return any(less_than(e, t) for e in self._elements)

    def dominates(self, other: Antichain) -> bool:
        """True iff every element of ``other`` is ``>=`` some element of ``self``.

        Equivalently ``other``'s upset is contained in ``self``'s: ``other`` is at or
        beyond ``self``, so frontiers advancing from ``self`` to ``other`` is valid
        progress. (Timely's ``PartialOrder::less_equal`` on antichains.)
        """
        return all(self.less_equal(o) for o in other._elements)

    def meet(self, other: Antichain) -> Antichain:
        """The frontier of the union: minimal elements of ``self`` and ``other`` together.

        Its upset is the union of both upsets, so a time is complete in the result iff
        complete in both. This is how the lower frontiers of several partitions (or
        inputs) are merged: the slowest one holds the merge back.
        """
        result = self.copy()
        result.extend(other._elements)
        return result


class UpperAntichain(_AntichainBase):
    """The *maximal* elements of all times inserted: an upper frontier.

    Strymon-style upper frontiers summarise how far data has *reached* (the maximal
    active or seen times), complementing the lower frontier which says what may
    still arrive. Invariant: no element is ``<=`` another.
    """

    __slots__ = ()

    def insert(self, t: Time) -> bool:
        """Add ``t`` unless some element is already ``>= t``; evict elements ``<= t``.

        Returns True iff the antichain changed (``t`` was added).
        """
        elements = self._elements
        for e in elements:
            if less_equal(t, e):
                return False
        self._elements = [e for e in elements if not less_equal(e, t)]
        self._elements.append(t)
        self._sorted = None
        return True

    def covers(self, t: Time) -> bool:
        """True iff some element is ``>= t``: data has reached (at least) ``t``."""
        for e in self._elements:  # noqa: SIM110 -- not any(genexpr): the acker asks per open time
            if less_equal(t, e):
                return True
        return False

    def union(self, other: UpperAntichain) -> UpperAntichain:
        """Maximal elements of both: merges the upper frontiers of several partitions."""
        result = self.copy()
        result.extend(other._elements)
        return result

    def retain(self, keep: Callable[[Time], bool]) -> UpperAntichain:
        """A new upper antichain of the elements ``keep`` accepts (a subset of an antichain
        is one); ``self`` is left unchanged.  For pruning what can no longer matter."""
        return UpperAntichain._unchecked([u for u in self._elements if keep(u)])

    def retain_not_passed(self, lower: Antichain) -> UpperAntichain:
        """A new upper antichain without the elements the lower frontier has passed.

        An element ``u`` is kept iff ``lower.less_equal(u)``: some lower-frontier
        element is still ``<= u``, so ``u`` is not complete yet. Completed times
        carry no more information for an upper frontier of *active* times.
        ``self`` is left unchanged.
        """
        return UpperAntichain._unchecked([u for u in self._elements if lower.less_equal(u)])
