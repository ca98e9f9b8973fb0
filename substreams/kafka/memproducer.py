"""What a publisher uses of confluent-kafka's ``Producer``, over the in-memory log.

Why: :class:`~substreams.streams.publisher.Publisher` talks to librdkafka directly (its
transactions, delivery callbacks, fencing are what carry the guarantees), so the simulator
can only run the real publisher if something answers those calls the way the client does.
:class:`MemoryProducer` is that, on a :class:`~substreams.kafka.memory.MemoryLog`:

* ``init_transactions`` takes the transactional id (fencing the earlier holder),
  ``begin_transaction`` / ``commit_transaction`` / ``abort_transaction`` /
  ``send_offsets_to_transaction`` are the log writer's; without a ``transactional.id`` the
  producer writes outside transactions (a source's heartbeats).
* ``produce`` appends at once (the log's rule 3) and queues the record's delivery callback,
  served by ``poll`` and ``flush`` (and by the commit), with the record's partition and
  offset -- as librdkafka serves its callbacks only from those calls.
* Fencing is reported as the client reports it: a ``KafkaException`` holding a fatal
  ``KafkaError`` with code ``_FENCED`` (what :func:`substreams.kafka.write.is_fenced`
  recognises).  As librdkafka, ``produce`` itself does not raise it: the record is refused
  by the broker, its delivery callback gets the error, and the next call that reaches the
  coordinator (``send_offsets_to_transaction``, the commit, an abort, and ``begin`` once
  the fatal state is known) raises it.
* ``calls``: a hook called before and after every call that reaches the log, with the
  call's name and ``"before"``/``"after"`` -- where a test or the simulator makes the
  process die (it raises) between two steps of the publisher.

Not modelled: queue limits (``BufferError`` never happens), retriable errors, timeouts (the
log never waits), the default partitioner's randomness (``partition=-1`` hashes the key,
or takes partition 0 without one).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from substreams.kafka.log import TRANSACTION_TIMEOUT_MS, Committed, FencedError
from substreams.kafka.memory import MemoryLog, MemoryTransactionalWriter, MemoryWriter

__all__ = ["CallHook", "MemoryMessage", "MemoryProducer", "MemoryProducers"]

CallHook = Callable[[str, str], None]
"""``(call, when)``: called with ``when`` = ``"before"`` and ``"after"`` around each call of
a producer that reaches the log (``produce``, ``commit``, ``abort``, ``send_offsets``,
``init``); may raise to end the process there."""

DeliveryCallback = Callable[[KafkaError | None, Any], None]


class MemoryMessage:
    """The part of a delivered ``confluent_kafka.Message`` a delivery callback reads."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_topic", "_value")

    def __init__(self, topic: str, partition: int, offset: int | None, value: bytes | None,
                 key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._value = value
        self._key = key
        self._headers = list(headers)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def error(self) -> None:
        return None


def fenced_exception(why: str) -> KafkaException:
    """What librdkafka raises from a fenced producer's transactional calls."""
    return KafkaException(KafkaError(KafkaError._FENCED, why, fatal=True))


def _raw(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


class MemoryProducer:
    """One producer (see the module doc); built by :class:`MemoryProducers`."""

    def __init__(self, log: MemoryLog, settings: Mapping[str, Any],
                 calls: CallHook | None = None) -> None:
        self._log = log
        self._calls = calls
        txid = settings.get("transactional.id")
        self.transactional_id: str | None = str(txid) if txid else None
        self._timeout_ms = int(settings.get("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS))
        self._txn: MemoryTransactionalWriter | None = None
        self._plain: MemoryWriter | None = None if txid else log.writer()
        self._queue: list[tuple[DeliveryCallback, KafkaError | None, MemoryMessage]] = []
        self._fenced: str | None = None
        """Why this producer is fenced, once it learnt it (the fatal state sticks)."""

    # -- helpers -----------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn`` between the call hook's ``before`` and ``after``; a fence raised as the
        client raises it."""
        calls = self._calls
        if calls is not None:
            calls(what, "before")
        try:
            out = fn()
        except FencedError as exc:
            self._fenced = str(exc)
            raise fenced_exception(str(exc)) from exc
        if calls is not None:
            calls(what, "after")
        return out

    def _writer(self) -> MemoryTransactionalWriter:
        if self._txn is None:
            raise KafkaException(KafkaError(
                KafkaError._STATE, "transactions not initialised (init_transactions)"))
        return self._txn

    def _check_fatal(self) -> None:
        if self._fenced is not None:
            raise fenced_exception(self._fenced)

    def _serve(self) -> int:
        """Every queued delivery callback, in the order produced; how many."""
        queue, self._queue = self._queue, []
        for callback, err, msg in queue:
            callback(err, msg)
        return len(queue)

    # -- the Producer calls --------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        txid = self.transactional_id
        if txid is None:
            raise KafkaException(KafkaError(
                KafkaError._NOT_CONFIGURED, "init_transactions without transactional.id"))
        self._txn = self._call(
            "init", lambda: self._log.transactional_writer(txid, timeout_ms=self._timeout_ms))

    def begin_transaction(self) -> None:
        self._check_fatal()
        writer = self._writer()
        self._call("begin", writer.begin)

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        *,
        headers: Sequence[tuple[str, bytes]] | None = None,
        timestamp: int = 0,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Append the record at once (a refused one -- fenced -- gets an error callback)."""
        callback = on_delivery or callback
        raw = _raw(key)
        if partition < 0:
            n = self._log.partitions(topic)
            partition = zlib.crc32(raw) % n if raw is not None else 0
        heads = headers or ()
        stamp = timestamp or None
        err: KafkaError | None = None
        offset: int | None = None
        if self._plain is not None:
            writer: MemoryWriter | MemoryTransactionalWriter = self._plain
        else:
            writer = self._writer()
        try:
            def append() -> None:
                writer.produce(topic, partition, value, key=raw, headers=heads,
                               timestamp_ms=stamp)

            self._call("produce", append)
            offset = writer.flush()[-1].offset  # the record just appended
        except KafkaException as exc:
            err = exc.args[0]
        if callback is not None:
            msg = MemoryMessage(topic, partition, offset, value, raw, heads)
            self._queue.append((callback, err, msg))

    def poll(self, timeout: float | None = None) -> int:
        return self._serve()

    def flush(self, timeout: float | None = None) -> int:
        """Serve every delivery callback; nothing is ever left undelivered (0)."""
        self._serve()
        return 0

    def __len__(self) -> int:
        return len(self._queue)

    def send_offsets_to_transaction(
        self, positions: Sequence[TopicPartition], group_metadata: Any,
        timeout: float | None = None,
    ) -> None:
        """``group_metadata``: the group's id (``str``) or anything with ``group_id``."""
        self._check_fatal()
        writer = self._writer()
        group = group_metadata if isinstance(group_metadata, str) else group_metadata.group_id
        offsets = {(tp.topic, tp.partition): Committed(tp.offset, tp.metadata or "")
                   for tp in positions}
        self._call("send_offsets", lambda: writer.send_offsets(group, offsets))

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Deliver (serve the callbacks) and commit."""
        self._serve()
        self._check_fatal()
        writer = self._writer()
        self._call("commit", writer.commit)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._queue = []
        self._check_fatal()
        writer = self._writer()
        self._call("abort", writer.abort)


class MemoryProducers:
    """The producer factory over ``log``: called as :func:`substreams.kafka.client.producer`
    is (bootstrap, config, keyword settings), so that the composition root can hand it to a
    publisher in place of the real client.  ``calls``: see :data:`CallHook` (shared by every
    producer it builds)."""

    def __init__(self, log: MemoryLog, calls: CallHook | None = None) -> None:
        self.log = log
        self.calls = calls
        self.built: list[MemoryProducer] = []
        """Every producer built, in order (tests look at them)."""

    def __call__(self, bootstrap: str, config: Any = None, *,
                 transactional_id: str | None = None, **overrides: Any) -> MemoryProducer:
        settings: dict[str, Any] = {"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
        if transactional_id:
            settings["transactional.id"] = transactional_id
        settings.update(overrides)
        producer = MemoryProducer(self.log, settings, self.calls)
        self.built.append(producer)
        return producer
