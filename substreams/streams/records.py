"""The values that travel on data topics, as Python types."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import repeat
from typing import Any

from substreams.frontier import Time, time_from_wire, time_to_wire


@dataclass(frozen=True, slots=True)
class SentRecord:
    """What a publisher hands to its mechanism hooks for every record it writes."""

    stream: str
    partition: int
    order_key: int
    tracking_id: int
    times: Mapping[str, Time]
    dead_lettered: bool = False
    """Late under a ``late: dead_letter`` seal policy: written to the dead-letter topic, not
    to the stream (``partition`` is where it would have gone)."""


_SENT_SLOTS = tuple(getattr(SentRecord, f.name).__set__ for f in fields(SentRecord))
"""The slot setter of every ``SentRecord`` field, in field order (``sent_records``)."""


def sent_record(
    stream: str, partition: int, order_key: int, tracking_id: int, times: Mapping[str, Time]
) -> SentRecord:
    """``SentRecord(stream, partition, order_key, tracking_id, times)``, its slots set
    directly: half the frozen dataclass's ``__init__`` (see :func:`sent_records`), paid by
    ``Publisher.publish`` on every record."""
    record = object.__new__(SentRecord)
    set_stream, set_partition, set_key, set_id, set_times, set_dead = _SENT_SLOTS
    set_stream(record, stream)
    set_partition(record, partition)
    set_key(record, order_key)
    set_id(record, tracking_id)
    set_times(record, times)
    set_dead(record, False)
    return record


def sent_records(
    stream: str,
    partitions: Sequence[int],
    order_keys: Sequence[int],
    tracking_ids: Sequence[int],
    times: Sequence[Mapping[str, Time]],
) -> list[SentRecord]:
    """``[SentRecord(stream, p, k, i, t) for ...]``, a batch's records, built a field at a
    time: each field's column written through its slot's setter in one C-level loop.

    Why not the dataclass's ``__init__``: being frozen, it sets every field through an
    ``object.__setattr__`` call, which costs a publisher more per record than framing the
    record's ids.  The same objects (the unit tests compare them field by field)."""
    n = len(partitions)
    records = list(map(object.__new__, repeat(SentRecord, n)))
    columns: tuple[Iterable[object], ...] = (
        repeat(stream, n), partitions, order_keys, tracking_ids, times, repeat(False, n)
    )
    for setter, column in zip(_SENT_SLOTS, columns, strict=True):
        deque(map(setter, records, column), maxlen=0)  # consumes the map: sets the slots
    return records


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded data record: Sherlock's entry, with Kafka's offset as its index."""

    stream: str
    partition: int
    index: int
    order_key: int
    tracking_id: int
    source: str
    times: Mapping[str, Time]
    payload: Mapping[str, Any]


def times_to_wire(times: Mapping[str, Time]) -> dict[str, Any]:
    return {name: time_to_wire(t) for name, t in times.items()}


def times_from_wire(times: Mapping[str, Mapping[str, Any]]) -> dict[str, Time]:
    return {name: time_from_wire(dict(t)) for name, t in times.items()}
