"""The control-topic protocol written down as types (seed 000, mapped onto Kafka).

A substream's control topic is the only thing a subscriber needs to follow progress; it does
not care whether the acker or the punctuation aligner wrote it.  The messages:

- ``FrontierSnapshot{lower, upper, data_from}``: Strymon's InitialFrontierSnapshot, written
  periodically because a Kafka subscriber can join at any offset.  ``upper`` holds the maximal
  times seen; ``data_from`` says where a late subscriber starts reading the data topic.
- ``FrontierUpdate{updates}``: Strymon's LowerFrontierUpdate, (time, +1|-1) changes.
- ``EpochComplete{time, ranges, records}``: the per-time data announcement.  Strymon pushes
  the data itself; on Kafka the data is already durable in the data topic, so the
  announcement carries the exact offset ranges that hold every record of ``time``.  This is
  what makes a firm bound possible for a reader: it reads exactly those ranges.
- ``WriterHeartbeat``: liveness of the writer, for standby ackers.
- ``Checkpoint``: the acker's recoverable state (ignored by subscribers).
- ``SourceEvicted``: the acker stopped waiting for a source (liveness; hash-chained like the
  rest, so an eviction is on the record).
- ``ChainResume``: an operator accepted a broken hash chain at one offset (``substreams
  control resume``); readers that stop at that break continue past it (see docs/design.md).

Every record also carries (writer, seq, prev_digest, digest): a hash chain per writer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from substreams.frontier import (
    Antichain,
    Time,
    UpperAntichain,
    less_equal,
    time_from_wire,
    time_to_wire,
)

NS = "substreams."


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one data partition."""

    stream: str
    partition: int
    start: int
    end: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
        }

    @staticmethod
    def from_wire(d: Mapping[str, Any]) -> OffsetRange:
        return OffsetRange(d["stream"], int(d["partition"]), int(d["start"]), int(d["end"]))


def merge_ranges(ranges: Sequence[OffsetRange]) -> tuple[OffsetRange, ...]:
    """One range per (stream, partition): the hull of the given ones."""
    hull: dict[tuple[str, int], tuple[int, int]] = {}
    for r in ranges:
        key = (r.stream, r.partition)
        lo, hi = hull.get(key, (r.start, r.end))
        hull[key] = (min(lo, r.start), max(hi, r.end))
    return tuple(OffsetRange(s, p, lo, hi) for (s, p), (lo, hi) in sorted(hull.items()))


@dataclass(frozen=True, slots=True)
class FrontierSnapshot:
    substream: str
    lower: Antichain
    upper: UpperAntichain
    data_from: tuple[OffsetRange, ...] = ()


@dataclass(frozen=True, slots=True)
class FrontierUpdate:
    substream: str
    updates: tuple[tuple[Time, int], ...]


@dataclass(frozen=True, slots=True)
class EpochComplete:
    substream: str
    time: Time
    ranges: tuple[OffsetRange, ...]
    records: int
    sealed_at_ms: int
    lower_updates: tuple[tuple[Time, int], ...] = ()
    until: Time | None = None
    """A session's last time (``time`` is its first); None: the notification is ``time``."""

    def covers(self, t: Time) -> bool:
        """True iff a record at time ``t`` belongs to this notification."""
        return epoch_covers(self.time, self.until, t)


def epoch_covers(time: Time, until: Time | None, t: Time) -> bool:
    """Whether a record at ``t`` belongs to the epoch announced as ``time`` (``until``: the
    last time of a session, whose records have every time of its key in between)."""
    if until is None:
        return t == time
    return less_equal(time, t) and less_equal(t, until)


@dataclass(frozen=True, slots=True)
class WriterHeartbeat:
    substream: str | None = None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    acks_offsets: tuple[tuple[int, int], ...]
    state: bytes


@dataclass(frozen=True, slots=True)
class SourceEvicted:
    """The acker no longer waits for ``source``'s seals in ``substream`` (see the acker)."""

    substream: str
    source: str
    incarnation: str
    last_seen_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class ChainResume:
    """An operator's decision, on the record: the record at ``offset`` of this topic, of
    ``writer``'s chain, with sequence number ``seq`` and digest ``digest``, is accepted as is
    and the chain continues from it.  ``digest`` pins the exact record that was judged."""

    writer: str
    offset: int
    seq: int
    digest: bytes
    operator: str
    reason: str


ControlBody = (
    FrontierSnapshot
    | FrontierUpdate
    | EpochComplete
    | WriterHeartbeat
    | Checkpoint
    | SourceEvicted
    | ChainResume
)


@dataclass(frozen=True, slots=True)
class ControlRecord:
    writer: str
    seq: int
    prev_digest: bytes
    digest: bytes
    written_at_ms: int
    body: ControlBody


