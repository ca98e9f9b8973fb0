"""An in-memory :class:`~substreams.kafka.log.Log` on a simulated clock, with the Kafka
semantics the guarantees rest on (docs/design.md, "The firm bound under crashes" and
"Silence and open transactions").  Single-threaded and deterministic: no wall clock, no
randomness, no waiting -- time moves only when the injected clock is moved.  Held to Kafka by
the contract tests (``tests/integration/test_log_contract.py``), which run the same cases
against a real broker.

Rules modelled:

1. *Partitions and offsets.*  A partition is a sequence of entries, one offset each: data
   records and transaction markers (Kafka's control records).  Offsets are dense over
   entries, not over data records: every partition a transaction wrote gets one marker when
   it ends.  The *high watermark* (HW) is the next offset.  A record keeps its key, value,
   headers and timestamp (the clock's ``now_ms()`` unless given).
2. *Idempotent writes* (:meth:`MemoryLog.writer`) are appended at ``produce`` and belong to
   no transaction.
3. *Transactions.*  ``begin`` is local.  A transaction's first ``produce`` to a partition
   (or first ``send_offsets``) adds it at the coordinator; its records are appended at
   ``produce`` (a ``read_uncommitted`` reader sees them at once).  An unfinished transaction
   *holds* every partition it wrote from its first offset there until its marker is written.
4. *Commit and abort* decide the outcome at once; the markers are written
   ``marker_delay_ms`` later (0: at once).  Kafka writes them asynchronously after
   ``EndTxn`` answered: right after ``commit_transaction`` returned, the last stable offset
   can still be the transaction's first offset.  An empty transaction writes no marker, nor
   does one that only committed offsets (its marker is in ``__consumer_offsets``).  A
   writer's next transaction, and a new holder of its id, wait its markers out (Kafka:
   ``CONCURRENT_TRANSACTIONS``, retried by the client): they are written first.
5. *Visibility.*  A partition's *last stable offset* (LSO) is the first offset of the
   oldest transaction holding it, or the HW if none does.  A ``read_committed`` reader reads
   up to the LSO and returns committed transactional records and idempotent ones; a
   ``read_uncommitted`` reader reads up to the HW and returns every data record, also of
   open and aborted transactions.  Neither ever returns a marker.
6. *End offsets*: the LSO for ``committed=True``, the HW otherwise; *start offsets*: the
   log start.  ``record_at`` is a ``read_uncommitted`` read of one offset: None for a
   marker or an offset outside ``[log start, HW)``.
7. *Fencing.*  Taking a transactional id (:meth:`MemoryLog.transactional_writer`, Kafka's
   ``init_transactions``; :meth:`MemoryLog.fence` takes it and lets go) writes the markers of
   the earlier holder's decided transaction, aborts its open one (markers at once: Kafka's
   ``init_transactions`` returns only after that abort) and bumps the id's epoch.  The
   earlier holder's ``produce``, ``send_offsets``, ``flush``, ``commit`` and ``abort`` raise
   :class:`~substreams.kafka.log.FencedError`; so does its ``begin`` once it has learnt it
   (the fatal state sticks).  Kafka reports it at the first call that reaches the broker
   (``flush``/``commit`` after a ``produce`` that only queued; ``send_offsets``): here at
   the earliest such call, which is stricter.
8. *Transaction timeout.*  A transaction added longer ago than its writer's ``timeout_ms``
   (on the clock's ``monotonic()``) is aborted by the coordinator, markers at once, and its
   writer is fenced (Kafka bumps the producer epoch; librdkafka then reports ``_FENCED``).
   Kafka does it within ``transaction.abort.timed.out.transaction.cleanup.interval.ms``
   after the timeout; here exactly at it, the next time the log is touched (or
   :meth:`MemoryLog.settle` is called).
9. *Group offsets* sent in a transaction become the group's committed offsets when its
   commit markers are written, and are dropped by an abort.  Asking a group's offset of a
   partition with offsets of an unfinished transaction raises
   :class:`~substreams.errors.BrokerError` (Kafka answers ``UNSTABLE_OFFSET_COMMIT`` and the
   client waits until the transaction ends or its timeout passes; in memory nothing can end
   it while the caller waits).
10. *Log start.*  ``delete_records`` (what retention does) moves the log start up to an
    offset at most the HW (past it: ``BrokerError``, Kafka's ``OFFSET_OUT_OF_RANGE``; below
    the current start: no change).  The entries below are gone.
11. *Readers* (:class:`MemoryReader`) keep :class:`~substreams.kafka.read.Reader`'s
    invariants.  A fetch position below the log start or past the HW is reset to the log
    start (the project's ``auto.offset.reset=earliest``), judged at every poll as librdkafka
    judges every fetch.  Reaching the end (rule 6) at an offset not yet reported is an
    end-of-partition event: the partition is *at end* and its position is that offset
    (past markers and skipped aborted records).  Partitions are polled round-robin from a
    rotating first one (deterministic; Kafka leaves the order across partitions open).
12. *Unknown topics and partitions* are refused with ``BrokerError`` at once (Kafka, with
    automatic topic creation off, fails the delivery after a timeout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from substreams.errors import BrokerError
from substreams.kafka.clock import Clock
from substreams.kafka.log import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TRANSACTION_TIMEOUT_MS,
    Committed,
    FencedError,
    Log,
    LogReader,
    Partition,
    Record,
    TransactionalWriter,
    Writer,
)

__all__ = ["MemoryLog", "MemoryReader", "MemoryTransactionalWriter", "MemoryWriter"]

OPEN, COMMITTING, ABORTING, DONE = "open", "committing", "aborting", "done"


@dataclass(eq=False)
class _Txn:
    seq: int
    transactional_id: str
    timeout_ms: int
    state: str = OPEN
    first: dict[Partition, int] = field(default_factory=dict)
    """Partitions added, with the transaction's first offset in each (insertion order)."""
    offsets: dict[tuple[str, Partition], Committed] = field(default_factory=dict)
    added_at: float = 0.0
    """Clock's monotonic() at the first add (the coordinator's timer starts there)."""
    decided_at: float = 0.0
    commit: bool = False
    """The decision (meaningful once ``state`` is not OPEN)."""


