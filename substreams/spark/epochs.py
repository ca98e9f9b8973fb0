"""Epochs as Spark sees them: a struct mirroring the Avro ``Time``, plus a text label.

Why a struct (``epoch``: ``key`` string nullable, ``coords`` array<long>, ``kind`` string):
it is the Avro ``substreams.Time`` of ``substreams/avro/time.avsc`` field for field
(:func:`substreams.frontier.time_to_wire`), so one Spark type holds every kind of time (int,
tuple, keyed) without parsing, and ``epoch.coords[0]`` / ``epoch.key`` are ordinary column
expressions.  ``epoch_label`` is a reversible text form for printing and for readers that
only want a string; ``epoch_int`` / ``epoch_key`` expose the parts a query computes on most
(a window index, a session's user and start).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from substreams.control.notes import format_time as format_time
from substreams.control.notes import parse_time as parse_time
from substreams.frontier import Keyed, Time, time_from_wire, time_to_wire

META_COLUMNS = (
    "epoch",
    "epoch_label",
    "epoch_int",
    "epoch_key",
    "order_key",
    "partition",
    "offset",
    "control_offset",
    "control_index",
    "sealed_at_ms",
    "records",
    "is_notification",
)
"""The source's columns after the payload's (types in :mod:`substreams.spark.schema`)."""


EpochStruct = tuple[str | None, list[int], str]
"""The ``epoch`` column's value as a Python Data Source row gives it: (key, coords, kind)."""


def epoch_struct(t: Time) -> EpochStruct:
    """The ``epoch`` struct of ``t`` (the Avro ``Time`` fields, in their order)."""
    wire = time_to_wire(t)
    return wire["key"], list(wire["coords"]), str(wire["kind"])


def struct_time(value: Mapping[str, Any] | tuple[Any, ...] | Any) -> Time:
    """Inverse of :func:`epoch_struct`: from a dict (Arrow ``to_pylist``), a tuple, or a
    Spark ``Row`` (which has ``asDict``)."""
    if hasattr(value, "asDict"):
        value = value.asDict()
    if isinstance(value, Mapping):
        return time_from_wire(value)
    key, coords, kind = value
    return time_from_wire({"key": key, "coords": list(coords), "kind": kind})


def epoch_int(t: Time) -> int | None:
    """The integer of an int time (or of a keyed int time: a session's start), else None."""
    inner = t.time if isinstance(t, Keyed) else t
    return inner if isinstance(inner, int) else None


def epoch_key(t: Time) -> str | None:
    """The key of a keyed time (session user, per-key key), else None."""
    return t.key if isinstance(t, Keyed) else None