# --- wire form (fastavro dicts; unions as (name, value) tuples) ----------------------------


def _times(ts: Sequence[Time]) -> list[Any]:
    return [time_to_wire(t) for t in ts]


def body_to_wire(body: ControlBody) -> tuple[str, dict[str, Any]]:
    if isinstance(body, FrontierSnapshot):
        return NS + "FrontierSnapshot", {
            "substream": body.substream,
            "lower": _times(body.lower.elements()),
            "upper": _times(body.upper.elements()),
            "data_from": [r.to_wire() for r in body.data_from],
        }
    if isinstance(body, FrontierUpdate):
        return NS + "FrontierUpdate", {
            "substream": body.substream,
            "updates": [{"time": time_to_wire(t), "delta": d} for t, d in body.updates],
        }
    if isinstance(body, EpochComplete):
        return NS + "EpochComplete", {
            "substream": body.substream,
            "time": time_to_wire(body.time),
            "ranges": [r.to_wire() for r in body.ranges],
            "records": body.records,
            "sealed_at_ms": body.sealed_at_ms,
            "lower_updates": [{"time": time_to_wire(t), "delta": d} for t, d in body.lower_updates],
            "until": None if body.until is None else time_to_wire(body.until),
        }
    if isinstance(body, WriterHeartbeat):
        return NS + "WriterHeartbeat", {"substream": body.substream}
    if isinstance(body, SourceEvicted):
        return NS + "SourceEvicted", {
            "substream": body.substream,
            "source": body.source,
            "incarnation": body.incarnation,
            "last_seen_ms": body.last_seen_ms,
            "reason": body.reason,
        }
    if isinstance(body, ChainResume):
        return NS + "ChainResume", {
            "writer": body.writer,
            "offset": body.offset,
            "seq": body.seq,
            "digest": body.digest,
            "operator": body.operator,
            "reason": body.reason,
        }
    return NS + "Checkpoint", {
        "acks_offsets": [{"partition": p, "offset": o} for p, o in body.acks_offsets],
        "state": body.state,
    }


def _optional_time(value: Any) -> Time | None:
    """A ``["null", Time]`` union as decoded with record names: None or (name, time)."""
    if value is None:
        return None
    return time_from_wire(value[1] if isinstance(value, tuple) else value)


def body_from_wire(name: str, d: Mapping[str, Any]) -> ControlBody:
    short = name.removeprefix(NS)
    if short == "FrontierSnapshot":
        return FrontierSnapshot(
            d["substream"],
            Antichain(time_from_wire(t) for t in d["lower"]),
            UpperAntichain(time_from_wire(t) for t in d["upper"]),
            tuple(OffsetRange.from_wire(r) for r in d["data_from"]),
        )
    if short == "FrontierUpdate":
        return FrontierUpdate(
            d["substream"],
            tuple((time_from_wire(u["time"]), int(u["delta"])) for u in d["updates"]),
        )
    if short == "EpochComplete":
        return EpochComplete(
            d["substream"],
            time_from_wire(d["time"]),
            tuple(OffsetRange.from_wire(r) for r in d["ranges"]),
            int(d["records"]),
            int(d["sealed_at_ms"]),
            tuple((time_from_wire(u["time"]), int(u["delta"])) for u in d.get("lower_updates", ())),
            _optional_time(d.get("until")),
        )
    if short == "WriterHeartbeat":
        return WriterHeartbeat(d.get("substream"))
    if short == "SourceEvicted":
        return SourceEvicted(
            d["substream"], d["source"], d["incarnation"], int(d["last_seen_ms"]), d["reason"]
        )
    if short == "ChainResume":
        return ChainResume(
            d["writer"], int(d["offset"]), int(d["seq"]), bytes(d["digest"]), d["operator"],
            d["reason"],
        )
    if short == "Checkpoint":
        return Checkpoint(
            tuple((int(x["partition"]), int(x["offset"])) for x in d["acks_offsets"]),
            bytes(d["state"]),
        )
    raise ValueError(f"unknown control body type {name!r}")


def record_to_wire(rec: ControlRecord) -> dict[str, Any]:
    return {
        "writer": rec.writer,
        "seq": rec.seq,
        "prev_digest": rec.prev_digest,
        "digest": rec.digest,
        "written_at_ms": rec.written_at_ms,
        "body": body_to_wire(rec.body),
    }


def record_from_wire(d: Mapping[str, Any]) -> ControlRecord:
    name, body = d["body"]
    return ControlRecord(
        d["writer"],
        int(d["seq"]),
        bytes(d["prev_digest"]),
        bytes(d["digest"]),
        int(d["written_at_ms"]),
        body_from_wire(name, body),
    )
