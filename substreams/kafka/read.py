"""Reading partitions, in one place: the only module that calls ``Consumer.consume``.

Rules every reader of ours follows, written once here:

* **Positions are ours.** Partitions are ``assign()``-ed at offsets the caller keeps in its
  own state (see :mod:`substreams.kafka.client`); :class:`Reader` tracks the next offset of
  every partition it returned a message of.
* **End of partition is an event, not a timeout.** librdkafka's partition EOF (under
  ``read_committed``: the last stable offset) marks a partition *at end* until a later
  message arrives; "caught up" means every assigned partition is at end.
* **Errors raise.** Any error other than EOF raises :class:`~substreams.errors.BrokerError`
  naming the topic and partition; no loop swallows one.  Why: the first version had a read
  loop per caller, some skipped errors and some returned what they had when a deadline
  passed (``read_commits`` in the Spark sink did, and its exactly-once decision rested on
  it: a slow broker could make a committed batch look uncommitted).  :meth:`Reader.iter_to_end`
  returns only at the end of every partition and raises on its timeout: never a partial
  answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from substreams.config import Config
from substreams.errors import BrokerError
from substreams.kafka import client
from substreams.kafka.clock import Deadline, retry

__all__ = ["Reader", "drain", "record_at"]

Partition = tuple[str, int]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0

_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


class Reader:
    """A consumer of assigned partitions that yields data messages only.

    Invariants: ``positions[p]`` is one past the offset of the last message of ``p`` returned
    (or the assigned start); ``p in at_end`` iff the last event seen for ``p`` was its end of
    partition and no message of ``p`` came after it."""

    def __init__(
        self,
        bootstrap: str,
        config: Config | None = None,
        assignment: Iterable[TopicPartition] = (),
        *,
        name: str = "reader",
        **overrides: Any,
    ) -> None:
        self.name = name
        self.consumer: Consumer = client.consumer(
            bootstrap, config, **{"enable.partition.eof": True, **overrides}
        )
        self.positions: dict[Partition, int] = {}
        self.at_end: set[Partition] = set()
        self._assigned: list[Partition] = []
        self.last_transient: str | None = None
        """The last transient error (logged and passed: librdkafka retries it), for the
        message of a read that then times out."""
        self.last_transient_code: int | None = None
        parts = list(assignment)
        if parts:
            self.assign(parts)

    # -- assignment ----------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions`` from their offsets (a negative offset is one of
        librdkafka's logical ones, e.g. ``OFFSET_END``, and is resolved by the broker)."""
        parts = list(partitions)
        self.consumer.assign(parts)
        self._assigned = [(tp.topic, tp.partition) for tp in parts]
        self.positions = {(tp.topic, tp.partition): tp.offset for tp in parts if tp.offset >= 0}
        self.at_end = set()

    def offsets(self, topic: str) -> dict[int, int]:
        """Next offset per partition of ``topic`` (for readers of one topic)."""
        return {p: o for (t, p), o in self.positions.items() if t == topic}

    def ended(self, topic: str) -> set[int]:
        """The partitions of ``topic`` at their end."""
        return {p for t, p in self.at_end if t == topic}

    def lag(self) -> dict[Partition, int]:
        """Messages behind the high watermark per assigned partition, from the consumer's
        cached watermarks (refreshed by every fetch: no broker call).  The consumer's fetch
        position is preferred to ours when known: it has moved past transaction markers,
        which take offsets too, so a caught-up reader shows 0 rather than one per commit."""
        out: dict[Partition, int] = {}
        for topic, partition in self._assigned:
            tp = TopicPartition(topic, partition)
            try:
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
                [fetched] = self.consumer.position([tp])
            except Exception:
                continue
            if high is None or high < 0:
                continue
            at = max(self.positions.get((topic, partition), 0), fetched.offset)
            out[(topic, partition)] = max(0, high - at)
        return out

    @property
    def caught_up(self) -> bool:
        """Every assigned partition is at its end."""
        return bool(self._assigned) and all(p in self.at_end for p in self._assigned)

    def committed(self, partitions: list[TopicPartition], timeout: float = 30.0
                  ) -> list[TopicPartition]:
        """The consumer group's committed offsets of ``partitions`` (negative: none).

        Retries while the group coordinator is being elected or loads its offsets
        (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``...: seen on a fresh broker,
        for seconds after its start)."""
        try:
            found: list[TopicPartition] = retry(
                lambda deadline: self.consumer.committed(
                    partitions, timeout=deadline.left(1.0, 10.0)
                ),
                lambda exc: client.transient(exc, _COORDINATOR_MOVING),
                timeout,
                pause=0.2,
                on_retry=lambda exc: log.info(
                    "%s: committed offsets not available yet (%s); retrying",
                    self.name, exc.args[0],
                ),
            )
        except KafkaException as exc:
            raise BrokerError(f"{self.name}: committed offsets: {exc.args[0]}") from exc
        return found

    def watermarks(
        self, topic: str, partition: int = 0, timeout: float = 30.0
    ) -> tuple[int, int]:
        return client.watermarks(self.consumer, topic, partition, timeout)

    def log_start(self, topic: str, partition: int = 0) -> int:
        """The partition's first offset: past 0 once retention removed its oldest records."""
        return max(0, self.watermarks(topic, partition)[0])

    # -- reading -------------------------------------------------------------------------

    def _take(self, events: list[Message]) -> list[Message]:
        out: list[Message] = []
        for msg in events:
            err = msg.error()
            part = (msg.topic(), msg.partition())
            if err is None:
                out.append(msg)
                self.positions[part] = msg.offset() + 1
                self.at_end.discard(part)
            elif err.code() == KafkaError._PARTITION_EOF:
                self.at_end.add(part)
                self.positions[part] = max(self.positions.get(part, 0), msg.offset())
            else:
                where = f"{part[0]}[{part[1]}]" if part[0] else "broker"
                if err.retriable() or err.code() in client.MOVING:
                    # librdkafka keeps fetching through these (a leader moving, a broker
                    # restarting); a read that must finish has its own deadline.
                    seen = f"{where}: {err}"
                    if seen != self.last_transient:  # once per new error, not per poll
                        log.warning("%s: %s (librdkafka retries)", self.name, seen)
                    self.last_transient, self.last_transient_code = seen, err.code()
                    continue
                raise BrokerError(f"{self.name}: {where}: {err}")
        return out

    def poll(self, timeout: float = 0.1, max_messages: int = 500) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` for the first."""
        return self._take(self.consumer.consume(max_messages, timeout))

    def poll_batch(self, timeout: float, max_messages: int) -> list[Message]:
        """What is buffered, or else block up to ``timeout`` for one message and take what
        came with it: a busy loop returns without waiting, an idle one sleeps in librdkafka
        (``consume(n, t)`` would wait the full ``t`` for ``n`` messages)."""
        events: list[Message] = self.consumer.consume(max_messages, 0)
        if not events:
            first = self.consumer.poll(timeout)
            if first is None:
                return []
            events = [first, *self.consumer.consume(max_messages - 1, 0)]
        return self._take(events)

    def iter_to_end(self, timeout: float = 30.0, max_messages: int = 1000) -> Iterator[Message]:
        """Every message from the current positions up to the end of every assigned
        partition, as it arrives (a caller may stop early); :class:`BrokerError` if that end
        is not reached within ``timeout``.

        The end is the one librdkafka reports: a partition that reported its end and has
        delivered nothing since counts as at end without another round trip, so call this on
        a reader that is new or has been polled to its end by its owner (every caller)."""
        deadline = Deadline(timeout)
        while not self.caught_up:
            yield from self.poll(0.2, max_messages)
            # After the fetch, not before it: a zero timeout still reads what is there.
            if not self.caught_up and deadline.passed:
                missing = [f"{t}[{p}]" for t, p in self._assigned if (t, p) not in self.at_end]
                why = "" if self.last_transient is None else f" (last error: {self.last_transient})"
                raise BrokerError(
                    f"{self.name}: no end of partition within {timeout:g} s for "
                    + ", ".join(missing) + why
                )

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Close the consumer, giving up on it after ``timeout`` seconds.

        Why a watchdog: librdkafka's ``rd_kafka_destroy`` occasionally never returns (it
        joins an internal thread that does not stop; librdkafka issue #4519, "once in several
        hundreds" of closes, seen once here in a full test run).  A reader that hangs in its
        close would hang its service; a leaked consumer only costs a thread and a socket."""
        done = threading.Event()

        def close() -> None:
            try:
                self.consumer.close()
            except Exception as exc:
                log.debug("%s: close: %s", self.name, exc)
            finally:
                done.set()

        threading.Thread(target=close, name=f"close {self.name}", daemon=True).start()
        if not done.wait(timeout):
            log.warning("%s: the consumer did not close within %.0f s (librdkafka #4519); "
                        "left behind", self.name, timeout)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drain(
    bootstrap: str,
    config: Config | None,
    topic: str,
    partition: int = 0,
    start: int = 0,
    timeout: float = 30.0,
) -> Iterator[Message]:
    """Every message of ``topic[partition]`` from offset ``start`` to its end, with a reader
    of its own (closed afterwards)."""
    with Reader(bootstrap, config, [TopicPartition(topic, partition, start)], name=topic) as r:
        yield from r.iter_to_end(timeout)


def record_at(
    bootstrap: str, config: Config | None, topic: str, partition: int, offset: int,
    timeout: float = 5.0,
) -> Message | None:
    """The message at ``offset``, read ``read_uncommitted``: also one of a transaction that
    is still open (what holds a partition's last stable offset).  None if none came within
    ``timeout``, or the offset holds no message (a transaction marker, a compacted one)."""
    reader = Reader(
        bootstrap, config, [TopicPartition(topic, partition, offset)],
        name=f"{topic}[{partition}]@{offset}", **{"isolation.level": "read_uncommitted"},
    )
    try:
        deadline = Deadline(timeout)
        while True:  # the deadline after the fetch: a zero timeout still reads what is there
            for msg in reader.poll(0.2, 1):
                return msg if msg.offset() == offset else None
            if (topic, partition) in reader.at_end or deadline.passed:
                return None
    finally:
        reader.close()
