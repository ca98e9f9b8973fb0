"""Antichains: sets of mutually incomparable times (Timely's ``progress/frontier.rs``).

A *lower* frontier (:class:`Antichain`) is the set of minimal times that may still
appear; everything not ``>=`` some element is complete. An *upper* frontier
(:class:`UpperAntichain`, after Strymon) is the set of maximal times seen/active so
far. Both keep only extremal elements, so their size is bounded by the width of the
partial order over the inserted times (one element per key for keyed int times).

Storage is by *chain class* (:func:`chain_class`: plain ints; tuples of one length; keyed
times of one key and inner shape).  Why: times of different classes are incomparable, so
an insertion or a query only ever compares against its own class -- O(1) for the totally
ordered classes (ints, ``Keyed(k, int)``: at most one element each), however many keys the
antichain holds.  A flat list made every keyed insertion scan one element per open key
(quadratic in keys: the acker at 10^4 open sessions spent 90 % of its time there).

Invariants (checked by :meth:`_AntichainBase.check`, which the property tests call): every
class list is non-empty, holds only times of its class, and no element of it is ``<=``
another; ``_len`` is the total of the class lists' lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Self, TypeAlias

from substreams.frontier.time import Keyed, Time, less_equal, less_than, sort_key

__all__ = ["Antichain", "ChainClass", "UpperAntichain", "chain_class"]

ChainClass: TypeAlias = tuple[str | None, int]
"""``(key or None, arity)``: arity -1 for int-based times, else the tuple's length."""

_INT_CLASS: ChainClass = (None, -1)


def chain_class(t: Time) -> ChainClass:
    """The chain class of ``t``: times of different classes are always incomparable."""
    if type(t) is int:
        return _INT_CLASS
    if type(t) is Keyed:
        inner = t.time
        return (t.key, -1 if type(inner) is int else len(inner))  # type: ignore[arg-type]
    if type(t) is tuple:
        return (None, len(t))
    raise TypeError(f"not a logical time: {t!r}")


