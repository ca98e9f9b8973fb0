"""Writing, in one place: producer backpressure and fencing.

* **Backpressure.** ``Producer.produce`` raises ``BufferError`` when librdkafka's queue is
  full (``queue.buffering.max.messages``); the only right answer is to serve delivery
  callbacks and try again, never to drop the record.  :func:`produce` does that for one
  record, :func:`produce_batch` for many.
* **Fencing.** A transactional producer whose id was taken by a newer instance gets
  ``PRODUCER_FENCED`` / ``_FENCED`` / ``INVALID_PRODUCER_EPOCH`` from its next transactional
  call; that is fatal for it and must surface as the caller's own fenced error (a publisher's
  :class:`~substreams.errors.PublisherFencedError`, an acker's), never as a retriable broker
  hiccup.  :func:`is_fenced` is the one test, :func:`fenced_as` the one translation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

__all__ = [
    "FENCED_CODES", "fatal_error", "fenced_as", "flush", "is_fenced", "produce", "produce_batch",
    "raise_fatal",
]

FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    *,
    key: str | bytes | None = None,
    partition: int = -1,
    headers: list[tuple[str, bytes]] | None = None,
    on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
    timestamp_ms: int | None = None,
) -> None:
    """Queue one message, waiting (serving delivery callbacks) while the queue is full."""
    kwargs: dict[str, Any] = {"value": value, "key": key, "headers": headers}
    if partition >= 0:
        kwargs["partition"] = partition
    if timestamp_ms is not None:
        kwargs["timestamp"] = timestamp_ms
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)



def produce_batch(
    producer: Producer,
    topic: str,
    values: Sequence[bytes],
    parts: Sequence[int],
    keys: Sequence[str | bytes | None] | None,
    callbacks: Sequence[Callable[[KafkaError | None, Any], None]] | None,
    refused: Callable[[int], None] | None = None,
) -> None:
    """:func:`produce` of every record, calling librdkafka directly (positional arguments,
    no kwargs dict and no Python layer per record: at granularity 1 the per-record Python
    around ``produce()`` costs as much as the call itself); a full queue is waited out,
    resuming at the record that did not fit.  Any other error is raised after
    ``refused(i)`` (record ``i`` and those after it were not produced).  No headers: the
    records it writes (data records) carry their schema in the value."""
    raw = producer.produce
    n = len(values)
    keys_ = [None] * n if keys is None else keys
    cbs = [None] * n if callbacks is None else callbacks
    i = 0
    while i < n:
        try:
            for i in range(i, n):  # noqa: B020 -- resumes where a BufferError stopped it
                raw(topic, values[i], keys_[i], parts[i], cbs[i])
            return
        except BufferError:
            producer.poll(0.05)
        except BaseException as exc:
            if refused is not None:
                refused(i)
            if isinstance(exc, KafkaException):
                raise_fatal(producer, exc)
            raise


def raise_fatal(producer: Producer, exc: KafkaException) -> None:
    """Raise ``exc`` -- or, for librdkafka's generic "Unable to produce message: Local: Fatal
    error" (``_FATAL``), the producer's own fatal error (a fence found by an earlier request),
    which a caller can tell (:func:`is_fenced`)."""
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and err.code() == KafkaError._FATAL:
        real = fatal_error(producer, exc)
        if real is not None:
            raise KafkaException(real) from exc
    raise exc


def flush(producer: Producer, timeout: float) -> int:
    """``producer.flush(timeout)`` (the messages still queued), with a fatal error found
    during it (a fence) raised as the ``KafkaException`` it is.

    Why: confluent-kafka's error callback sets a fatal error's exception without keeping it
    aside, so a delivery callback served after it in the same flush fails ("... returned a
    result with an exception set"), or the exception is lost ("... returned NULL without
    setting an exception"): ``flush`` raises ``SystemError``, which no caller can tell from a
    bug, in place of the fence."""
    try:
        return int(producer.flush(timeout))
    except SystemError as exc:
        err = fatal_error(producer, exc)
        if err is None:
            raise
        raise KafkaException(err) from exc


PROBE_TIMEOUT_S = 10.0
"""For :func:`fatal_error`'s ``init_transactions``: a local answer, no request is sent."""


def fatal_error(producer: Producer, raised: BaseException | None = None) -> KafkaError | None:
    """The fatal error of ``producer`` (a fence, ...), or None: the one ``raised`` carries or
    was caused by, else what a transactional producer answers ``init_transactions`` with.

    Why a probe: confluent-kafka has no getter for librdkafka's fatal error.  On a producer
    that already took its id, ``init_transactions`` changes nothing: librdkafka answers with
    the fatal error, the abortable one, or a state error (a producer without a
    ``transactional.id``: not configured)."""
    seen, hops = raised, 0
    while seen is not None and hops < 10:
        err = seen.args[0] if isinstance(seen, KafkaException) and seen.args else None
        if isinstance(err, KafkaError) and err.fatal():
            return err
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    try:
        producer.init_transactions(PROBE_TIMEOUT_S)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.fatal():
            return err
    return None


def is_fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says this transactional producer was replaced by a newer one."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    return isinstance(err, KafkaError) and err.code() in FENCED_CODES


@contextmanager
def fenced_as(make_error: Callable[[], Exception]) -> Iterator[None]:
    """Inside the block, a fencing error is raised as ``make_error()`` (chained)."""
    try:
        yield
    except KafkaException as exc:
        if is_fenced(exc):
            raise make_error() from exc
        raise
