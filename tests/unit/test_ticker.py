"""The publisher's ticker: one thread runs every periodic job, a failing job keeps its
schedule, a cancelled job stops, and nothing runs after close -- the schedule on a
simulated clock (no waiting for real time), the thread on the real one."""

from __future__ import annotations

import threading

from substreams.kafka.clock import SimClock
from substreams.streams.ticker import Ticker


def wait_for(condition: threading.Event, timeout: float = 2.0) -> bool:
    return condition.wait(timeout)


def test_jobs_share_one_thread_and_a_failing_job_keeps_running() -> None:
    ticker = Ticker("t")
    threads: set[str] = set()
    fast, failing = threading.Event(), threading.Event()
    runs = {"fast": 0, "failing": 0}

    def count() -> None:
        threads.add(threading.current_thread().name)
        runs["fast"] += 1
        if runs["fast"] >= 5:
            fast.set()

    def fail() -> None:
        threads.add(threading.current_thread().name)
        runs["failing"] += 1
        if runs["failing"] >= 3:
            failing.set()
        raise RuntimeError("boom")

    try:
        ticker.every(0.005, count)
        ticker.every(0.01, fail)
        assert wait_for(fast) and wait_for(failing)
        assert threads == {"t"}
    finally:
        ticker.close()


def test_jobs_run_on_their_schedule_on_a_simulated_clock() -> None:
    """Each job every ``every`` seconds of the ticker's clock, from when it was added; a
    failing one keeps its schedule; no thread: the caller steps it as the clock moves."""
    clock = SimClock()
    ticker = Ticker("t", clock)
    runs: list[tuple[str, float]] = []
    t0 = clock.monotonic()

    def fail() -> None:
        runs.append(("fail", clock.monotonic() - t0))
        raise RuntimeError("boom")

    before = threading.active_count()
    ticker.every(1.0, lambda: runs.append(("a", clock.monotonic() - t0)))
    ticker.every(2.5, fail)
    assert threading.active_count() == before  # no thread on a simulated clock
    waits = []
    for _ in range(50):  # 5 s in steps of 0.1 s
        clock.advance(0.1)
        waits.append(ticker.run_due())
    assert [round(t, 6) for n, t in runs if n == "a"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [round(t, 6) for n, t in runs if n == "fail"] == [2.5, 5.0]
    assert round(waits[0], 6) == 0.9  # until a's first run
    ticker.close()


def test_cancel_and_close_stop_jobs() -> None:
    clock = SimClock()
    ticker = Ticker("t", clock)
    runs: list[str] = []
    cancel = ticker.every(0.005, lambda: runs.append("a"))
    ticker.every(0.005, lambda: runs.append("b"))
    clock.advance(0.005)
    ticker.run_due()
    assert runs == ["a", "b"]
    cancel()
    clock.advance(0.005)
    ticker.run_due()
    assert runs == ["a", "b", "b"]  # a cancelled job is not run again
    ticker.close()
    clock.advance(0.005)
    ticker.run_due()
    assert runs == ["a", "b", "b"]  # nothing runs after close
    assert ticker.every(0.005, lambda: runs.append("c")) is not None  # refused quietly
    clock.advance(0.01)
    ticker.run_due()
    assert runs == ["a", "b", "b"]


def test_no_thread_without_a_job() -> None:
    before = threading.active_count()
    ticker = Ticker("idle")
    assert threading.active_count() == before
    ticker.close()