@dataclass(slots=True)
class _Entry:
    record: Record | None
    """None: a transaction marker."""
    txn: _Txn | None


@dataclass
class _Part:
    start: int = 0
    entries: list[_Entry] = field(default_factory=list)
    holders: dict[int, int] = field(default_factory=dict)
    """Unfinished transactions (by seq) with their first offset here."""

    @property
    def high(self) -> int:
        return self.start + len(self.entries)

    @property
    def stable(self) -> int:
        return min(self.holders.values(), default=self.high)


class MemoryLog:
    """Topics in memory; see the module doc for the rules."""

    def __init__(self, clock: Clock, *, marker_delay_ms: int = 0) -> None:
        self.clock = clock
        self.marker_delay_ms = marker_delay_ms
        self._topics: dict[str, list[_Part]] = {}
        self._epochs: dict[str, int] = {}
        self._current: dict[str, _Txn] = {}
        """Per transactional id, its holder's latest unfinished transaction."""
        self._unfinished: dict[int, _Txn] = {}
        self._groups: dict[str, dict[Partition, Committed]] = {}
        self._seq = 0

    # -- the coordinator -------------------------------------------------------------------

    def settle(self) -> None:
        """Run the coordinator to the clock's now: abort timed-out transactions (rule 8)
        and write the markers that are due (rule 4).  Every operation does this first."""
        if not self._unfinished:
            return
        now = self.clock.monotonic()
        for txn in list(self._unfinished.values()):
            if txn.state == OPEN:
                if (now - txn.added_at) * 1000 >= txn.timeout_ms:
                    self._epochs[txn.transactional_id] += 1
                    self._decide(txn, commit=False)
                    self._complete(txn)
            elif now >= txn.decided_at + self.marker_delay_ms / 1000:
                self._complete(txn)

    def _decide(self, txn: _Txn, *, commit: bool) -> None:
        txn.commit = commit
        txn.state = COMMITTING if commit else ABORTING
        txn.decided_at = self.clock.monotonic()
        if self.marker_delay_ms == 0:
            self._complete(txn)

    def _complete(self, txn: _Txn) -> None:
        """Write ``txn``'s markers (rule 4) and, for a commit, its group offsets (rule 9)."""
        if txn.state == DONE:
            return
        for (topic, p) in txn.first:
            part = self._topics[topic][p]
            part.entries.append(_Entry(None, txn))
            part.holders.pop(txn.seq, None)
        if txn.commit:
            for (group, tp), committed in txn.offsets.items():
                self._groups.setdefault(group, {})[tp] = committed
        txn.state = DONE
        self._unfinished.pop(txn.seq, None)
        if self._current.get(txn.transactional_id) is txn:
            del self._current[txn.transactional_id]

    def _take_id(self, transactional_id: str) -> int:
        """Rule 7: the earlier holder's transaction ends, the epoch moves on."""
        self.settle()
        txn = self._current.get(transactional_id)
        if txn is not None:
            if txn.state == OPEN:
                self._decide(txn, commit=False)
            self._complete(txn)
        self._epochs[transactional_id] = self._epochs.get(transactional_id, -1) + 1
        return self._epochs[transactional_id]

    # -- partitions ------------------------------------------------------------------------

    def _part(self, topic: str, partition: int) -> _Part:
        parts = self._topics.get(topic)
        if parts is None:
            raise BrokerError(f"unknown topic '{topic}'")
        if not 0 <= partition < len(parts):
            raise BrokerError(f"unknown partition {topic}[{partition}] ({len(parts)} partitions)")
        return parts[partition]

    def _append(
        self, topic: str, partition: int, value: bytes | None, key: bytes | None,
        headers: Sequence[tuple[str, bytes]], timestamp_ms: int | None, txn: _Txn | None,
    ) -> Record:
        part = self._part(topic, partition)
        if txn is not None and (topic, partition) not in txn.first:
            txn.first[(topic, partition)] = part.high
            part.holders[txn.seq] = part.high
        record = Record(
            topic, partition, part.high, value, key, tuple(headers),
            self.clock.now_ms() if timestamp_ms is None else timestamp_ms,
        )
        part.entries.append(_Entry(record, txn))
        return record

    # -- Log -------------------------------------------------------------------------------

    def create_topics(self, topics: Mapping[str, int]) -> None:
        for name, n in topics.items():
            have = self._topics.get(name)
            if have is None:
                self._topics[name] = [_Part() for _ in range(n)]
            elif len(have) < n:
                raise BrokerError(
                    f"topic '{name}' exists with {len(have)} partitions; {n} wanted"
                )

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (``BrokerError`` if it does not exist)."""
        parts = self._topics.get(topic)
        if parts is None:
            raise BrokerError(f"unknown topic '{topic}'")
        return len(parts)

    def transactional_writer(
        self, transactional_id: str, *, timeout_ms: int = TRANSACTION_TIMEOUT_MS
    ) -> MemoryTransactionalWriter:
        epoch = self._take_id(transactional_id)
        return MemoryTransactionalWriter(self, transactional_id, epoch, timeout_ms)

    def writer(self) -> MemoryWriter:
        return MemoryWriter(self)

    def reader(self, *, committed: bool = True, name: str = "reader") -> MemoryReader:
        return MemoryReader(self, committed=committed, name=name)

    def end_offsets(
        self, topic: str, partitions: Sequence[int], *, committed: bool
    ) -> dict[int, int]:
        self.settle()
        out: dict[int, int] = {}
        for p in partitions:
            part = self._part(topic, p)
            out[p] = part.stable if committed else part.high
        return out

    def start_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        self.settle()
        return {p: self._part(topic, p).start for p in partitions}

    def record_at(self, topic: str, partition: int, offset: int) -> Record | None:
        self.settle()
        part = self._part(topic, partition)
        if not part.start <= offset < part.high:
            return None
        return part.entries[offset - part.start].record

    def committed_offsets(
        self, group: str, partitions: Sequence[Partition], *, timeout: float = 30.0
    ) -> dict[Partition, Committed]:
        self.settle()
        for txn in self._unfinished.values():
            pending = [tp for tp in partitions if (group, tp) in txn.offsets]
            if pending:
                raise BrokerError(
                    f"committed offsets of group '{group}': {pending} have offsets of an "
                    f"unfinished transaction of '{txn.transactional_id}' "
                    "(UNSTABLE_OFFSET_COMMIT)"
                )
        have = self._groups.get(group, {})
        return {tp: have[tp] for tp in partitions if tp in have}

    def fence(self, transactional_id: str) -> None:
        self._take_id(transactional_id)

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        self.settle()
        part = self._part(topic, partition)
        if before > part.high:
            raise BrokerError(
                f"delete_records {topic}[{partition}] before {before}: past the high "
                f"watermark {part.high} (OFFSET_OUT_OF_RANGE)"
            )
        if before > part.start:
            del part.entries[: before - part.start]
            part.start = before
        return part.start

    # -- for the writers ---------------------------------------------------------------------

    def _new_txn(self, transactional_id: str, timeout_ms: int) -> _Txn:
        """A transaction's first add at the coordinator (its timer starts), once the
        writer's previous transaction is marked (rule 4)."""
        previous = self._current.get(transactional_id)
        if previous is not None:
            self._complete(previous)
        self._seq += 1
        txn = _Txn(self._seq, transactional_id, timeout_ms, added_at=self.clock.monotonic())
        self._current[transactional_id] = txn
        self._unfinished[txn.seq] = txn
        return txn


