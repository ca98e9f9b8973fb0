"""The tracking agent: local XOR aggregation of SND/RCV reports, written with the records.

Why aggregate locally (the trAcker's point): one message per (substream, time) per commit
instead of one per record keeps service traffic at O(K·|Π|).  Why one acks partition per
*segment* (:func:`segment_partition`, crc32(substream) % partitions): the acker must see a
source's Register, reports and seals of one segment in the order they were made, and Kafka
only orders within a partition; partitioning by segment (not by source) is what lets
sharded ackers split the segments between them (docs/design.md, "Sharded ackers").  So a
commit's messages are split per acks partition: each partition gets the Register,
AckReport and Unregister parts of the segments mapped to it, with a sequence number of its
own (the acker counts per (source, partition)); heartbeats go to every partition the source
registered in.  A partition's report longer than :data:`~substreams.acker.protocol.
MAX_ACK_BYTES` encoded is cut into several messages, in order, each with its own sequence
number (protocol rule 8): a commit over 10^5 keys is many bounded messages in one
transaction, not one record the broker refuses.

Commit and report are one: the agent owns no producer.  Its writer's
:class:`~substreams.acker.tracker.Tracker` takes the aggregated messages just before the
writer commits (:meth:`TrackingAgent.take`) and hands them to it to write to the acks topic
*inside the same transaction* as the records they cover; the acker reads the acks topic
``read_committed``.
So a crash at any point either loses both the records and their reports (an aborted
transaction) or neither, and a seal is visible exactly when the records written before it
are.  There is no flush timer: a report is useless before its records are visible.

Incarnations: every start of a source id is a new *incarnation* (a random id).  The new one's
``init_transactions`` fences the old one, so in the acks partition every committed message of
the old incarnation precedes the new one's Register; the acker scopes what it keeps per
source (sequence numbers, registration) by incarnation and ignores anything else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import islice, repeat
from operator import add, lt
from typing import NamedTuple, cast

from substreams.acker.protocol import (
    MAX_ACK_BYTES,
    SOURCE,
    AckBlock,
    AckBody,
    AckEntry,
    AckMessage,
    AckReport,
    Register,
    SealEntry,
    SourceHeartbeat,
    Unregister,
    ack_headers,
    bounded,
    encode_ack,
    now_ms,
    pack_column,
    segment_partition,
    split_body,
)
from substreams.config import Config
from substreams.control.messages import OffsetRange
from substreams.control.traffic import ACK_REPORTS, ACK_SENT, TRAFFIC
from substreams.frontier import Time
from substreams.streams.records import SentRecord

log = logging.getLogger(__name__)

_NO_TIME = object()
"""Equal to no time: the "previous time" before the first record of a batch."""


class _Agg:
    """Aggregated reports of one (substream, time) since the last flush."""

    __slots__ = ("ranges", "records", "reports", "xor")

    def __init__(self) -> None:
        self.xor = 0
        self.records = 0
        self.reports = 0
        self.ranges: dict[tuple[str, int], list[int]] = {}

    def merge(self, other: _Agg) -> None:
        self.xor ^= other.xor
        self.records += other.records
        self.reports += other.reports
        for key, (lo, hi) in other.ranges.items():
            self.add_offsets(key, lo, hi)

    def add_offsets(self, key: tuple[str, int], lo: int, hi: int) -> None:
        hull = self.ranges.get(key)
        if hull is None:
            self.ranges[key] = [lo, hi]
        else:
            if lo < hull[0]:
                hull[0] = lo
            if hi > hull[1]:
                hull[1] = hi


BLOCK_MIN = 8
"""A substream's int-time entries of one commit go into one :class:`AckBlock` from this many
on (fewer: plain entries, as cheap and easier to read in a dead letter)."""


def _ranges(agg: _Agg) -> tuple[OffsetRange, ...]:
    return tuple(OffsetRange(s, p, lo, hi) for (s, p), (lo, hi) in agg.ranges.items())


def _block(sub: str, items: list[tuple[int, _Agg]]) -> AckBlock:
    """One substream's int-time aggregates as a block, the columns built straight from the
    aggregates (no ``OffsetRange`` per range: this runs per record at granularity 1).
    Records and reports travel as 32-bit ints: one commit holds fewer than 2**31 records."""
    index: dict[str, int] = {}
    streams: list[str] = []
    counts: list[int] = []
    sidx: list[int] = []
    parts: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for _, agg in items:
        ranges = agg.ranges
        counts.append(len(ranges))
        for (stream, partition), (lo, hi) in ranges.items():
            i = index.get(stream)
            if i is None:
                i = index[stream] = len(streams)
                streams.append(stream)
            sidx.append(i)
            parts.append(partition)
            starts.append(lo)
            ends.append(hi)
    xors = [agg.xor for _, agg in items]
    return AckBlock(
        sub,
        pack_column("q", [t for t, _ in items]),
        pack_column("q", xors) if any(xors) else b"",
        pack_column("i", [agg.records for _, agg in items]),
        pack_column("i", [agg.reports for _, agg in items]),
        pack_column("i", counts),
        tuple(streams),
        pack_column("i", sidx),
        pack_column("i", parts),
        pack_column("q", starts),
        pack_column("q", ends),
    )


class _Columns(NamedTuple):
    """One batch's records that its writer sent and delivered to a terminal stream, as the
    flat columns the writer already holds (:meth:`TrackingAgent.sent_and_delivered_columns`)."""

    stream: str
    times: Sequence[Time]
    partitions: Sequence[int]
    offsets: Sequence[int]


def _column_block(sub: str, batches: list[_Columns]) -> tuple[AckBlock, int] | None:
    """The block (and its count of reports) of one substream's delivered batches when every
    record is its own int time -- strictly increasing times of one stream, granularity 1 --
    packed straight from the columns; None for anything else (aggregated per time instead).

    Why: there each time's entry is one record, two reports, xor 0 and the one-offset
    range ``[o, o + 1]`` of its partition, so the block is the batches' columns as they
    are, with constant columns beside them: no object per time and no Python loop (an
    ``_Agg`` per time would cost more than the record's own publishing).  The bytes equal
    what the aggregates give."""
    stream = batches[0].stream
    times: Sequence[Time]
    parts: Sequence[int]
    offsets: Sequence[int]
    if len(batches) == 1:
        _, times, parts, offsets = batches[0]
    else:
        if any(b.stream != stream for b in batches):
            return None
        times, parts, offsets = [], [], []
        for b in batches:
            times.extend(b.times)
            parts.extend(b.partitions)
            offsets.extend(b.offsets)
    n = len(times)
    # fewer than BLOCK_MIN: plain entries, as the aggregates would give
    if n < BLOCK_MIN or set(map(type, times)) != {int}:
        return None
    ints = cast(Sequence[int], times)
    if not all(map(lt, ints, islice(ints, 1, None))):
        return None
    ones = pack_column("i", (1,)) * n
    return AckBlock(
        sub, pack_column("q", ints), b"", ones, pack_column("i", (2,)) * n, ones,
        (stream,), bytes(4 * n), pack_column("i", parts), pack_column("q", offsets),
        pack_column("q", map(add, offsets, repeat(1))),
    ), 2 * n


def _coalesced(
    seals: list[tuple[str, Time, int, bool]], has_data: Callable[[str, int], bool]
) -> tuple[SealEntry, ...]:
    """A commit's seals with the ones the acker would not miss left out (at granularity 1
    ``publish`` seals every record).

    Int seals of one substream, in order: (1) a seal at or below an earlier one of the
    commit is a no-op at the acker (the source already covers it) and is dropped; (2) of
    the rest (increasing), a seal is dropped for the next one when both carry the same
    ``sealed_at_ms`` and the commit reports data at its time: the next seal covers it too
    (downward closed) with the same stamp, and the time is open anyway from the report's
    entries, which the acker applies before the seals -- so the acker's state is the same
    (docs/design.md, "Seals at one record per time").  A seal of a time without data
    opens that time (its notification) and is kept; keyed seals and seals of other times
    are kept as they are."""
    out: list[tuple[str, Time, int, bool] | None] = []
    hi: dict[str, int] = {}
    last: dict[str, int] = {}
    for s in seals:
        sub, t, ms, keyed = s
        if keyed or type(t) is not int:
            last.pop(sub, None)  # no coalescing across another kind of seal
            out.append(s)
            continue
        h = hi.get(sub)
        if h is not None and t <= h:
            continue
        hi[sub] = t
        j = last.get(sub)
        if j is not None:
            prev = out[j]
            assert prev is not None
            if prev[2] == ms and has_data(sub, cast(int, prev[1])):
                out[j] = None
        last[sub] = len(out)
        out.append(s)
    return tuple(SealEntry(sub, t, ms, keyed) for sub, t, ms, keyed in filter(None, out))


def _entries(
    table: dict[tuple[str, Time], _Agg],
) -> tuple[tuple[AckEntry, ...], tuple[AckBlock, ...], dict[str, int]]:
    """A commit's aggregates as entries and blocks, and the reports per substream."""
    reports: dict[str, int] = {}
    int_times: dict[str, list[tuple[int, _Agg]]] = {}
    for (sub, t), agg in table.items():
        reports[sub] = reports.get(sub, 0) + agg.reports
        if type(t) is int:
            int_times.setdefault(sub, []).append((t, agg))
    blocked = {sub for sub, items in int_times.items() if len(items) >= BLOCK_MIN}
    entries = tuple(
        AckEntry(sub, t, agg.xor, agg.records, agg.reports, _ranges(agg))
        for (sub, t), agg in table.items()
        if sub not in blocked or type(t) is not int
    )
    blocks = [_block(sub, int_times[sub]) for sub in blocked]
    return entries, tuple(blocks), reports