class _AntichainBase:
    """Shared container behaviour: storage by class, deterministic order, equality."""

    __slots__ = ("_classes", "_len", "_sorted", "_touched")

    def __init__(self, iterable: Iterable[Time] = ()) -> None:
        self._classes: dict[ChainClass, list[Time]] = {}
        self._len = 0
        self._sorted: tuple[Time, ...] | None = ()
        self._touched: set[ChainClass] | None = None
        for t in iterable:
            self.insert(t)

    # -- change tracking (what a changelog writes: the classes that changed) -------------

    def track(self) -> None:
        """Record from now on which chain classes change (:meth:`drain_touched`)."""
        if self._touched is None:
            self._touched = set()

    def drain_touched(self) -> set[ChainClass]:
        """The classes changed since the last drain (tracking must be on); forgotten."""
        touched = self._touched
        assert touched is not None, "change tracking is off"
        self._touched = set()
        return touched

    def classes(self) -> list[ChainClass]:
        """Every chain class that has elements."""
        return list(self._classes)

    def insert(self, t: Time) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def _unchecked(cls, elements: Iterable[Time]) -> Self:
        """Wrap ``elements`` that the caller guarantees to be an antichain (no re-check)."""
        result = cls.__new__(cls)
        classes: dict[ChainClass, list[Time]] = {}
        n = 0
        for t in elements:
            c = chain_class(t)
            lst = classes.get(c)
            if lst is None:
                classes[c] = [t]
            else:
                lst.append(t)
            n += 1
        result._classes = classes
        result._len = n
        result._sorted = None
        result._touched = None
        return result

    def _store(self, c: ChainClass, kept: list[Time], t: Time) -> None:
        """Class ``c`` becomes ``kept`` plus ``t`` (``kept``: what ``t`` did not evict)."""
        old = self._classes.get(c)
        kept.append(t)
        self._len += len(kept) - (0 if old is None else len(old))
        self._classes[c] = kept
        self._sorted = None
        if self._touched is not None:
            self._touched.add(c)

    def discard(self, t: Time) -> bool:
        """Remove ``t`` if it is an element (a subset of an antichain is one); True iff it
        was.  For pruning one element without rebuilding the whole antichain."""
        c = chain_class(t)
        lst = self._classes.get(c)
        if lst is None or t not in lst:
            return False
        if len(lst) == 1:
            del self._classes[c]
        else:
            lst.remove(t)
        self._len -= 1
        self._sorted = None
        if self._touched is not None:
            self._touched.add(c)
        return True

    def of_class(self, c: ChainClass) -> tuple[Time, ...]:
        """The elements of chain class ``c`` (at most one for a totally ordered class)."""
        return tuple(self._classes.get(c, ()))

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
            s = self._sorted = tuple(sorted(self._iter_unordered(), key=sort_key))
        return s

    def _iter_unordered(self) -> Iterator[Time]:
        for lst in self._classes.values():
            yield from lst

    def is_empty(self) -> bool:
        """True iff there are no elements (an empty lower frontier means: all done)."""
        return not self._len

    def clear(self) -> None:
        """Remove all elements."""
        if self._touched is not None:
            self._touched.update(self._classes)
        self._classes = {}
        self._len = 0
        self._sorted = ()

    def copy(self) -> Self:
        """An independent copy (antichains are mutable through :meth:`insert`)."""
        result = self.__class__.__new__(self.__class__)
        result._classes = {c: list(lst) for c, lst in self._classes.items()}
        result._len = self._len
        result._sorted = self._sorted
        result._touched = None  # a copy starts untracked
        return result

    def check(self) -> None:
        """Assert the storage invariants (module doc); for tests."""
        n = 0
        for c, lst in self._classes.items():
            assert lst, f"empty class {c!r}"
            for i, a in enumerate(lst):
                assert chain_class(a) == c, f"{a!r} stored in class {c!r}"
                for b in lst[i + 1:]:
                    assert not less_equal(a, b) and not less_equal(b, a), (a, b)
            n += len(lst)
        assert n == self._len, (n, self._len)

    def __iter__(self) -> Iterator[Time]:
        return iter(self.elements())

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return bool(self._len)

    def __contains__(self, t: object) -> bool:
        try:
            lst = self._classes.get(chain_class(t))  # type: ignore[arg-type]
        except TypeError:
            return False
        return lst is not None and t in lst

    def __eq__(self, other: object) -> bool:
        # Set equality; a lower and an upper antichain are never equal even with the
        # same elements because they denote different sets of times.
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _AntichainBase)
        if self._len != other._len or self._classes.keys() != other._classes.keys():
            return False
        return all(
            lst == (o := other._classes[c]) or set(lst) == set(o)
            for c, lst in self._classes.items()
        )

    def __hash__(self) -> int:
        # Content-based: do not mutate an antichain while it is a dict key / set member.
        return hash((type(self).__name__, frozenset(self._iter_unordered())))

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
        c = chain_class(t)
        lst = self._classes.get(c)
        if lst is None:
            self._store(c, [], t)
            return True
        for e in lst:
            if less_equal(e, t):
                return False
        self._store(c, [e for e in lst if not less_equal(t, e)], t)
        return True

    def less_equal(self, t: Time) -> bool:
        """True iff some element is ``<= t``, i.e. ``t`` is *not* complete yet."""
        lst = self._classes.get(chain_class(t))
        return lst is not None and any(less_equal(e, t) for e in lst)

    def less_than(self, t: Time) -> bool:
        """True iff some element is strictly ``< t``."""
        lst = self._classes.get(chain_class(t))
        return lst is not None and any(less_than(e, t) for e in lst)

    def dominates(self, other: Antichain) -> bool:
        """True iff every element of ``other`` is ``>=`` some element of ``self``.

        Equivalently ``other``'s upset is contained in ``self``'s: ``other`` is at or
        beyond ``self``, so frontiers advancing from ``self`` to ``other`` is valid
        progress. (Timely's ``PartialOrder::less_equal`` on antichains.)
        """
        return all(self.less_equal(o) for o in other._iter_unordered())

    def meet(self, other: Antichain) -> Antichain:
        """The frontier of the union: minimal elements of ``self`` and ``other`` together.

        Its upset is the union of both upsets, so a time is complete in the result iff
        complete in both. This is how the lower frontiers of several partitions (or
        inputs) are merged: the slowest one holds the merge back.
        """
        result = self.copy()
        result.extend(other._iter_unordered())
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
        c = chain_class(t)
        lst = self._classes.get(c)
        if lst is None:
            self._store(c, [], t)
            return True
        for e in lst:
            if less_equal(t, e):
                return False
        self._store(c, [e for e in lst if not less_equal(e, t)], t)
        return True

    def covers(self, t: Time) -> bool:
        """True iff some element is ``>= t``: data has reached (at least) ``t``."""
        lst = self._classes.get(chain_class(t))
        if lst is None:
            return False
        for e in lst:  # noqa: SIM110 -- not any(genexpr): the acker asks per open time
            if less_equal(t, e):
                return True
        return False

    def union(self, other: UpperAntichain) -> UpperAntichain:
        """Maximal elements of both: merges the upper frontiers of several partitions."""
        result = self.copy()
        result.extend(other._iter_unordered())
        return result

    def retain(self, keep: Callable[[Time], bool]) -> UpperAntichain:
        """A new upper antichain of the elements ``keep`` accepts (a subset of an antichain
        is one); ``self`` is left unchanged.  For pruning what can no longer matter."""
        return UpperAntichain._unchecked([u for u in self._iter_unordered() if keep(u)])

    def retain_not_passed(self, lower: Antichain) -> UpperAntichain:
        """A new upper antichain without the elements the lower frontier has passed.

        An element ``u`` is kept iff ``lower.less_equal(u)``: some lower-frontier
        element is still ``<= u``, so ``u`` is not complete yet. Completed times
        carry no more information for an upper frontier of *active* times.
        ``self`` is left unchanged.
        """
        return UpperAntichain._unchecked(
            [u for u in self._iter_unordered() if lower.less_equal(u)]
        )
