"""The one read layer's rules (substreams.kafka.read.Reader), on messages made by hand:
positions, end of partition, errors raised or (transient ones) passed, committed offsets
waited for while a coordinator moves."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from substreams.errors import BrokerError
from substreams.kafka.read import Reader


def data(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"x")


def eof(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset,
                   error=KafkaError(KafkaError._PARTITION_EOF))


@pytest.fixture
def reader() -> Iterator[Reader]:
    r = Reader("127.0.0.1:1", name="test reader")  # never connects: _take is fed by hand
    real = r.consumer
    r._assigned = [("t", 0), ("t", 1)]
    yield r
    real.close()


def test_data_moves_positions_and_end_of_partition_marks_caught_up(reader: Reader) -> None:
    got = reader._take([data("t", 0, 5), data("t", 0, 6), eof("t", 0, 7)])
    assert [m.offset() for m in got] == [5, 6]
    assert reader.positions[("t", 0)] == 7 and reader.ended("t") == {0}
    assert not reader.caught_up  # partition 1 has not reported its end
    reader._take([eof("t", 1, 0)])
    assert reader.caught_up and reader.offsets("t") == {0: 7, 1: 0}
    reader._take([data("t", 1, 0)])  # a message after the end: no longer at end
    assert not reader.caught_up and reader.ended("t") == {0}


def test_a_fatal_error_raises_naming_the_partition(reader: Reader) -> None:
    err = Message(topic="t", partition=1, offset=-1,
                  error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(BrokerError, match=r"test reader: t\[1\]"):
        reader._take([data("t", 0, 1), err])


def test_a_transient_error_is_logged_once_and_passed(
    reader: Reader, caplog: pytest.LogCaptureFixture
) -> None:
    moving = Message(topic="t", partition=0, offset=-1,
                     error=KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    with caplog.at_level(logging.WARNING, logger="substreams.kafka.read"):
        assert reader._take([moving, moving, data("t", 0, 3)])[0].offset() == 3
    assert len([r for r in caplog.records if "NOT_LEADER" in r.getMessage()
                or "Not leader" in r.getMessage()]) == 1
    assert reader.last_transient_code == KafkaError.NOT_LEADER_FOR_PARTITION


class _Flaky:
    """A consumer whose coordinator is not ready for the first ``fails`` calls."""

    def __init__(self, fails: int, code: int) -> None:
        self.fails, self.code, self.calls = fails, code, 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.calls += 1
        if self.calls <= self.fails:
            raise KafkaException(KafkaError(self.code))
        return [TopicPartition(tp.topic, tp.partition, 42) for tp in partitions]


def test_committed_waits_while_the_coordinator_moves(reader: Reader) -> None:
    reader.consumer = _Flaky(2, KafkaError.NOT_COORDINATOR)  # type: ignore[assignment]
    [tp] = reader.committed([TopicPartition("t", 0)], timeout=10)
    assert tp.offset == 42 and reader.consumer.calls == 3  # type: ignore[attr-defined]


def test_committed_raises_other_errors_at_once(reader: Reader) -> None:
    reader.consumer = _Flaky(1, KafkaError.GROUP_AUTHORIZATION_FAILED)  # type: ignore[assignment]
    with pytest.raises(BrokerError, match="committed offsets"):
        reader.committed([TopicPartition("t", 0)], timeout=10)


class _Stuck:
    """A consumer whose close never returns (librdkafka #4519) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def close(self) -> None:
        self.release.wait()


def test_a_close_that_hangs_is_given_up_after_its_timeout(
    reader: Reader, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = _Stuck()
    reader.consumer = stuck  # type: ignore[assignment]
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="substreams.kafka.read"):
        reader.close(timeout=0.3)
    stuck.release.set()
    assert time.monotonic() - began < 5
    assert any("did not close within" in r.getMessage() for r in caplog.records)
