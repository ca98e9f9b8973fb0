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
        self.closed = False

    def flush(self, timeout: float) -> int:
        raise SystemError(LOST) from self.raised

    def init_transactions(self, timeout: float) -> None:
        raise KafkaException(self.state)

    def close(self) -> None:
        self.closed = True


class Closes:
    """A consumer or reader that notes its ``close``."""

    closed = False

    def close(self) -> None:
        self.closed = True


def fenced() -> FlushFails:
    return FlushFails(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))


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


# -- the closes: each says the fence (or logs it, where a close must not raise) ------------


def test_the_control_writer_close_raises_its_fenced_error() -> None:
    """The acker's recovery learns of a takeover from this close (``_rewind``)."""
    from substreams.control.io import ControlWriter
    from substreams.errors import PublisherFencedError

    writer = ControlWriter.__new__(ControlWriter)  # no broker: only close is called
    writer.writer, writer._producer = "acker", fenced()
    with pytest.raises(PublisherFencedError, match="control writer 'acker' was fenced"):
        writer.close()


def test_a_log_writer_close_logs_a_fence(caplog: pytest.LogCaptureFixture) -> None:
    from substreams.kafka.brokerlog import KafkaWriter

    writer = KafkaWriter("127.0.0.1:9", None, "writer")  # never connects: flush is stubbed
    writer._producer = fenced()
    writer.close()  # lets go, as the in-memory writer's close does
    assert "writer: closing after a fatal error" in caplog.text
    assert "fenced by a newer instance" in caplog.text


def test_a_transactional_log_writer_close_logs_a_fence_and_closes_its_consumers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from substreams.kafka.brokerlog import KafkaTransactionalWriter

    writer = KafkaTransactionalWriter.__new__(KafkaTransactionalWriter)  # no init_transactions
    group = Closes()
    writer.name, writer._producer, writer._groups = "txn", fenced(), {"g": group}
    writer.close()
    assert group.closed and writer._groups == {}
    assert "txn: closing after a fatal error" in caplog.text


def test_the_heartbeat_close_does_not_fail_the_final_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fatal error found by the heartbeat producer's last flush (met on a plain producer:
    the one the ``SystemError`` was caused by) is logged: the close runs inside the
    publisher's final commit."""
    from substreams.acker.tracker import Heartbeat

    cause = KafkaException(KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True))
    unconfigured = KafkaError(KafkaError._NOT_CONFIGURED, "no transactional.id")
    beat = Heartbeat.__new__(Heartbeat)
    beat._closed, beat._cancel = False, lambda: None
    beat._producer = FlushFails(unconfigured, raised=cause)
    beat.close()
    assert beat._closed and "idempotence broken" in caplog.text


def test_the_acker_client_close_logs_a_fatal_error_and_closes_its_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from substreams.acker.client import AckerClient

    cause = KafkaException(KafkaError(KafkaError._FATAL, "idempotence broken", fatal=True))
    producer = FlushFails(KafkaError(KafkaError._NOT_CONFIGURED, "no transactional.id"), cause)
    reader = Closes()
    session = AckerClient.__new__(AckerClient)
    session.controller, session._producer, session._reader = "ctl", producer, reader
    session.close()
    assert producer.closed and reader.closed
    assert "controller 'ctl': closing after a fatal error" in caplog.text
