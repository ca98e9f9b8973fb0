"""The acks-topic protocol: the messages as types, their rules, and their one encoding.

What a tracked process (a publisher's source, a Python stage, a Spark write unit) tells the
acker, and what an operator may order it.  The types below are the protocol; the wire is
``substreams/avro/ack.avsc``, one schema, converted both ways by the one protocol converter
(:mod:`substreams.streams.wire`) from these types: :func:`encode_ack`/:func:`decode_ack`.
Who writes and who reads: :class:`~substreams.acker.tracker.Tracker` builds every message a
tracked process writes (and the heartbeat it sends), ``substreams acker evict-source`` the
``Evict``; the acker (:mod:`~substreams.acker.core`) and the simulator read them.

Rules (what every writer must keep; the acker's side is :mod:`substreams.acker.core`):

1. *Where.*  Every message about acker substream (segment) S goes to acks partition
   :func:`segment_partition` ``(S)``: the acker orders only within a partition, and sharded
   ackers split the segments by partition.  A message about several segments is cut per
   partition (:func:`split_body`); heartbeats and evictions concern no segment and go to
   every partition the sender uses.
2. *Who.*  Every message names its ``source`` and ``incarnation`` (one per start of a source
   id).  Per (source, acks partition), an incarnation numbers its messages ``seq`` 0, 1, ...
   in the order it commits them; a heartbeat carries ``seq = -1`` and is never checked.
3. *With the records.*  ``Register``, ``AckReport`` and ``Unregister`` are written inside the
   writer's own Kafka transaction, with the records they describe, and read
   ``read_committed``: a crash loses a record together with its report, or neither.  A
   ``SourceHeartbeat`` is written outside any transaction (an idle source has none).
4. *Order within a commit.*  ``Register`` first (a source counts from the Register on: the
   first commit of a tracked writer holds it), then the ``AckReport`` (its ``entries`` and
   ``columns`` applied before its ``seals``), ``Unregister`` last.
5. *Reports.*  Per (substream, time), the XOR of the tracking ids of every SND (a record
   written) and RCV (a record done with: consumed by a stage, or delivered to a terminal
   stream by its writer) since the writer's previous commit, how many reports, records
   delivered to terminal streams and their offset ranges.  A writer that sends and
   delivers a record reports both at once (the ids cancel).  Int times of a substream with
   many of them in one commit travel as packed columns (:class:`AckBlock`), any other as an
   :class:`AckEntry`; the acker applies both alike.
6. *Seals* (``SOURCE`` role only; a ``STAGE`` never seals): downward closed, monotone
   promises: no more records at times ``<= time``; ``all_keys``: at ``Keyed(k, t <= time)``
   for every key.  A restarted source keeps the promises of the ones before it.
7. *Liveness.*  A ``SOURCE`` registered with ``evict_when_silent`` that commits nothing for
   ``acker.source_heartbeat_ms`` heartbeats; silent for ``acker.source_timeout_ms`` it is
   evicted (its ``writer``, the transactional id, fenced first).  ``Evict`` is the same by
   an operator's hand.

One encoding: this schema and nothing else.  The project is 0.x with no deployment whose
acks topics hold an older version, so no earlier ack schema is kept for reading.
"""

from __future__ import annotations

import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from operator import le
from typing import NamedTuple

from substreams.control.messages import OffsetRange, protocol_converter
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Time
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec
from substreams.streams.wire import Converter

SOURCE = "SOURCE"
"""Role of a process whose seals the acker waits for (a publisher, a Spark driver)."""
STAGE = "STAGE"
"""Role of a process that reports and never seals (a Python stage, a Spark write unit)."""


@dataclass(frozen=True, slots=True)
class Register:
    """The writer joins ``substreams`` (in its first commit): the acker counts its reports,
    and for a SOURCE waits for its seals, from this message on."""

    substreams: tuple[str, ...]
    role: str = SOURCE
    writer: str = ""
    """The source's transactional id (fenced when the source is evicted)."""
    evict_when_silent: bool = True
    """False: only an operator's ``evict-source`` evicts it, never silence (a Spark driver)."""


