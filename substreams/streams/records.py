"""The values that travel on data topics, as Python types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
