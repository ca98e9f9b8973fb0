"""The publisher's ticker: one thread runs every periodic job, a failing job keeps its
schedule, a cancelled job stops, and nothing runs after close."""

from __future__ import annotations

import threading
import time

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


def test_cancel_and_close_stop_jobs() -> None:
    ticker = Ticker("t")
    runs: list[str] = []
    cancel = ticker.every(0.005, lambda: runs.append("a"))
    ticker.every(0.005, lambda: runs.append("b"))
    time.sleep(0.05)
    cancel()
    time.sleep(0.02)
    seen = len(runs)
    time.sleep(0.05)
    assert "a" not in runs[seen:] and "b" in runs[seen:]
    ticker.close()
    after = len(runs)
    time.sleep(0.05)
    assert len(runs) == after
    assert ticker.every(0.005, lambda: runs.append("c")) is not None  # refused quietly
    time.sleep(0.03)
    assert "c" not in runs


def test_no_thread_without_a_job() -> None:
    before = threading.active_count()
    ticker = Ticker("idle")
    assert threading.active_count() == before
    ticker.close()
