"""The :class:`~substreams.kafka.log.Log` of a real Kafka cluster, over this package's
functions (client settings, :class:`~substreams.kafka.read.Reader`, ``produce``, the patient
commit, the isolation-aware end offsets, ``record_at``): no Kafka rule is written twice.

Errors: a fencing error (``PRODUCER_FENCED``, ``_FENCED``, ``INVALID_PRODUCER_EPOCH``; also
what a transaction aborted by its coordinator's timeout leaves) is raised as
:class:`~substreams.kafka.log.FencedError`, every other ``KafkaException`` as
:class:`~substreams.errors.BrokerError` with the original as its cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from substreams.config import Config
from substreams.errors import BrokerError
from substreams.kafka import client
from substreams.kafka.log import (
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
from substreams.kafka.read import Reader, record_at
from substreams.kafka.topics import ensure_topics
from substreams.kafka.write import FENCED_CODES, fenced_as, produce

__all__ = ["KafkaLog", "KafkaLogReader", "KafkaTransactionalWriter", "KafkaWriter", "record_of"]


def record_of(msg: Message) -> Record:
    """The :class:`Record` of a data message."""
    key = msg.key()
    return Record(
        msg.topic(), msg.partition(), msg.offset(), msg.value(),
        key.encode() if isinstance(key, str) else key,
        tuple(msg.headers() or ()), int(msg.timestamp()[1]),
    )


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Inside the block: fenced -> FencedError, any other KafkaException -> BrokerError."""
    try:
        with fenced_as(lambda: FencedError(f"{what}: fenced by a newer writer of its id")):
            yield
    except KafkaException as exc:
        raise BrokerError(f"{what}: {exc.args[0] if exc.args else exc}") from exc


class KafkaWriter:
    """An idempotent producer (``client.producer``); :meth:`flush` returns the records
    delivered with their offsets, collected by delivery callbacks."""

    def __init__(self, bootstrap: str, config: Config | None, name: str,
                 **overrides: Any) -> None:
        self.name = name
        self._producer = client.producer(bootstrap, config, **overrides)
        self._slots: list[Record | KafkaError | None] = []

    def _on_delivery(self, slot: int) -> Callable[[KafkaError | None, Message], None]:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            self._slots[slot] = err if err is not None else record_of(msg)
        return delivered

    def produce(
        self, topic: str, partition: int, value: bytes | None, *, key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (), timestamp_ms: int | None = None,
    ) -> None:
        self._slots.append(None)
        try:
            with _translated(self.name):
                produce(
                    self._producer, topic, value, key=key, partition=partition,
                    headers=list(headers), on_delivery=self._on_delivery(len(self._slots) - 1),
                    timestamp_ms=timestamp_ms,
                )
        except BaseException:
            self._slots.pop()  # refused: never queued, never delivered
            raise

    def flush(self) -> list[Record]:
        with _translated(self.name):
            client.flush_producer(self._producer, self.name)
        slots, self._slots = self._slots, []
        out: list[Record] = []
        for slot in slots:
            if isinstance(slot, Record):
                out.append(slot)
                continue
            if isinstance(slot, KafkaError) and slot.code() in FENCED_CODES:
                raise FencedError(f"{self.name}: fenced by a newer writer of its id")
            raise BrokerError(f"{self.name}: a record was not delivered: {slot}")
        return out

    def close(self) -> None:
        """Let go, as the in-memory writer does: never raises for a fence (logged)."""
        client.flush_at_close(self._producer, self.name, 10)


class KafkaTransactionalWriter(KafkaWriter):
    """A transactional producer that took its id (``init_transactions``) when made."""

    def __init__(self, bootstrap: str, config: Config | None, transactional_id: str,
                 timeout_ms: int) -> None:
        super().__init__(
            bootstrap, config, f"transactional writer '{transactional_id}'",
            **{"transactional.id": transactional_id, "transaction.timeout.ms": timeout_ms},
        )
        self._id = transactional_id
        self._bootstrap = bootstrap
        self._config = config
        self._groups: dict[str, Consumer] = {}
        with _translated(self.name):
            self._producer.init_transactions(30)

    @property
    def transactional_id(self) -> str:
        return self._id

    def begin(self) -> None:
        with _translated(self.name):
            self._producer.begin_transaction()

    def send_offsets(self, group: str, offsets: Mapping[Partition, Committed]) -> None:
        """The group's metadata comes from a consumer of that group id, never joined (as
        the stages' readers do)."""
        consumer = self._groups.get(group)
        if consumer is None:
            consumer = self._groups[group] = client.consumer(
                self._bootstrap, self._config, **{"group.id": group}
            )
        parts = [
            TopicPartition(t, p, c.offset, metadata=c.metadata) if c.metadata
            else TopicPartition(t, p, c.offset)
            for (t, p), c in offsets.items()
        ]
        with _translated(self.name):
            self._producer.send_offsets_to_transaction(
                parts, consumer.consumer_group_metadata(), 30
            )

    def commit(self) -> None:
        self.flush()
        with _translated(self.name):
            client.commit_transaction(
                self._producer, self.name, call_timeout=client.commit_timeout(self._config)
            )

    def abort(self) -> None:
        self._slots = []
        with _translated(self.name):
            self._producer.abort_transaction(10)

    def close(self) -> None:
        """Let go; an open transaction stays open (until fenced or timed out), as a
        crashed process leaves it."""
        try:
            client.flush_at_close(self._producer, self.name, 10)
        finally:
            for consumer in self._groups.values():
                consumer.close()
            self._groups = {}