@dataclass(frozen=True, slots=True)
class Unregister:
    """The writer leaves (in its last commit, after its last reports): as if it sealed
    everything."""

    substreams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AckEntry:
    """The reports of one (substream, time) since the writer's previous commit: their XOR,
    how many, the records delivered to terminal streams and their offset ranges."""

    substream: str
    time: Time
    xor: int
    records: int
    reports: int
    ranges: tuple[OffsetRange, ...]


@dataclass(frozen=True, slots=True)
class SealEntry:
    """No more records from this source at times ``<= time`` (applied after the report's
    entries and columns)."""

    substream: str
    time: Time
    sealed_at_ms: int
    all_keys: bool = False
    """The keyed seal: ``time`` is an event time T covering ``Keyed(k, t <= T)`` for every k."""


_BIG_ENDIAN = sys.byteorder == "big"
assert array("i").itemsize == 4 and array("q").itemsize == 8  # the wire widths


def _column(typecode: str, data: bytes) -> array[int] | None:
    """A packed column (little-endian), or None if ``data`` is not a whole number of items."""
    col = array(typecode)
    if len(data) % col.itemsize:
        return None
    col.frombytes(data)
    if _BIG_ENDIAN:
        col.byteswap()
    return col


def pack_column(typecode: str, values: Iterable[int]) -> bytes:
    """``values`` as a packed little-endian column (OverflowError if one does not fit)."""
    col = array(typecode, values)
    if _BIG_ENDIAN:
        col.byteswap()
    return col.tobytes()


class Columns(NamedTuple):
    """A block's columns, unpacked and checked (what the acker applies)."""

    times: Sequence[int]
    xors: Sequence[int]
    """Empty: every xor is 0."""
    records: Sequence[int]
    reports: Sequence[int]
    range_counts: Sequence[int]
    streams: tuple[str, ...]
    stream_index: Sequence[int]
    partitions: Sequence[int]
    starts: Sequence[int]
    ends: Sequence[int]


