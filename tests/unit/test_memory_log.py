"""The in-memory log's rules that a real broker cannot show on demand (the moment markers
are written, the exact timeout, determinism); the rules Kafka can show are held to Kafka by
tests/integration/test_log_contract.py."""

from __future__ import annotations

import time

import pytest

from substreams.errors import BrokerError
from substreams.kafka.clock import SimClock, wait_until
from substreams.kafka.log import Committed, FencedError, Record
from substreams.kafka.memory import MemoryLog


def make(delay: int = 0, partitions: int = 1) -> tuple[MemoryLog, SimClock]:
    clock = SimClock()
    log = MemoryLog(clock, marker_delay_ms=delay)
    log.create_topics({"t": partitions})
    return log, clock


def test_the_sim_clock_moves_only_when_told_and_exactly() -> None:
    clock = SimClock(start_ms=1000)
    assert (clock.now_ms(), clock.monotonic()) == (1000, 0.0)
    for _ in range(10):
        clock.sleep(0.1)
    assert (clock.now_ms(), clock.monotonic()) == (2000, 1.0)
    with pytest.raises(ValueError):
        clock.advance(-1)
    ticks: list[float] = []
    assert not wait_until(clock, lambda: ticks.append(clock.monotonic()) is not None, 0.2, 0.1)
    assert ticks == [1.0, 1.1, 1.2]


def test_markers_written_late_hold_the_lso_after_commit_returned() -> None:
    log, clock = make(delay=50)
    w = log.transactional_writer("w")
    w.begin()
    w.produce("t", 0, b"a")
    w.commit()
    assert log.end_offsets("t", [0], committed=True) == {0: 0}  # decided, not yet marked
    assert log.end_offsets("t", [0], committed=False) == {0: 1}
    clock.advance_ms(49)
    assert log.end_offsets("t", [0], committed=True) == {0: 0}
    clock.advance_ms(1)
    assert log.end_offsets("t", [0], committed=True) == {0: 2}


def test_the_next_transaction_and_a_fence_wait_out_pending_markers() -> None:
    log, _ = make(delay=50)
    w = log.transactional_writer("w")
    w.begin()
    w.produce("t", 0, b"a")
    w.commit()
    w.begin()
    w.produce("t", 0, b"b")
    [b] = w.flush()
    assert b.offset == 2  # the first transaction's marker went in first, at 1
    w.commit()
    log.fence("w")  # a fence of a decided commit completes it: nothing is aborted
    assert log.end_offsets("t", [0], committed=True) == {0: 4}
    reader = log.reader()
    reader.assign({("t", 0): 0})
    assert [r.value for r in reader.poll()] == [b"a", b"b"]


def test_the_coordinator_aborts_exactly_at_the_timeout_counted_from_the_first_add() -> None:
    log, clock = make()
    w = log.transactional_writer("w", timeout_ms=1000)
    w.begin()
    clock.advance(5)  # begin is local: the timer has not started
    w.produce("t", 0, b"a")
    clock.advance_ms(999)
    assert log.end_offsets("t", [0], committed=True) == {0: 0}
    clock.advance_ms(1)
    assert log.end_offsets("t", [0], committed=True) == {0: 2}
    with pytest.raises(FencedError):
        w.commit()
    with pytest.raises(FencedError):
        w.begin()  # the fatal state sticks


def test_group_offsets_of_an_unfinished_transaction_are_refused_at_once() -> None:
    log, _ = make(delay=10)
    w = log.transactional_writer("w")
    w.begin()
    w.send_offsets("g", {("t", 0): Committed(3)})
    with pytest.raises(BrokerError, match="UNSTABLE_OFFSET_COMMIT"):
        log.committed_offsets("g", [("t", 0)])
    assert log.committed_offsets("other", [("t", 0)]) == {}
    w.commit()
    with pytest.raises(BrokerError):  # decided, its markers not written yet
        log.committed_offsets("g", [("t", 0)])
    log.fence("w")
    assert log.committed_offsets("g", [("t", 0)]) == {("t", 0): Committed(3)}


def test_partitions_are_polled_round_robin() -> None:
    log, _ = make(partitions=2)
    w = log.writer()
    for i in range(2):
        w.produce("t", 0, b"p0-%d" % i)
        w.produce("t", 1, b"p1-%d" % i)
    reader = log.reader()
    reader.assign({("t", 0): 0, ("t", 1): 0})
    got = [r.value for _ in range(4) for r in reader.poll(max_records=1)]
    assert got == [b"p0-0", b"p1-0", b"p0-1", b"p1-1"]


def test_unknown_topics_and_fewer_partitions_are_refused() -> None:
    log, _ = make()
    with pytest.raises(BrokerError):
        log.writer().produce("nope", 0, b"x")
    with pytest.raises(BrokerError):
        log.writer().produce("t", 1, b"x")
    with pytest.raises(BrokerError):
        log.create_topics({"t": 2})
    log.create_topics({"t": 1})  # as it is: kept


def _scenario() -> tuple[list[Record], dict[int, int], dict[int, int]]:
    log, clock = make(delay=7, partitions=2)
    a = log.transactional_writer("a", timeout_ms=500)
    b = log.transactional_writer("b")
    h = log.writer()
    for i in range(20):
        a.begin()
        a.produce("t", i % 2, b"a%d" % i)
        if i % 3:
            a.commit()
        else:
            a.abort()
        b.begin()
        b.produce("t", (i + 1) % 2, b"b%d" % i, headers=[("i", b"%d" % i)])
        h.produce("t", i % 2, b"h%d" % i)
        clock.advance_ms(3)
        b.commit()
    a.begin()
    a.produce("t", 0, b"never")
    clock.advance(1)
    reader = log.reader()
    reader.assign({("t", 0): 0, ("t", 1): 0})
    got = reader.poll(max_records=1000)
    return (got, log.end_offsets("t", [0, 1], committed=True),
            log.end_offsets("t", [0, 1], committed=False))


def test_the_same_script_gives_the_same_log_without_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_wall_clock() -> float:
        raise AssertionError("the in-memory log read the wall clock")

    monkeypatch.setattr(time, "time", no_wall_clock)
    monkeypatch.setattr(time, "monotonic", no_wall_clock)
    monkeypatch.setattr(time, "time_ns", no_wall_clock)
    first, second = _scenario(), _scenario()
    assert first == second
    records, stable, high = first
    assert stable == high  # "never" was aborted by its timeout
    assert b"never" not in {r.value for r in records}
    assert {r.value for r in records} >= {b"a1", b"b0", b"h19"}
    assert b"a0" not in {r.value for r in records}  # aborted