class KafkaLogReader:
    """A :class:`~substreams.kafka.read.Reader` returning :class:`Record`\\ s."""

    def __init__(self, bootstrap: str, config: Config | None, *, committed: bool,
                 name: str) -> None:
        level = "read_committed" if committed else "read_uncommitted"
        self.reader = Reader(bootstrap, config, name=name, **{"isolation.level": level})

    def assign(self, starts: Mapping[Partition, int]) -> None:
        self.reader.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])

    def poll(self, timeout: float = 0.0, max_records: int = 500) -> list[Record]:
        return [record_of(m) for m in self.reader.poll_batch(timeout, max_records)]

    @property
    def positions(self) -> Mapping[Partition, int]:
        return self.reader.positions

    @property
    def at_end(self) -> Set[Partition]:
        return self.reader.at_end

    @property
    def caught_up(self) -> bool:
        return self.reader.caught_up

    def close(self) -> None:
        self.reader.close()


class KafkaLog:
    """A Kafka cluster at ``bootstrap``."""

    def __init__(self, bootstrap: str, config: Config | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self._admin = client.admin(bootstrap, config)

    def create_topics(self, topics: Mapping[str, int]) -> None:
        ensure_topics(self._admin, list(topics.items()), log_differences=False)

    def transactional_writer(
        self, transactional_id: str, *, timeout_ms: int = TRANSACTION_TIMEOUT_MS
    ) -> KafkaTransactionalWriter:
        return KafkaTransactionalWriter(self.bootstrap, self.config, transactional_id,
                                        timeout_ms)

    def writer(self) -> KafkaWriter:
        return KafkaWriter(self.bootstrap, self.config, "idempotent writer")

    def reader(self, *, committed: bool = True, name: str = "reader") -> KafkaLogReader:
        return KafkaLogReader(self.bootstrap, self.config, committed=committed, name=name)

    def end_offsets(
        self, topic: str, partitions: Sequence[int], *, committed: bool
    ) -> dict[int, int]:
        with _translated(f"end offsets of '{topic}'"):
            return client.end_offsets(self._admin, topic, list(partitions), committed=committed)

    def start_offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        with _translated(f"start offsets of '{topic}'"):
            return client.start_offsets(self._admin, topic, list(partitions))

    def record_at(self, topic: str, partition: int, offset: int) -> Record | None:
        msg = record_at(self.bootstrap, self.config, topic, partition, offset)
        return None if msg is None else record_of(msg)

    def committed_offsets(
        self, group: str, partitions: Sequence[Partition], *, timeout: float = 30.0
    ) -> dict[Partition, Committed]:
        with Reader(self.bootstrap, self.config, name=f"group '{group}'",
                    **{"group.id": group}) as reader:
            found = reader.committed([TopicPartition(t, p) for t, p in partitions], timeout)
        return {
            (tp.topic, tp.partition): Committed(tp.offset, tp.metadata or "")
            for tp in found if tp.offset >= 0
        }

    def fence(self, transactional_id: str) -> None:
        with _translated(f"fencing '{transactional_id}'"):
            client.fence(self.bootstrap, self.config, transactional_id)

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        with _translated(f"delete_records {topic}[{partition}] before {before}"):
            [fut] = self._admin.delete_records(
                [TopicPartition(topic, partition, before)]
            ).values()
            return int(fut.result(30).low_watermark)


if TYPE_CHECKING:  # mypy proves that the classes implement the Protocols

    def _implements(
        log: KafkaLog, writer: KafkaWriter, txn: KafkaTransactionalWriter,
        reader: KafkaLogReader,
    ) -> tuple[Log, Writer, TransactionalWriter, LogReader]:
        return log, writer, txn, reader