@dataclass(frozen=True, slots=True)
class AckBlock:
    """``AckEntry``s of one substream at int times, as packed columns (Avro ``AckColumns``).

    Why: at one record per time (granularity 1) a report holds one entry per record.  Version
    2 sent them as arrays of longs plus one ``OffsetRange`` record per range, and decoding
    that (fastavro builds a dict per range, the converter an ``OffsetRange``) was the largest
    cost of the acker's step.  Each column is now one ``bytes`` (little-endian; see
    ``substreams/avro/ack.avsc``), unpacked with one copy (:meth:`unpack`), and the ranges
    are four columns with the stream names once.  Invariants (:meth:`unpack` checks them, the
    acker dead-letters a block breaking them): ``times``, ``records``, ``reports``,
    ``range_counts`` have n items, ``xors`` too or none (every xor 0); ``stream_index``,
    ``partitions``, ``starts``, ``ends`` have ``sum(range_counts)`` items, the entries'
    ranges in order; every stream index is < ``len(streams)``, every start <= its end."""

    substream: str
    times: bytes
    xors: bytes
    records: bytes
    reports: bytes
    range_counts: bytes
    streams: tuple[str, ...]
    stream_index: bytes
    partitions: bytes
    starts: bytes
    ends: bytes

    @classmethod
    def pack(
        cls,
        substream: str,
        times: Iterable[int],
        xors: Iterable[int],
        records: Iterable[int],
        reports: Iterable[int],
        range_counts: Iterable[int],
        ranges: Iterable[OffsetRange],
    ) -> AckBlock:
        """A block from per-entry values and the entries' ranges in order (``xors`` may be
        empty: every xor 0)."""
        index: dict[str, int] = {}
        streams: list[str] = []
        sidx: list[int] = []
        parts: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        for r in ranges:
            i = index.get(r.stream)
            if i is None:
                i = index[r.stream] = len(streams)
                streams.append(r.stream)
            sidx.append(i)
            parts.append(r.partition)
            starts.append(r.start)
            ends.append(r.end)
        return cls(
            substream, pack_column("q", times), pack_column("q", xors),
            pack_column("i", records), pack_column("i", reports), pack_column("i", range_counts),
            tuple(streams), pack_column("i", sidx), pack_column("i", parts),
            pack_column("q", starts), pack_column("q", ends),
        )

    def unpack(self) -> Columns | str:
        """The columns, or what breaks the invariants (the acker's dead-letter detail)."""
        where = f"block of substream '{self.substream}'"
        cols = []
        for name, code in _LAYOUT:
            col = _column(code, getattr(self, name))
            if col is None:
                return f"{where}: column {name} is not a whole number of {code!r} items"
            cols.append(col)
        times, xors, records, reports, counts, sidx, parts, starts, ends = cols
        n = len(times)
        if not (len(records) == len(reports) == len(counts) == n):
            return (f"{where}: {n} times but {len(records)} records, {len(reports)} reports "
                    f"and {len(counts)} range counts")
        if xors and len(xors) != n:
            return f"{where}: {n} times but {len(xors)} xors"
        if counts and min(counts) < 0:
            return f"{where}: a negative range count"
        m = sum(counts)
        if not (len(sidx) == len(parts) == len(starts) == len(ends) == m):
            return (f"{where}: range counts sum to {m}, but {len(sidx)} stream indexes, "
                    f"{len(parts)} partitions, {len(starts)} starts and {len(ends)} ends")
        if m and (min(sidx) < 0 or max(sidx) >= len(self.streams)):
            return f"{where}: a stream index outside the {len(self.streams)} streams"
        if m and min(parts) < 0:
            return f"{where}: a negative partition"
        if not all(map(le, starts, ends)):
            return f"{where}: a range whose start is after its end"
        return Columns(times, xors, records, reports, counts, self.streams, sidx, parts,
                       starts, ends)

    def problem(self) -> str | None:
        """What breaks the invariants, or None."""
        cols = self.unpack()
        return cols if isinstance(cols, str) else None

    def entries(self) -> Iterator[AckEntry]:
        """The block as the entries it stands for (for readers that count or show them);
        a malformed block (see :meth:`unpack`) raises ValueError."""
        c = self.unpack()
        if isinstance(c, str):
            raise ValueError(c)
        at = 0
        xors = c.xors or (0,) * len(c.times)
        for t, x, rec, rep, n in zip(c.times, xors, c.records, c.reports, c.range_counts,
                                     strict=True):
            yield AckEntry(self.substream, t, x, rec, rep, tuple(
                OffsetRange(c.streams[c.stream_index[i]], c.partitions[i], c.starts[i],
                            c.ends[i])
                for i in range(at, at + n)
            ))
            at += n


_LAYOUT = (("times", "q"), ("xors", "q"), ("records", "i"), ("reports", "i"),
           ("range_counts", "i"), ("stream_index", "i"), ("partitions", "i"), ("starts", "q"),
           ("ends", "q"))
"""Each packed column of :class:`AckBlock` and its item type."""


@dataclass(frozen=True, slots=True)
class AckReport:
    """What one commit of a writer reports and seals (one per acks partition it touches)."""

    entries: tuple[AckEntry, ...]
    seals: tuple[SealEntry, ...] = ()
    columns: tuple[AckBlock, ...] = ()
    """Entries at int times of substreams with many of them, as packed columns (applied
    with ``entries``, before ``seals``)."""

    def all_entries(self) -> Iterator[AckEntry]:
        """``entries`` and then every block's entries."""
        yield from self.entries
        for block in self.columns:
            yield from block.entries()


@dataclass(frozen=True, slots=True)
class SourceHeartbeat:
    """Liveness.  Sent outside the source's transactions (an idle source commits nothing),
    so it carries no sequence number the acker checks: only its incarnation counts."""


@dataclass(frozen=True, slots=True)
class Evict:
    """An operator's order to evict ``source`` (the sender is the operator, not a source)."""

    source: str
    reason: str


AckBody = Register | Unregister | AckReport | SourceHeartbeat | Evict