class MemoryWriter:
    """An idempotent writer outside transactions (rule 2)."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log
        self._delivered: list[Record] = []

    def produce(
        self, topic: str, partition: int, value: bytes | None, *, key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (), timestamp_ms: int | None = None,
    ) -> None:
        self._log.settle()
        self._delivered.append(
            self._log._append(topic, partition, value, key, headers, timestamp_ms, None)
        )

    def flush(self) -> list[Record]:
        out, self._delivered = self._delivered, []
        return out

    def close(self) -> None:
        self._delivered = []


class MemoryTransactionalWriter:
    """A holder of a transactional id at one epoch (rules 3, 4, 7, 8)."""

    def __init__(self, log: MemoryLog, transactional_id: str, epoch: int, timeout_ms: int
                 ) -> None:
        self._log = log
        self._id = transactional_id
        self._epoch = epoch
        self._timeout_ms = timeout_ms
        self._in_txn = False
        self._txn: _Txn | None = None
        """The open transaction once something was added to it."""
        self._delivered: list[Record] = []
        self._fatal = False

    @property
    def transactional_id(self) -> str:
        return self._id

    def _check(self) -> None:
        """A call that reaches the broker: fenced if the id's epoch moved on (rule 7)."""
        self._log.settle()
        if self._fatal or self._log._epochs[self._id] != self._epoch:
            self._fatal = True
            raise FencedError(
                f"transactional id '{self._id}' was taken by a newer writer (or its "
                "transaction timed out)"
            )

    def _open(self, what: str) -> None:
        if not self._in_txn:
            raise BrokerError(f"'{self._id}': {what} outside a transaction")

    def begin(self) -> None:
        self._log.settle()
        if self._fatal:
            raise FencedError(f"transactional id '{self._id}' was taken by a newer writer")
        if self._in_txn:
            raise BrokerError(f"'{self._id}': a transaction is already open")
        self._in_txn = True

    def _added(self, what: str) -> _Txn:
        self._check()
        self._open(what)
        if self._txn is None:
            self._txn = self._log._new_txn(self._id, self._timeout_ms)
        return self._txn

    def produce(
        self, topic: str, partition: int, value: bytes | None, *, key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (), timestamp_ms: int | None = None,
    ) -> None:
        txn = self._added("produce")
        self._delivered.append(
            self._log._append(topic, partition, value, key, headers, timestamp_ms, txn)
        )

    def send_offsets(self, group: str, offsets: Mapping[Partition, Committed]) -> None:
        txn = self._added("send_offsets")
        for tp, committed in offsets.items():
            txn.offsets[(group, tp)] = committed

    def flush(self) -> list[Record]:
        if self._delivered:
            self._check()
        out, self._delivered = self._delivered, []
        return out

    def _end(self, commit: bool) -> None:
        self._check()
        self._open("commit" if commit else "abort")
        txn, self._txn, self._in_txn, self._delivered = self._txn, None, False, []
        if txn is not None:
            self._log._decide(txn, commit=commit)

    def commit(self) -> None:
        self._end(commit=True)

    def abort(self) -> None:
        self._end(commit=False)

    def close(self) -> None:
        """Let go without ending the transaction: like a crashed process, an open one holds
        its partitions until it is fenced or times out."""
        self._delivered = []


