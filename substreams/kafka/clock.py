"""Time as a value passed in: the :class:`Clock` interface, the system's clock and a
simulated one.

Why an interface: every rule about silence, timeouts and transactions is a rule about time.
Read from ``time.monotonic()`` directly, it can only be tested in real seconds; read from a
:class:`Clock`, the same code runs on a :class:`SimClock` that moves only when told, so a test
or a simulator goes through an hour of timeouts in microseconds and repeats it exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

__all__ = [
    "SYSTEM", "Clock", "Deadline", "SimClock", "SystemClock", "retry", "until_idle", "wait_until",
]

T = TypeVar("T")


class Clock(Protocol):
    """Where a component reads the time and waits."""

    def now_ms(self) -> int:
        """Wall-clock time, ms since the epoch: timestamps written into records."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: durations, deadlines, timeouts."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (a :class:`SimClock` moves by that much at once)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class SimClock:
    """A clock that moves only when told (:meth:`advance`, or :meth:`sleep`, which is an
    advance by the sleeper): deterministic, and never waits for real.

    Kept in integer nanoseconds, so that many small steps add up exactly (a float sum of
    0.1 s steps drifts)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._start_ms = start_ms
        self._ns = 0

    def now_ms(self) -> int:
        return self._start_ms + self._ns // 1_000_000

    def monotonic(self) -> float:
        return self._ns / 1e9

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` (never back)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self._ns += round(seconds * 1e9)

    def advance_ms(self, ms: int) -> None:
        self.advance(ms / 1000.0)


SYSTEM: SystemClock = SystemClock()
"""The machine's clock, for code that is not handed one."""


class Deadline:
    """The moment ``seconds`` from now on ``clock``: what every wait and retry loop counts
    down to.  One class instead of ``time.monotonic() + t`` arithmetic in each loop, so that
    the loops read alike and run on a :class:`SimClock` too."""

    def __init__(self, seconds: float, clock: Clock = SYSTEM) -> None:
        self.seconds = seconds
        self.clock = clock
        self.at = clock.monotonic() + seconds

    def restart(self) -> None:
        """``seconds`` from now again: a wait for progress starts over on each progress."""
        self.at = self.clock.monotonic() + self.seconds

    def shorten(self, seconds: float) -> None:
        """Bring the moment forward to ``seconds`` from now, if that is sooner."""
        self.at = min(self.at, self.clock.monotonic() + seconds)

    def left(self, floor: float = 0.0, cap: float = math.inf) -> float:
        """Seconds to go, kept within [``floor``, ``cap``]: the timeout of one call inside
        the wait (at least ``floor``, so that a last call still gets time to answer)."""
        return max(floor, min(cap, self.at - self.clock.monotonic()))

    @property
    def passed(self) -> bool:
        return self.clock.monotonic() >= self.at


def wait_until(
    clock: Clock, done: Callable[[], bool], timeout: float, step: float = 0.05
) -> bool:
    """Check ``done`` every ``step`` seconds of ``clock`` until it holds (True) or
    ``timeout`` passed (False).  On a :class:`SimClock` each step moves simulated time, so
    the same wait works against a real broker and the in-memory log."""
    deadline = Deadline(timeout, clock)
    while True:
        if done():
            return True
        if deadline.passed:
            return False
        clock.sleep(step)


def until_idle(
    poll: Callable[[], Sequence[T]],
    idle_timeout: float | None,
    ready: Callable[[], bool] = lambda: True,
) -> Iterator[T]:
    """What ``poll()`` returns, item by item, until it returned nothing for ``idle_timeout``
    seconds (None: never) while ``ready()`` (a reader that is not caught up is not idle)."""
    idle = Deadline(math.inf if idle_timeout is None else idle_timeout)
    while True:
        batch = poll()
        if batch:
            idle.restart()
            yield from batch
        elif not ready():
            idle.restart()
        elif idle.passed:
            return


def retry(
    call: Callable[[Deadline], T],
    transient: Callable[[Exception], bool],
    timeout: float,
    pause: float = 0.0,
    on_retry: Callable[[Exception], object] = lambda exc: None,
    clock: Clock = SYSTEM,
) -> T:
    """``call(deadline)`` until it returns.  An error ``transient`` says will pass is retried
    (``on_retry`` told, then ``pause`` seconds) until ``timeout`` passed, then raised; any
    other error is raised at once.  ``call`` gets the deadline to size its own timeout.

    Why not tenacity: these loops size each call's timeout from the time left and raise
    their own error at the end, which tenacity's ``Retrying`` makes longer to write, and
    tenacity reads ``time.monotonic`` itself, so it cannot run on a :class:`SimClock`."""
    deadline = Deadline(timeout, clock)
    while True:
        try:
            return call(deadline)
        except Exception as exc:
            if not transient(exc) or deadline.passed:
                raise
            on_retry(exc)
            if pause:
                clock.sleep(pause)


if TYPE_CHECKING:  # mypy proves that the classes implement the Protocol

    def _implements(system: SystemClock, sim: SimClock) -> tuple[Clock, Clock]:
        return system, sim
