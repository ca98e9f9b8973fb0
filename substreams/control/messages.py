"""The control-topic protocol written down as types (Strymon's, on Kafka).

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
- ``EpochsComplete{epochs, lower_updates}``: a run of completed times of one substream in
  one record (the acker writes one per substream and step when several times terminate
  together: at one record per epoch, a control record per epoch bounded its rate).  It means
  exactly the ``EpochComplete``s of its epochs, in order, with ``lower_updates`` after the
  last one: :func:`completions` expands either form, and a reader that needs a position for
  a notification uses (control offset, index in the record).
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
from functools import cache
from typing import Any

from substreams.frontier import (
    Antichain,
    Time,
    UpperAntichain,
    less_equal,
    time_from_wire,
    time_to_wire,
)
from substreams.streams.schemas import expanded, raw_schema
from substreams.streams.wire import Adapter, Converter


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one data partition."""

    stream: str
    partition: int
    start: int
    end: int


def _slot_setters(cls: type, names: Sequence[str]) -> tuple[Any, ...]:
    return tuple(getattr(cls, n).__set__ for n in names)


_new = object.__new__
_RANGE_SET = _slot_setters(OffsetRange, ("stream", "partition", "start", "end"))


def offset_range(stream: str, partition: int, start: int, end: int) -> OffsetRange:
    """``OffsetRange(stream, partition, start, end)`` without the frozen dataclass's
    ``__init__`` (an ``object.__setattr__`` call per field): the acker builds one per
    completed time, so at one record per time the constructor is on its hot path.  The
    same object: no field has a default or a check to skip."""
    r = _new(OffsetRange)
    s_stream, s_partition, s_start, s_end = _RANGE_SET
    s_stream(r, stream)
    s_partition(r, partition)
    s_start(r, start)
    s_end(r, end)
    return r


def merge_ranges(ranges: Sequence[OffsetRange]) -> tuple[OffsetRange, ...]:
    """One range per (stream, partition): the hull of the given ones."""
    if len(ranges) <= 1:  # already merged (the acker's common case: one partition per time)
        return tuple(ranges)
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
class Completion:
    """One completed time inside an :class:`EpochsComplete` (an ``EpochComplete``'s
    per-time fields)."""

    time: Time
    ranges: tuple[OffsetRange, ...]
    records: int
    sealed_at_ms: int
    until: Time | None = None


_COMPLETION_SET = _slot_setters(
    Completion, ("time", "ranges", "records", "sealed_at_ms", "until")
)


def completion(
    time: Time, ranges: tuple[OffsetRange, ...], records: int, sealed_at_ms: int,
    until: Time | None = None,
) -> Completion:
    """``Completion(...)`` without the frozen dataclass's ``__init__`` (see
    :func:`offset_range`): one per completed time in the acker's hot loop."""
    c = _new(Completion)
    s_time, s_ranges, s_records, s_sealed, s_until = _COMPLETION_SET
    s_time(c, time)
    s_ranges(c, ranges)
    s_records(c, records)
    s_sealed(c, sealed_at_ms)
    s_until(c, until)
    return c


@dataclass(frozen=True, slots=True)
class EpochsComplete:
    """Several completed times of ``substream`` in one record, in notification order.

    Invariants (the writer's, checked by nothing else): ``epochs`` is non-empty and in the
    order a reader must announce them (a linear extension of the partial order, as for
    consecutive ``EpochComplete`` records); ``lower_updates`` apply after the last epoch."""

    substream: str
    epochs: tuple[Completion, ...]
    lower_updates: tuple[tuple[Time, int], ...] = ()


def completions(body: object) -> tuple[EpochComplete, ...]:
    """The notifications a control record's body carries, in order: itself for an
    ``EpochComplete``, one per epoch for an ``EpochsComplete`` (its ``lower_updates`` on the
    last), none for any other body.  Every reader of notifications goes through here, so
    both forms mean the same thing everywhere.  A reader that follows the lower frontier
    applies a run's changes once, after its last time
    (:meth:`~substreams.control.subscription.SubscriptionFrontiers.complete_many`): between
    two epochs of one record the writer's frontier is not defined."""
    if isinstance(body, EpochComplete):
        return (body,)
    if isinstance(body, EpochsComplete):
        last = len(body.epochs) - 1
        return tuple(
            EpochComplete(
                body.substream, c.time, c.ranges, c.records, c.sealed_at_ms,
                body.lower_updates if i == last else (), c.until,
            )
            for i, c in enumerate(body.epochs)
        )
    return ()


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
    | EpochsComplete
)


@dataclass(frozen=True, slots=True)
class ControlRecord:
    writer: str
    seq: int
    prev_digest: bytes
    digest: bytes
    written_at_ms: int
    body: ControlBody


# --- wire form: one converter (substreams.streams.wire) ----------------------------------

TIME = Adapter(time_to_wire, time_from_wire)
"""``substreams.Time`` on the wire (shared by every protocol schema)."""

TIME_CONTAINERS: dict[type, Any] = {Antichain: Time, UpperAntichain: Time}
"""Frontiers travel as arrays of times."""


def protocol_converter(schema: str, names: Mapping[str, type] | None = None) -> Converter:
    """The converter of one of our protocol schemas (``substreams/avro/<schema>.avsc``), with
    the adapters every protocol shares: times and frontiers.  Callers cache it."""
    return Converter(expanded(raw_schema(schema)), names=names, adapters={"Time": TIME},
                     containers=TIME_CONTAINERS)


@cache
def _converter() -> Converter:
    return protocol_converter("control")


def record_to_wire(rec: ControlRecord) -> dict[str, Any]:
    """The fastavro datum of ``rec`` (unions as ``(name, value)``)."""
    datum: dict[str, Any] = _converter().root_encoder(ControlRecord)(rec)
    return datum


def record_from_wire(d: Mapping[str, Any]) -> ControlRecord:
    """The control record of a fastavro datum decoded with record names."""
    rec: ControlRecord = _converter().root_decoder(ControlRecord)(d)
    return rec
