"""A consolidating batch of ``(time, delta)`` updates (Timely's ``progress/change_batch.rs``).

Progress messages are streams of count changes at times (``+1`` "a capability /
unacked message at t exists", ``-1`` "it is gone"). Many of them cancel out, so they
are accumulated per time before being shipped or applied: only the *net* change per
time matters. Timely appends to a vector and sorts lazily; in Python a ``dict``
gives the same consolidation with O(1) updates, and zero accumulations are dropped
eagerly so the batch is always compact.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from substreams.frontier.time import Time, sort_key

__all__ = ["ChangeBatch"]


class ChangeBatch:
    """Net ``delta`` per time; times whose deltas sum to zero disappear.

    Iteration and :meth:`drain` yield updates sorted by
    :func:`~substreams.frontier.time.sort_key`, so output is deterministic regardless
    of the order updates arrived in.
    """

    __slots__ = ("_counts",)

    __hash__ = None  # type: ignore[assignment]  # mutable container

    def __init__(self, updates: Iterable[tuple[Time, int]] = ()) -> None:
        self._counts: dict[Time, int] = {}
        self.extend(updates)

    def update(self, t: Time, delta: int) -> None:
        """Add ``delta`` to the accumulation at ``t``."""
        self.extend(((t, delta),))

    def extend(self, updates: Iterable[tuple[Time, int]]) -> None:
        """Apply every ``(time, delta)`` of ``updates``."""
        counts = self._counts
        for t, delta in updates:
            if delta == 0:
                continue
            total = counts.get(t, 0) + delta
            if total == 0:
                del counts[t]
            else:
                counts[t] = total

    def is_empty(self) -> bool:
        """True iff every accumulation is zero."""
        return not self._counts

    def clear(self) -> None:
        """Drop all updates without returning them."""
        self._counts.clear()

    def iter(self) -> Iterator[tuple[Time, int]]:
        """The consolidated non-zero updates in deterministic order (batch unchanged)."""
        return iter(self._sorted_items())

    def drain(self) -> list[tuple[Time, int]]:
        """Return the consolidated non-zero updates (sorted) and empty the batch."""
        items = self._sorted_items()
        self._counts = {}
        return items

    def _sorted_items(self) -> list[tuple[Time, int]]:
        return sorted(self._counts.items(), key=lambda item: sort_key(item[0]))

    def __iter__(self) -> Iterator[tuple[Time, int]]:
        return self.iter()

    def __len__(self) -> int:
        return len(self._counts)

    def __bool__(self) -> bool:
        return bool(self._counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeBatch):
            return NotImplemented
        return self._counts == other._counts

    def __repr__(self) -> str:
        return f"ChangeBatch({self._sorted_items()!r})"
