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

8. *Size.*  No acks message is longer than :data:`MAX_ACK_BYTES` encoded, whatever the keys
   and range counts: a commit's ``AckReport`` that would be is cut into consecutive reports
   (:func:`bounded`), each its own message with its own ``seq``, in the commit's order --
   entries, then columns, then seals -- so the acker applies them exactly as the whole one
   (its entries are additive: one entry's ranges may be cut over several entries of the same
   time, the last carrying its xor and counts; a block's rows over several blocks).  A step
   of the acker between two pieces changes nothing either: each (substream, time) has one
   entry per commit, whose XOR changes only with its last piece, and the seals come last.  All of
   them go into the one transaction: the acker sees all or none.  An item that alone is
   longer than the bound (a seal of a key near the bound's size) travels alone.

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
from substreams.frontier import Keyed, Time
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


# -- the size bound (rule 8) ---------------------------------------------------------------

MAX_ACK_BYTES = 256 * 1024
"""The most bytes one encoded acks message may take: a quarter of Kafka's default
``message.max.bytes`` (1 MiB), so that several fit in one produce request and a broker or
topic set lower than the default still takes them (rule 8)."""

_FILL = 0.75
"""What share of the bound a cut aims at: estimates are rough, the encoded size decides."""

Item = AckEntry | AckBlock | SealEntry
"""One indivisible-or-cuttable part of a report, in apply order (entries, blocks, seals)."""


def _time_estimate(t: Time) -> int:
    """About the encoded bytes of ``t`` (Avro ``Time``: key union, coords, kind)."""
    key = 1
    if isinstance(t, Keyed):
        key, t = len(t.key) + 2, t.time
    return key + 3 + (7 if type(t) is int else 7 * len(t))  # type: ignore[arg-type]


def _estimate(item: Item) -> int:
    """About the encoded bytes of ``item`` (why rough: it only chooses where to cut; the
    encoded size is checked, and a piece over the bound is cut again).  Offsets and times
    are taken as 6-7 byte varints, counts as 1-2."""
    if isinstance(item, AckEntry):
        return (len(item.substream) + _time_estimate(item.time) + (10 if item.xor else 1) + 7
                + sum(len(r.stream) + 15 for r in item.ranges))
    if isinstance(item, SealEntry):
        return len(item.substream) + _time_estimate(item.time) + 9
    return (len(item.substream) + 6 + sum(len(s) + 2 for s in item.streams)
            + sum(len(getattr(item, name)) + 2 for name, _ in _LAYOUT))


def _parts(n: int, k: int) -> list[tuple[int, int]]:
    """``range(n)`` as ``min(k, n)`` consecutive non-empty slices of nearly equal length."""
    k = max(1, min(k, n))
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def _cut_entry(entry: AckEntry, k: int) -> list[Item] | None:
    """``entry`` as up to ``k`` entries of the same time whose ranges together are its
    ranges, the *last* with its xor and counts (the others add ranges only); None if it
    has at most one range.

    Why the last: a part that adds only ranges leaves the time's XOR as it was, so however
    the acker's steps fall between the pieces, the time cannot terminate before every range
    of the entry is in (its XOR reaches zero only with the last part, as with the whole)."""
    ranges = entry.ranges
    if len(ranges) < 2:
        return None
    out: list[Item] = [
        AckEntry(entry.substream, entry.time, 0, 0, 0, ranges[a:b])
        for a, b in _parts(len(ranges), k)
    ]
    last = out[-1]
    assert isinstance(last, AckEntry)
    out[-1] = AckEntry(entry.substream, entry.time, entry.xor, entry.records, entry.reports,
                       last.ranges)
    return out


def _cut_block(block: AckBlock, k: int) -> list[Item] | None:
    """``block`` as up to ``k`` blocks of consecutive rows (each with only the streams it
    names), or its one row as an entry cut by :func:`_cut_entry`; None if it cannot be cut
    (one row with one range, or malformed: it travels as it is and the acker refuses it)."""
    c = block.unpack()
    if isinstance(c, str):
        return None
    n = len(c.times)
    if n < 2:
        return _cut_entry(next(block.entries()), k) if n == 1 else None
    at = [0]
    for count in c.range_counts:
        at.append(at[-1] + count)
    out: list[Item] = []
    for a, b in _parts(n, k):
        lo, hi = at[a], at[b]
        sidx = c.stream_index[lo:hi]
        used = sorted(set(sidx))
        if len(used) == len(c.streams):
            streams, index = c.streams, list(sidx)
        else:
            where = {old: new for new, old in enumerate(used)}
            streams, index = tuple(c.streams[i] for i in used), [where[i] for i in sidx]
        out.append(AckBlock(
            block.substream, pack_column("q", c.times[a:b]),
            pack_column("q", c.xors[a:b]) if c.xors else b"",
            pack_column("i", c.records[a:b]), pack_column("i", c.reports[a:b]),
            pack_column("i", c.range_counts[a:b]), streams, pack_column("i", index),
            pack_column("i", c.partitions[lo:hi]), pack_column("q", c.starts[lo:hi]),
            pack_column("q", c.ends[lo:hi]),
        ))
    return out


def _cut(item: Item, k: int) -> list[Item] | None:
    if isinstance(item, AckEntry):
        return _cut_entry(item, k)
    if isinstance(item, AckBlock):
        return _cut_block(item, k)
    return None


def _report(items: Sequence[Item]) -> AckReport:
    """The report of consecutive items (in apply order, so entries, blocks and seals each
    keep their place)."""
    return AckReport(
        tuple(i for i in items if isinstance(i, AckEntry)),
        tuple(i for i in items if isinstance(i, SealEntry)),
        tuple(i for i in items if isinstance(i, AckBlock)),
    )


def _groups(items: Sequence[Item], sizes: Sequence[int], k: int) -> list[tuple[int, int]]:
    """``items`` as at least two (``len(items) >= 2``) consecutive slices of about
    ``sum(sizes) / k`` estimated bytes each."""
    per = sum(sizes) / k
    out: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > start and acc + size > per:
            out.append((start, i))
            start, acc = i, 0
        acc += size
    out.append((start, len(items)))
    if len(out) < 2:
        half = len(items) // 2
        out = [(0, half), (half, len(items))]
    return out


def bounded(
    report: AckReport, encode: Callable[[AckReport], bytes], max_bytes: int = MAX_ACK_BYTES,
) -> Iterator[tuple[AckReport, bytes]]:
    """``report`` as consecutive reports each encoded in at most ``max_bytes`` (rule 8), with
    their encodings; the report itself when it fits (one encoding: the common case costs
    nothing more).

    ``encode`` gives the message bytes of one report; it is called for a piece only once
    every piece before it was yielded, so the caller may number the messages (``seq``) as
    they come and encode each with its own number.  Where to cut is chosen by a rough
    estimate of each item's bytes; a piece whose encoding is still over the bound is cut
    again (a single entry by its ranges, a block by its rows).  An item that cannot be cut
    and is alone over the bound is yielded as it is (its size is the caller's to judge)."""
    items: list[Item] = [*report.entries, *report.columns, *report.seals]
    yield from _bounded(items, [_estimate(i) for i in items], encode, max_bytes, _TRY_WHOLE)


_TRY_WHOLE = 4
"""The report is encoded whole first when its estimate is at most this many bounds (an
estimate errs high by less than that), so a report that fits always goes whole."""


def _bounded(
    items: list[Item], sizes: list[int], encode: Callable[[AckReport], bytes], max_bytes: int,
    try_whole: int = 1,
) -> Iterator[tuple[AckReport, bytes]]:
    size = sum(sizes)
    if size <= max_bytes * try_whole or len(items) < 2:
        piece = _report(items)
        value = encode(piece)
        if len(value) <= max_bytes:
            yield piece, value
            return
        size = len(value)
    pieces = -(-size // int(max_bytes * _FILL))
    if len(items) >= 2:
        for a, b in _groups(items, sizes, max(2, pieces)):
            yield from _bounded(items[a:b], sizes[a:b], encode, max_bytes)
        return
    cut = _cut(items[0], max(2, pieces)) if items else None
    if cut is None:
        yield piece, value  # indivisible: alone, as it is
        return
    yield from _bounded(cut, [_estimate(i) for i in cut], encode, max_bytes)
