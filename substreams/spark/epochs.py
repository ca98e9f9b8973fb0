"""Epochs as Spark sees them: a reversible text form of a logical time.

Why text: Spark columns need one type for every kind of time (int, tuple, keyed), and a
stable string groups, sorts and prints well.  ``epoch_int`` / ``epoch_key`` expose the parts
a query wants to compute on (a window index, a session's user and start) without parsing.
"""

from __future__ import annotations

from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time

META_COLUMNS = (
    "epoch",
    "epoch_int",
    "epoch_key",
    "order_key",
    "partition",
    "offset",
    "control_offset",
    "sealed_at_ms",
    "records",
    "is_notification",
)
"""The source's columns after the payload's (types in :mod:`substreams.spark.schema`)."""


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


def epoch_int(t: Time) -> int | None:
    """The integer of an int time (or of a keyed int time: a session's start), else None."""
    inner = t.time if isinstance(t, Keyed) else t
    return inner if isinstance(inner, int) else None


def epoch_key(t: Time) -> str | None:
    """The key of a keyed time (session user, per-key key), else None."""
    return t.key if isinstance(t, Keyed) else None