class TrackingAgent:
    """Aggregates one incarnation's reports between two commits of its writer.

    Not thread-safe and needs not be: reports come from the writer's own thread, delivery
    callbacks included (librdkafka serves them from the writer's ``flush``/``poll``).
    """

    def __init__(
        self, config: Config, source: str, incarnation: str, max_bytes: int = MAX_ACK_BYTES
    ) -> None:
        """``max_bytes``: the most bytes one acks message may take encoded (rule 8)."""
        self.source = source
        self.max_bytes = max_bytes
        self.incarnation = incarnation
        self.topic = config.acker.acks_topic
        self.acks_partitions = config.acker.acks_partitions
        self.partitions: set[int] = set()
        """The acks partitions of the segments this source registered with (heartbeats go
        to each: every acker shard that tracks one of them must hear it)."""
        self.headers = ack_headers()
        self._table: dict[tuple[str, Time], _Agg] = {}
        self._columns: dict[str, list[_Columns]] = {}
        """Per substream, the delivered batches of :meth:`sent_and_delivered_columns` since
        the last flush (aggregated in :meth:`take`)."""
        self._seals: list[tuple[str, Time, int, bool]] = []
        """(substream, time, sealed_at_ms, all_keys) per seal since the last flush (the
        ``SealEntry``s are built in :meth:`take`, for the seals that remain)."""
        self._before: list[AckBody] = []
        self._after: list[AckBody] = []
        self._seq: dict[int, int] = {}
        """The next sequence number per acks partition."""
        self._last_sent: dict[int, float] = {}
        """Per acks partition, when (monotonic) messages for it were last taken to be
        written, or a heartbeat sent there."""
        self._born = time.monotonic()

    # -- reporting -----------------------------------------------------------------------

    def _agg(self, substream: str, t: Time) -> _Agg:
        key = (substream, t)
        agg = self._table.get(key)
        if agg is None:
            agg = self._table[key] = _Agg()
        return agg

    def report(self, substream: str, t: Time, tracking_id: int) -> None:
        """One SND or RCV of the record ``tracking_id`` at time ``t``."""
        agg = self._agg(substream, t)
        agg.xor ^= tracking_id
        agg.reports += 1

    def report_many(self, items: Iterable[tuple[str, Time, int]]) -> None:
        """Several reports (a stage's RCV(input) XOR SND(outputs)): all go out with the
        same commit, so the XOR cannot reach zero early."""
        for substream, t, tracking_id in items:
            agg = self._agg(substream, t)
            agg.xor ^= tracking_id
            agg.reports += 1

    def report_sent(self, substream: str, records: Sequence[SentRecord]) -> None:
        """SND of every record of a batch (``Publisher.publish_many``) at its time in
        ``substream``: one table lookup per run of records with equal times, not per
        record (a batch of an epoch is one run).  A record without a time there (late for
        it, see ``Publisher.publish``) is not reported."""
        agg: _Agg | None = None
        prev: object = _NO_TIME
        for record in records:
            t = record.times.get(substream)
            if t is None:  # late for this substream (kept out of it): no report
                continue
            if agg is None or t != prev:
                agg = self._agg(substream, t)
                prev = t
            agg.xor ^= record.tracking_id
            agg.reports += 1

    def sent_and_delivered_columns(
        self,
        substream: str,
        stream: str,
        times: Sequence[Time],
        partitions: Sequence[int],
        offsets: Sequence[int],
    ) -> None:
        """SND and RCV at once of every record of a batch its writer delivered to the
        terminal ``stream`` (the two reports of one id cancel in the XOR, so only the counts
        and the offsets are kept: no id to carry), as columns (record i: time ``times[i]``
        in ``substream``, ``partitions[i]``, ``offsets[i]``).  Only kept until :meth:`take`,
        which packs the block straight from the columns at one record per time (no object
        per time) and aggregates anything else per time (:meth:`_fold`).  The sequences are
        kept as they are: the caller must not change them afterwards."""
        if times:
            batch = _Columns(stream, times, partitions, offsets)
            pending = self._columns.get(substream)
            if pending is None:
                self._columns[substream] = [batch]
            else:
                pending.append(batch)

    def _fold(self, substream: str, batches: list[_Columns]) -> None:
        """Delivered batches into the per-time table, as the per-record calls would: one
        table lookup per run of records with equal times (a batch of an epoch is one run),
        :meth:`_Agg.add_offsets` inlined (this loop runs per record)."""
        table = self._table
        for stream, times, partitions, offsets in batches:
            agg: _Agg | None = None
            ranges: dict[tuple[str, int], list[int]] = {}
            prev: object = _NO_TIME
            for t, partition, offset in zip(times, partitions, offsets, strict=True):
                if agg is None or t != prev:
                    key = (substream, t)
                    agg = table.get(key)
                    if agg is None:
                        agg = table[key] = _Agg()
                    ranges = agg.ranges
                    prev = t
                agg.reports += 2
                agg.records += 1
                where = (stream, partition)
                hull = ranges.get(where)
                if hull is None:
                    ranges[where] = [offset, offset + 1]
                else:
                    if offset < hull[0]:
                        hull[0] = offset
                    if offset >= hull[1]:
                        hull[1] = offset + 1

    def seal(self, substream: str, t: Time) -> None:
        """No more records at times <= ``t`` from this source, from the next commit on
        (the seal travels after the reports of that commit's records)."""
        self._seals.append((substream, t, now_ms(), False))

    def seal_keys(self, substream: str, upto: int) -> None:
        """The keyed seal: no more records at ``Keyed(k, t)``, ``t <= upto``, for any key, from
        the next commit on.  Only the highest per commit travels (they are monotone)."""
        self._seals = [s for s in self._seals if not (s[3] and s[0] == substream)]
        self._seals.append((substream, upto, now_ms(), True))

    def _has_data(self, packed: dict[str, list[_Columns]]) -> Callable[[str, int], bool]:
        """Whether this commit reports anything at (substream, int time): the table's keys
        and the times of the blocks packed from columns (a set per substream, built only
        when a seal asks)."""
        table = self._table
        sets: dict[str, set[int]] = {}

        def has_data(sub: str, t: int) -> bool:
            if (sub, t) in table:
                return True
            batches = packed.get(sub)
            if batches is None:
                return False
            got = sets.get(sub)
            if got is None:
                got = sets[sub] = set()
                for b in batches:  # packed: int times only
                    got.update(cast(Sequence[int], b.times))
            return t in got

        return has_data

    # -- membership ----------------------------------------------------------------------

    def register(
        self,
        substreams: Iterable[str],
        role: str = SOURCE,
        writer: str = "",
        evict_when_silent: bool = True,
    ) -> None:
        """Join with the next commit (before its reports): a source counts from the moment
        the acker reads its Register.  ``writer``: the transactional id to fence on eviction;
        ``evict_when_silent=False``: never evicted for silence, only by hand."""
        subs = tuple(substreams)
        self.partitions.update(self.partition_of(s) for s in subs)
        self._before.append(Register(subs, role, writer, evict_when_silent))

    def unregister(self, substreams: Iterable[str]) -> None:
        """Leave with the next commit (after its reports)."""
        self._after.append(Unregister(tuple(substreams)))

    def partition_of(self, substream: str) -> int:
        return segment_partition(substream, self.acks_partitions)

    def heartbeat_due(self, now: float, interval: float) -> list[int]:
        """The registered partitions that got nothing for ``interval`` seconds (marked as
        served: the caller sends a heartbeat to each).  Called from the heartbeat thread;
        a dict read and write per partition is atomic enough under the GIL (a race costs
        one heartbeat more or later, never a missing one for long)."""
        due = []
        for p in sorted(self.partitions):
            if now - self._last_sent.get(p, self._born) >= interval:
                self._last_sent[p] = now
                due.append(p)
        return due

    def heartbeat_message(self) -> AckMessage:
        """A SourceHeartbeat of this incarnation, to be sent outside any transaction (to
        every partition of :attr:`partitions`)."""
        return AckMessage(self.source, -1, now_ms(), SourceHeartbeat(), self.incarnation)

    # -- writing -------------------------------------------------------------------------

    def pending(self) -> bool:
        return bool(
            self._table or self._columns or self._seals or self._before or self._after
        )

    def take(self) -> list[tuple[int, AckMessage]]:
        """The messages the writer's next commit must carry, each with its acks partition
        (see :meth:`take_encoded`, which also gives their bytes)."""
        return [(p, msg) for p, msg, _ in self.take_encoded()]

    def take_encoded(self) -> list[tuple[int, AckMessage, bytes]]:
        """The messages the writer's next commit must carry, each with its acks partition
        and its encoding, in order within each partition; the agent is empty afterwards.
        Called by the writer right before it commits (after its delivery callbacks ran, so
        terminal offsets are known).  A report longer than :attr:`max_bytes` encoded is cut
        into several messages (protocol rule 8), each with its own sequence number."""
        bodies: list[AckBody] = list(self._before)
        if self._table or self._columns or self._seals:
            packed: list[AckBlock] = []
            packed_batches: dict[str, list[_Columns]] = {}
            if self._columns:
                in_table = {sub for sub, _ in self._table}
                for sub, batches in self._columns.items():
                    done = None if sub in in_table else _column_block(sub, batches)
                    if done is None:
                        self._fold(sub, batches)
                    else:
                        block, n = done
                        packed.append(block)
                        packed_batches[sub] = batches
                        TRAFFIC.add(ACK_REPORTS, sub, n)
            entries, blocks, reports = _entries(self._table)
            for sub, n in reports.items():  # one counter update per substream, not per time
                TRAFFIC.add(ACK_REPORTS, sub, n)
            seals = _coalesced(self._seals, self._has_data(packed_batches))
            bodies.append(AckReport(entries, seals, (*blocks, *packed)))
        bodies += self._after
        self._table, self._columns, self._seals = {}, {}, []
        self._before, self._after = [], []
        sent = now_ms()
        out: list[tuple[int, AckMessage, bytes]] = []
        seqs = self._seq
        taken = time.monotonic()
        source, incarnation = self.source, self.incarnation

        def encode(p: int, body: AckBody) -> bytes:
            # the message as it will go: with the partition's next sequence number
            return encode_ack(AckMessage(source, seqs.get(p, 0), sent, body, incarnation))

        for whole in bodies:
            for p, body in split_body(whole, self.partition_of):
                self._last_sent[p] = taken
                if isinstance(body, AckReport):
                    pieces: Iterable[tuple[AckBody, bytes]] = bounded(
                        body, partial(encode, p), self.max_bytes
                    )
                else:
                    pieces = ((body, encode(p, body)),)
                for piece, value in pieces:
                    seq = seqs.get(p, 0)
                    seqs[p] = seq + 1
                    msg = AckMessage(source, seq, sent, piece, incarnation)
                    if len(value) > self.max_bytes:
                        log.warning(
                            "source '%s': an acks message for partition %d is %d bytes, over "
                            "the %d-byte bound: one item of it cannot be cut (a very long "
                            "key?); it goes as it is", source, p, len(value), self.max_bytes,
                        )
                    for sub in msg.substreams():
                        TRAFFIC.add(ACK_SENT, sub)
                    out.append((p, msg, value))
        return out

    def discard(self) -> None:
        """The writer's transaction was aborted: what it would have carried never happened."""
        self._table, self._columns, self._seals = {}, {}, []
        self._before, self._after = [], []
