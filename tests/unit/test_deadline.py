"""The one deadline and retry helper of the wait loops (``kafka/clock.py``), on a
:class:`SimClock`: no real second passes."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from substreams.kafka.client import MOVING, transient
from substreams.kafka.clock import Deadline, SimClock, retry


def test_deadline_counts_down_restarts_and_shortens() -> None:
    clock = SimClock()
    d = Deadline(10.0, clock)
    clock.advance(4.0)
    assert d.left() == pytest.approx(6.0)
    assert d.left(1.0, 5.0) == 5.0 and not d.passed
    clock.advance(6.0)
    assert d.passed and d.left() == 0.0 and d.left(1.0, 30.0) == 1.0
    d.restart()
    assert d.left() == pytest.approx(10.0)
    d.shorten(3.0)
    d.shorten(20.0)  # later than the deadline: no change
    assert d.left() == pytest.approx(3.0)


def test_retry_retries_a_transient_error_until_the_timeout_then_raises_it() -> None:
    clock = SimClock()
    calls: list[float] = []
    retried: list[Exception] = []

    def call(deadline: Deadline) -> int:
        calls.append(deadline.left())
        raise TimeoutError(len(calls))

    with pytest.raises(TimeoutError) as info:
        retry(call, lambda e: isinstance(e, TimeoutError), 1.0, 0.25, retried.append, clock)
    assert calls == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])  # paused 0.25 s between
    assert len(retried) == 4 and info.value.args == (5,)


def test_retry_returns_what_the_call_returns_and_raises_other_errors_at_once() -> None:
    clock = SimClock()
    answers = iter([TimeoutError(), 7])

    def call(_: Deadline) -> int:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry(call, lambda e: isinstance(e, TimeoutError), 5.0, 0.1, clock=clock) == 7
    with pytest.raises(ValueError):
        retry(lambda _: int("x"), lambda e: isinstance(e, TimeoutError), 5.0, clock=clock)
    assert clock.monotonic() == pytest.approx(0.1)


def test_transient_kafka_errors() -> None:
    moving = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    assert transient(moving, MOVING)
    assert not transient(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert transient(KafkaException(KafkaError(KafkaError._TIMED_OUT, retriable=True)))
    assert not transient(ValueError("x")) and not transient(KafkaException())


def test_a_deadline_of_infinity_never_passes() -> None:
    clock = SimClock()
    d = Deadline(float("inf"), clock)
    clock.advance(1e9)
    assert not d.passed and d.left(cap=0.2) == 0.2
