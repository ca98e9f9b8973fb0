"""The one notification type: what a reader of a substream is told when one of its times ends.

Why here, low in the layering: the plain-Python notification API
(:class:`substreams.control.notifications.Notifications`) and the Spark driver's
``on_notification`` callback hand the same facts to user code (which time ended, how many
records it holds, where they are, when it was sealed, how long the notification took), so
they share one type, and the Spark layer sits above this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from substreams.control.messages import OffsetRange
from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.streams.records import Entry


def format_time(t: Time) -> str:
    """``5`` -> "5", ``(1, 2)`` -> "(1,2)", ``Keyed("u1", 5)`` -> "u1@5"."""
    if isinstance(t, Keyed):
        return f"{t.key}@{format_time(t.time)}"
    if isinstance(t, tuple):
        return "(" + ",".join(str(c) for c in t) + ")"
    return str(t)


def parse_time(text: str) -> Time:
    """Inverse of :func:`format_time` (a key may contain '@': the last one splits)."""
    key, at, inner = text.rpartition("@")
    try:
        base: int | tuple[int, ...]
        if inner.startswith("(") and inner.endswith(")"):
            body = inner[1:-1]
            base = tuple(int(c) for c in body.split(",")) if body else ()
        else:
            base = int(inner)
    except ValueError as exc:
        raise SubstreamsError(f"not an epoch: {text!r}") from exc
    return Keyed(key, base) if at else base


@dataclass(frozen=True)
class EpochNote:
    """One completed time of a substream, delivered once, in notification order.

    ``records`` is the count the progress writer announced; ``entries`` holds the records
    themselves only when the reader asked for them (a firm read of exactly ``ranges``).
    The Spark driver's callback gets the same type without entries (the records stay on
    the executors) and with ``results``, the number its operator published."""

    time: Time
    control_offset: int
    control_index: int
    records: int
    sealed_at_ms: int
    notified_at_ms: int
    """When the notification reached this reader (wall clock)."""
    results: int = 0
    """Spark: results the operator published for this epoch (0 when the batch was a replay
    whose results had been committed before: they were not computed again)."""
    replayed: bool = False
    """Spark: the batch was committed before a crash and is delivered again after the
    restart."""
    substream: str = ""
    ranges: tuple[OffsetRange, ...] = ()
    """The data-topic offset ranges that hold every record of the time."""
    until: Time | None = None
    """A session's last time (``time`` is its first); None otherwise."""
    entries: tuple[Entry, ...] = ()
    """The records of the time, when asked for (firm read); else empty."""
    unreadable: int = 0
    """Records inside ``ranges`` the reader could not decode (foreign bytes, an unknown
    schema, truncated): dead-lettered, in no ``entries``.  An undecodable record's time
    is unknown, so it counts for every note whose ranges hold it; a foreign record was
    never acknowledged, so it is not in ``records`` either."""

    @property
    def ident(self) -> tuple[int, int]:
        """The notification's identity and order: (control offset, index in its record)."""
        return self.control_offset, self.control_index

    @property
    def latency_ms(self) -> int:
        """From the last seal covering the time to this reader's receipt of the note."""
        return max(0, self.notified_at_ms - self.sealed_at_ms) if self.sealed_at_ms else 0

    @property
    def label(self) -> str:
        return format_time(self.time)


__all__ = ["EpochNote", "format_time", "parse_time"]