@dataclass(frozen=True, slots=True)
class AckMessage:
    """One record of the acks topic: who sent it (source, incarnation), its sequence number
    in the acks partition (-1: a heartbeat), and what it says."""

    source: str
    seq: int
    sent_at_ms: int
    body: AckBody
    incarnation: str = ""

    def substreams(self) -> set[str]:
        """The substreams this message concerns (for traffic accounting)."""
        b = self.body
        if isinstance(b, Register | Unregister):
            return set(b.substreams)
        if isinstance(b, AckReport):
            return ({e.substream for e in b.entries} | {s.substream for s in b.seals}
                    | {k.substream for k in b.columns})
        return set()


@cache
def _converter() -> Converter:
    return protocol_converter("ack")


def encode_ack(msg: AckMessage) -> bytes:
    conv = _converter()
    return protocol_codec("ack").encode(conv.root_encoder(AckMessage)(msg))


def ack_headers() -> list[tuple[str, bytes]]:
    return protocol_codec("ack").headers()


def decode_ack(value: bytes, headers: Iterable[tuple[str, bytes]] | None) -> AckMessage:
    """Decode one acks-topic value; :class:`ProtocolError` if it is not an AckMessage
    written with our schema (missing/wrong fingerprint, garbage)."""
    fp = dict(headers or ()).get(HEADER_FINGERPRINT)
    if fp is None:
        raise ProtocolError("ack message without a schema fingerprint header")
    try:
        conv = _converter()
        msg: AckMessage = conv.root_decoder(AckMessage)(
            protocol_codec("ack").decode(value, fp)
        )
        return msg
    except SubstreamsError as exc:
        raise ProtocolError(str(exc)) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"ack message is malformed: {exc}") from exc


def acks_partition(source: str, partitions: int) -> int:
    """The *home* partition of a name (a source before sharding; kept for tools that write
    one message somewhere deterministic)."""
    return zlib.crc32(source.encode()) % partitions


def segment_partition(substream: str, partitions: int) -> int:
    """The acks partition of every message about acker substream (segment) ``substream``."""
    return zlib.crc32(substream.encode()) % partitions


def shard_partitions(shard: int, shards: int, partitions: int) -> tuple[int, ...]:
    """The acks partitions shard ``shard`` of ``shards`` owns (static: ``p % shards``)."""
    if not 0 <= shard < shards <= partitions:
        raise SubstreamsError(
            f"acker shard {shard} of {shards} over {partitions} acks partitions: need "
            "0 <= shard < shards <= acker.acks_partitions"
        )
    return tuple(p for p in range(partitions) if p % shards == shard)


def split_body(body: AckBody, partition_of: Callable[[str], int]) -> list[tuple[int, AckBody]]:
    """``body`` cut into one part per acks partition (in partition order), each holding
    what concerns the segments of that partition; a body about no substream (heartbeat,
    evict) is returned as is under partition -1 (the caller decides where it goes)."""
    if isinstance(body, Register):
        groups: dict[int, list[str]] = {}
        for sub in body.substreams:
            groups.setdefault(partition_of(sub), []).append(sub)
        return [(p, Register(tuple(subs), body.role, body.writer, body.evict_when_silent))
                for p, subs in sorted(groups.items())]
    if isinstance(body, Unregister):
        groups = {}
        for sub in body.substreams:
            groups.setdefault(partition_of(sub), []).append(sub)
        return [(p, Unregister(tuple(subs))) for p, subs in sorted(groups.items())]
    if isinstance(body, AckReport):
        entries: dict[int, list[AckEntry]] = {}
        seals: dict[int, list[SealEntry]] = {}
        blocks: dict[int, list[AckBlock]] = {}
        for e in body.entries:
            entries.setdefault(partition_of(e.substream), []).append(e)
        for s in body.seals:
            seals.setdefault(partition_of(s.substream), []).append(s)
        for k in body.columns:
            blocks.setdefault(partition_of(k.substream), []).append(k)
        return [
            (p, AckReport(
                tuple(entries.get(p, ())), tuple(seals.get(p, ())), tuple(blocks.get(p, ())),
            ))
            for p in sorted(entries.keys() | seals.keys() | blocks.keys())
        ]
    return [(-1, body)]


def now_ms() -> int:
    return int(time.time() * 1000)
