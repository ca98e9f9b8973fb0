"""Logical times and their partial order.

Progress tracking (modelled on Timely Dataflow's ``progress`` module) only needs a
*partial* order on times: a frontier is a set of times, and a time ``t`` is
*complete* with respect to a frontier once no frontier element is ``<= t``.
Three kinds of time are supported, all hashable and immutable:

* ``int`` -- totally ordered (event time, epoch, offset).
* ``tuple[int, ...]`` -- the product order: ``a <= b`` iff ``len(a) == len(b)`` and
  ``a[i] <= b[i]`` for every ``i``. Tuples of different lengths are incomparable.
  This is Timely's ``Product`` time, used for nested scopes / multi-dimensional time.
* :class:`Keyed` -- a time scoped to one substream key (session, per-key stream).
  Two keyed times are comparable only when their keys are equal, and then by their
  inner time; a keyed time is incomparable with any un-keyed time. Hence progress of
  one key never implies anything about another key.

Times fall into disjoint *chain classes* (same kind, same tuple length, same key):
times of different classes are always incomparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypedDict

__all__ = [
    "Keyed",
    "Time",
    "WireTime",
    "less_equal",
    "less_than",
    "sort_key",
    "time_from_wire",
    "time_to_wire",
]


def _is_coords(value: object) -> bool:
    """True for a tuple of plain ints (a valid product-order time)."""
    return type(value) is tuple and all(type(c) is int for c in value)


@dataclass(frozen=True, slots=True)
class Keyed:
    """A logical time that belongs to the substream ``key``.

    Keyed times let per-key substreams (sessions, per-user streams) progress
    independently: ``Keyed("a", 5)`` and ``Keyed("b", 3)`` are incomparable, so a
    frontier can hold one minimal time per key at once.
    """

    key: str
    time: int | tuple[int, ...]

    def __post_init__(self) -> None:
        # Validate eagerly: a malformed inner time would silently compare as
        # "incomparable" everywhere and stall progress instead of failing loudly.
        if type(self.key) is not str:
            raise TypeError(f"Keyed.key must be str, got {type(self.key).__name__}")
        if type(self.time) is not int and not _is_coords(self.time):
            raise TypeError(f"Keyed.time must be int or tuple[int, ...], got {self.time!r}")

    def __repr__(self) -> str:
        return f"Keyed({self.key!r}, {self.time!r})"


Time: TypeAlias = int | tuple[int, ...] | Keyed
"""Any logical time: ``int``, ``tuple[int, ...]`` or :class:`Keyed`."""


def less_equal(a: Time, b: Time) -> bool:
    """``a <= b`` in the partial order; False whenever ``a`` and ``b`` are incomparable."""
    if type(a) is int and type(b) is int:  # hot path: plain epochs/offsets
        return a <= b
    if type(a) is tuple and type(b) is tuple:
        if len(a) != len(b):
            return False
        return all(x <= y for x, y in zip(a, b, strict=True))
    if type(a) is Keyed and type(b) is Keyed:
        return a.key == b.key and less_equal(a.time, b.time)
    return False


def less_than(a: Time, b: Time) -> bool:
    """``a < b``: ``a <= b`` and ``a != b``."""
    if type(a) is int and type(b) is int:
        return a < b
    return a != b and less_equal(a, b)


SortKey: TypeAlias = tuple[int, str, int, tuple[int, ...]]


def sort_key(t: Time) -> SortKey:
    """A total-order key over *all* times, used for deterministic output order.

    The key is ``(keyed?, key, arity, coords)`` with ``arity == -1`` for int-based
    times. Its first three components identify the chain class, and coordinates
    compare lexicographically, which is a *linear extension* of the product order:
    ``less_than(a, b)`` implies ``sort_key(a) < sort_key(b)``. Algorithms rely on
    this to process times so that no later time is below an earlier one.
    """
    if type(t) is int:
        return (0, "", -1, (t,))
    if type(t) is tuple:
        return (0, "", len(t), t)
    if type(t) is Keyed:
        inner = t.time
        if type(inner) is int:
            return (1, t.key, -1, (inner,))
        assert isinstance(inner, tuple)
        return (1, t.key, len(inner), inner)
    raise TypeError(f"not a logical time: {t!r}")


class WireTime(TypedDict):
    """Avro-friendly encoding of a :data:`Time` (one record schema for all kinds)."""

    key: str | None
    coords: list[int]
    kind: Literal["int", "tuple"]


def time_to_wire(t: Time) -> WireTime:
    """Encode ``t`` as ``{"key", "coords", "kind"}``; inverse of :func:`time_from_wire`.

    ``kind`` is needed because ``5`` and ``(5,)`` are different (incomparable) times
    that would otherwise share ``coords == [5]``.
    """
    if type(t) is int:
        return {"key": None, "coords": [t], "kind": "int"}
    if type(t) is tuple:
        return {"key": None, "coords": list(t), "kind": "tuple"}
    if type(t) is Keyed:
        inner = t.time
        if type(inner) is int:
            return {"key": t.key, "coords": [inner], "kind": "int"}
        assert isinstance(inner, tuple)
        return {"key": t.key, "coords": list(inner), "kind": "tuple"}
    raise TypeError(f"not a logical time: {t!r}")


def time_from_wire(d: Mapping[str, Any]) -> Time:
    """Decode the output of :func:`time_to_wire`, validating its shape."""
    key = d.get("key")
    coords = d["coords"]
    kind = d["kind"]
    if key is not None and not isinstance(key, str):
        raise ValueError(f"wire time key must be str or None, got {key!r}")
    if not isinstance(coords, list | tuple) or not all(type(c) is int for c in coords):
        raise ValueError(f"wire time coords must be a list of ints, got {coords!r}")
    inner: int | tuple[int, ...]
    if kind == "int":
        if len(coords) != 1:
            raise ValueError(f"wire time of kind 'int' needs exactly one coord, got {coords!r}")
        inner = coords[0]
    elif kind == "tuple":
        inner = tuple(coords)
    else:
        raise ValueError(f"unknown wire time kind {kind!r}")
    return inner if key is None else Keyed(key, inner)