class MemoryReader:
    """A reader of assigned partitions (rules 5, 11)."""

    def __init__(self, log: MemoryLog, *, committed: bool, name: str) -> None:
        self.name = name
        self._log = log
        self._committed = committed
        self._assigned: list[Partition] = []
        self._positions: dict[Partition, int] = {}
        self._at_end: set[Partition] = set()
        self._fetch: dict[Partition, int] = {}
        self._eof_at: dict[Partition, int] = {}
        self._next = 0

    def _end(self, part: _Part) -> int:
        return part.stable if self._committed else part.high

    def assign(self, starts: Mapping[Partition, int]) -> None:
        self._log.settle()
        self._assigned = list(starts)
        self._positions = {tp: o for tp, o in starts.items() if o >= 0}
        self._at_end = set()
        self._eof_at = {}
        self._fetch = {}
        for (topic, p), offset in starts.items():
            part = self._log._part(topic, p)
            if offset == OFFSET_BEGINNING:
                offset = part.start
            elif offset == OFFSET_END:
                offset = self._end(part)
            self._fetch[(topic, p)] = offset

    def poll(self, timeout: float = 0.0, max_records: int = 500) -> list[Record]:
        self._log.settle()
        out: list[Record] = []
        n = len(self._assigned)
        if not n:
            return out
        first, self._next = self._next % n, self._next + 1
        for tp in self._assigned[first:] + self._assigned[:first]:
            part = self._log._part(*tp)
            at = self._fetch[tp]
            if not part.start <= at <= part.high:
                at = part.start  # auto.offset.reset=earliest
            end = self._end(part)
            while at < end and len(out) < max_records:
                entry = part.entries[at - part.start]
                rec = entry.record
                if rec is not None and (
                    not self._committed or entry.txn is None or entry.txn.commit
                ):
                    out.append(rec)
                    self._positions[tp] = at + 1
                    self._at_end.discard(tp)
                at += 1
            self._fetch[tp] = at
            if at >= end and self._eof_at.get(tp) != at:
                self._eof_at[tp] = at
                self._at_end.add(tp)
                self._positions[tp] = max(self._positions.get(tp, 0), at)
        return out

    @property
    def positions(self) -> Mapping[Partition, int]:
        return self._positions

    @property
    def at_end(self) -> Set[Partition]:
        return self._at_end

    @property
    def caught_up(self) -> bool:
        return bool(self._assigned) and all(tp in self._at_end for tp in self._assigned)

    def close(self) -> None:
        self._assigned = []


if TYPE_CHECKING:  # mypy proves that the classes implement the Protocols

    def _implements(
        log: MemoryLog, writer: MemoryWriter, txn: MemoryTransactionalWriter,
        reader: MemoryReader,
    ) -> tuple[Log, Writer, TransactionalWriter, LogReader]:
        return log, writer, txn, reader
