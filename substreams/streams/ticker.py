"""One timer thread per publisher for everything that must happen while its caller is quiet.

Why one: an idle source must still say "alive" to the acker (the acker hook's heartbeat)
and, with a seal policy, still seal as its clock moves and commit seals its caller left
pending; each used to want a thread of its own.  Jobs run one after another on the
ticker's thread; a job that raises is logged and keeps its schedule (the job itself
decides what a failure means to its owner).

Time is the ticker's :class:`~substreams.kafka.clock.Clock` (the system's by default).  On a
:class:`~substreams.kafka.clock.SimClock` it starts no thread: whoever moves the clock calls
:meth:`Ticker.run_due`, the same step the thread takes, so the schedule is tested without
waiting for real time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from substreams.kafka.clock import SYSTEM, Clock, SimClock

log = logging.getLogger(__name__)


@dataclass
class _Job:
    every: float
    run: Callable[[], None]
    due: float


class Ticker:
    """Runs each registered job every ``every`` seconds, on one daemon thread started by the
    first job (a publisher with nothing to do while idle starts none; a ticker on a
    :class:`SimClock` none at all: :meth:`run_due` is called as the clock moves)."""

    def __init__(self, name: str, clock: Clock = SYSTEM) -> None:
        self.name = name
        self.clock = clock
        self._threaded = not isinstance(clock, SimClock)
        self._jobs: list[_Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def every(self, seconds: float, job: Callable[[], None]) -> Callable[[], None]:
        """Run ``job`` every ``seconds`` from now on; returns its cancel function."""
        entry = _Job(seconds, job, self.clock.monotonic() + seconds)
        with self._lock:
            if self._stopped:
                return lambda: None
            self._jobs.append(entry)
            if self._thread is None and self._threaded:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._wake.set()

        def cancel() -> None:
            with self._lock:
                if entry in self._jobs:
                    self._jobs.remove(entry)

        return cancel

    def run_due(self) -> float:
        """Run the jobs due now on the ticker's clock, one after another, each due again
        ``every`` after it ran; the seconds until the next one is due (1.0 with none)."""
        clock = self.clock
        with self._lock:
            if self._stopped:
                return 1.0
            now = clock.monotonic()
            due = [j for j in self._jobs if j.due <= now]
        for job in due:
            job.due = clock.monotonic() + job.every
            try:
                job.run()
            except Exception:
                log.exception("%s: a periodic job failed", self.name)
        with self._lock:
            now = clock.monotonic()
            nearest = min((j.due for j in self._jobs), default=now + 1.0)
        return max(0.0, nearest - now)

    def _run(self) -> None:
        while not self._stopped:
            wait = self.run_due()
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def close(self, timeout: float = 2.0) -> None:
        """Stop: no job runs after this returns (unless one outlives ``timeout``)."""
        with self._lock:
            self._stopped = True
            thread, self._thread = self._thread, None
            self._jobs.clear()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


__all__ = ["Ticker"]
