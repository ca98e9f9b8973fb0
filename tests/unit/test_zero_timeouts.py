"""A zero (or passed) timeout still looks once: the acker client's waits read the answers
that already arrived, a stage's ``run_until_idle(0)`` processes what is there."""

from __future__ import annotations

import pytest

from substreams.acker.client import AckerClient, AckerUnavailableError
from substreams.acker.commands import Rejected, Response
from substreams.acker.stage import Stage


def session(arrived: list[list[Response]]) -> tuple[AckerClient, list[float]]:
    """A client of one acker ``a`` (no broker) whose polls return ``arrived`` in turn, and
    the timeouts they were called with."""
    polls: list[float] = []
    ack = AckerClient.__new__(AckerClient)
    ack.ackers, ack._any_name, ack.inbox, ack.timeout = ("a",), False, [], 5.0
    ack.command_topic, ack.acker = "commands", None

    def poll(timeout: float = 0.1) -> list[Response]:
        polls.append(timeout)
        return arrived.pop(0) if arrived else []

    ack.poll = poll
    return ack, polls


def answer(seq: int) -> Response:
    return Response("a", "ctl", "nonce", seq, Rejected("any body"))


def test_wait_with_a_zero_timeout_reads_an_answer_that_arrived() -> None:
    ack, polls = session([[answer(3)]])
    assert ack.wait(3, timeout=0).seq == 3
    assert polls == [0.0] and ack.acker == "a"


def test_wait_all_with_a_zero_timeout_reads_the_answers_that_arrived() -> None:
    ack, polls = session([[answer(3)]])
    got = ack.wait_all(3, timeout=0)
    assert got.responses["a"].seq == 3 and got.missing == ()
    assert polls == [0.0]


def test_a_zero_timeout_with_nothing_arrived_polls_once_then_gives_up() -> None:
    ack, polls = session([])
    with pytest.raises(AckerUnavailableError):
        ack.wait(3, timeout=0)
    with pytest.raises(AckerUnavailableError):
        ack.wait_all(3, timeout=0)
    assert polls == [0.0, 0.0]


def test_run_until_idle_zero_processes_what_is_there() -> None:
    stage = Stage.__new__(Stage)  # no broker: step is stubbed
    stage.processed = 0
    batches = [4]

    def step(timeout: float = 0.1) -> int:
        n = batches.pop(0) if batches else 0
        stage.processed += n
        return n

    stage.step = step
    assert stage.run_until_idle(seconds=0) == 4
    assert stage.run_until_idle(seconds=1.0, timeout=0) == 0  # a passed deadline: one step
    assert batches == []
