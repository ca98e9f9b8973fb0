"""A fatal error found during a flush is raised as itself, whatever confluent-kafka's
``flush`` raised in its place (:func:`substreams.kafka.write.flush`)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from substreams.kafka import client
from substreams.kafka.write import is_fenced

LOST = "<built-in method flush of cimpl.Producer object> returned NULL without setting an exception"


class FlushFails:
    """A producer whose ``flush`` raised ``SystemError`` and whose ``init_transactions``
    answers with ``state`` (what librdkafka answers an initialised producer)."""

    def __init__(self, state: KafkaError, raised: BaseException | None = None) -> None:
        self.state = state
        self.raised = raised

    def flush(self, timeout: float) -> int:
        raise SystemError(LOST) from self.raised

    def init_transactions(self, timeout: float) -> None:
        raise KafkaException(self.state)


def test_a_lost_fence_exception_is_found_on_the_producer() -> None:
    fenced = FlushFails(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    with pytest.raises(KafkaException) as raised:
        client.flush_producer(fenced, "writer")
    assert is_fenced(raised.value) and isinstance(raised.value.__cause__, SystemError)


def test_a_fence_the_system_error_was_caused_by_is_raised() -> None:
    cause = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    sound = FlushFails(KafkaError(KafkaError._STATE, "Operation not valid in state InTransaction"),
                       raised=cause)
    with pytest.raises(KafkaException) as raised:
        client.flush_producer(sound, "writer")
    assert raised.value.args[0] is cause.args[0]


def test_a_system_error_of_a_sound_producer_stays_one() -> None:
    sound = FlushFails(KafkaError(KafkaError._STATE, "Operation not valid in state InTransaction"))
    with pytest.raises(SystemError, match="without setting an exception"):
        client.flush_producer(sound, "writer")


def test_the_log_writer_raises_its_fenced_error() -> None:
    from substreams.kafka.brokerlog import KafkaWriter
    from substreams.kafka.log import FencedError

    writer = KafkaWriter("127.0.0.1:9", None, "writer")  # never connects: flush is stubbed
    writer._producer = FlushFails(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(FencedError):
        writer.flush()
