"""The ``Log``: what the project asks of Kafka, as a small typed interface.

Two implementations: :class:`substreams.kafka.brokerlog.KafkaLog` (a real broker, through the
functions of this package) and :class:`substreams.kafka.memory.MemoryLog` (in memory, on a
simulated clock, for the pure core's tests and the simulator).  The contract tests
(``tests/integration/test_log_contract.py``) run the same cases against both, so the fake
cannot drift from Kafka.

What it holds, and why no more: the acker, publishers and control writers do four things with
Kafka -- write in transactions (records, acks, checkpoints, consumer-group offsets) and fence
each other by transactional id; write a few records outside transactions (heartbeats); read
assigned partitions from offsets they keep themselves, knowing when they reached the end;
and ask a partition's ends (the last stable offset and the high watermark), its start and
the record at one offset.  Topic creation and ``delete_records`` (what retention does) are
the admin part.  Consumer groups are never joined (see :mod:`substreams.kafka.client`): a
group is only a name under which offsets are committed inside a transaction.

Errors: :class:`FencedError` when a transactional writer's id was taken by a newer one (or
its coordinator aborted its timed-out transaction, which fences it the same way);
:class:`~substreams.errors.BrokerError` for everything else the broker refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from substreams.errors import SubstreamsError

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "TRANSACTION_TIMEOUT_MS",
    "Committed",
    "FencedError",
    "Log",
    "LogReader",
    "Partition",
    "Record",
    "TransactionalWriter",
    "Writer",
]

Partition = tuple[str, int]
"""(topic, partition)."""

OFFSET_BEGINNING = -2
"""An assignment offset: the partition's log start (librdkafka's logical offset)."""
OFFSET_END = -1
"""An assignment offset: the partition's end as the reader's isolation level sees it."""

TRANSACTION_TIMEOUT_MS = 90_000
"""The default ``transaction.timeout.ms`` (the value of ``client.TRANSACTION_TIMEOUT_MS``,
repeated so that the in-memory log needs no confluent-kafka import)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One data record as a reader gets it (transaction markers are never returned)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class Committed:
    """A consumer group's committed offset of one partition (the next offset to read)."""

    offset: int
    metadata: str = ""


class FencedError(SubstreamsError):
    """This transactional writer was replaced: a newer one took its transactional id, or
    its coordinator aborted its transaction for running past ``transaction.timeout.ms``.
    Fatal for the writer: it must stop (callers raise their own fenced error from it)."""


class Writer(Protocol):
    """A producer: idempotent (no duplicates, per-partition order kept on retries)."""

    def produce(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one record (``timestamp_ms`` None: the clock's now)."""
        ...

    def flush(self) -> list[Record]:
        """Deliver everything queued; the records produced since the previous flush, in
        the order produced, with their offsets.  Raises if a delivery failed."""
        ...

    def close(self) -> None: ...


class TransactionalWriter(Writer, Protocol):
    """A transactional producer: :meth:`Log.transactional_writer` took its id (fencing
    every earlier holder).  Records and group offsets of one transaction become visible to
    ``read_committed`` readers together, or never."""

    @property
    def transactional_id(self) -> str: ...

    def begin(self) -> None:
        """Open a transaction (local: the broker hears of it with the first produce)."""
        ...

    def send_offsets(self, group: str, offsets: Mapping[Partition, Committed]) -> None:
        """Commit ``group``'s offsets inside the open transaction."""
        ...

    def commit(self) -> None:
        """Deliver everything and commit the open transaction."""
        ...

    def abort(self) -> None:
        """Drop the open transaction: nothing of it is ever visible to a committed reader."""
        ...


class LogReader(Protocol):
    """A consumer of assigned partitions, returning data records only (never markers).

    Invariants (those of :class:`substreams.kafka.read.Reader`): ``positions[p]`` is one past
    the last record of ``p`` returned, or the offset of ``p``'s last end-of-partition event,
    or the assigned offset before either; ``p in at_end`` iff the last event of ``p`` was its
    end (under ``read_committed`` the last stable offset) and no record of ``p`` came since."""

    def assign(self, starts: Mapping[Partition, int]) -> None:
        """Read exactly these partitions from these offsets (:data:`OFFSET_BEGINNING`,
        :data:`OFFSET_END` allowed).  An offset below the log start or past the high
        watermark reads from the log start (``auto.offset.reset=earliest``)."""
        ...

    def poll(self, timeout: float = 0.0, max_records: int = 500) -> list[Record]:
        """What is there (per partition in offset order), up to ``max_records``; waits up to
        ``timeout`` for the first one only if nothing is (the in-memory log never waits)."""
        ...

    @property
    def positions(self) -> Mapping[Partition, int]: ...

    @property
    def at_end(self) -> Set[Partition]: ...

    @property
    def caught_up(self) -> bool:
        """Every assigned partition is at its end."""
        ...

    def close(self) -> None: ...


class Log(Protocol):
    """Topics of partitions of records; the factory of the clients above."""

    def create_topics(self, topics: Mapping[str, int]) -> None:
        """Create the missing topics (name -> partitions); existing ones are kept."""
        ...

    def transactional_writer(
        self, transactional_id: str, *, timeout_ms: int = TRANSACTION_TIMEOUT_MS
    ) -> TransactionalWriter:
        """A transactional writer holding ``transactional_id`` (``init_transactions``):
        the earlier holder is fenced and its open transaction aborted."""
        ...

    def writer(self) -> Writer:
        """An idempotent writer outside transactions (heartbeats)."""
        ...

    def reader(self, *, committed: bool = True, name: str = "reader") -> LogReader:
        """A reader, ``read_committed`` unless ``committed`` is false."""
        ...

    def end_offsets(
        self, topic: str, partitions: Sequence[int], *, committed: bool
    ) -> dict[int, int]:
        """Each partition's end: the last stable offset (``committed``: the first offset of
        the oldest open transaction, or the high watermark if none) or the high watermark."""
        ...

    def start_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """Each partition's log start (past 0 once retention or ``delete_records`` moved it)."""
        ...

    def record_at(self, topic: str, partition: int, offset: int) -> Record | None:
        """The record at ``offset``, read ``read_uncommitted`` (also one of an open or aborted
        transaction); None for a transaction marker or an offset outside the log."""
        ...

    def committed_offsets(
        self, group: str, partitions: Sequence[Partition], *, timeout: float = 30.0
    ) -> dict[Partition, Committed]:
        """``group``'s committed offsets (partitions without one are left out).  A partition
        with offsets of an unfinished transaction cannot be answered (Kafka's
        ``UNSTABLE_OFFSET_COMMIT``: the broker answers once the transaction ends):
        :class:`~substreams.errors.BrokerError` after ``timeout``."""
        ...

    def fence(self, transactional_id: str) -> None:
        """Take ``transactional_id`` and let go: its holder is fenced, its open transaction
        aborted."""
        ...

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """Move the log start up to ``before`` (what retention does); the new log start.
        Past the high watermark: :class:`~substreams.errors.BrokerError`."""
        ...
