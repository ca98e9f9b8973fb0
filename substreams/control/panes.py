"""Hopping windows as unions of panes: which windows a pane's notification completes.

A hopping substream (``size_ms``, ``slide_ms``) is tracked as the tumbling substream of
its *panes*, windows of ``slide_ms``: a record's time is its pane, ``event_ms //
slide_ms``, and the acker notifies panes as it notifies any tumbling window -- in order,
each once.  Window ``w`` spans the ``k = size_ms // slide_ms`` panes ``w .. w + k - 1``
(event times ``[w * slide_ms, w * slide_ms + size_ms)``), so its id is its first pane and
it is complete once its last pane is.

Why here, as a pure rule over the sequence of pane notifications, and not in the acker:
the acker then needs no notion of windows (a record has one time, not ``k``), and every
firm reader derives the same windows from the same control topic -- a reader that resumes
mid-topic only has to re-read the few panes before its position (:func:`lookback_enough`).

Rule: a pane notification ``p`` (after the previous one, ``prev``) completes every window
that ends at or before ``p``, was not completed before, and holds a notified pane::

    {w : prev - k + 1 < w <= min(prev, p - k + 1)}  U  {p - k + 1}

(the first set: windows still holding ``prev``; the last: the window ending at ``p``).
Panes the acker never announced (no record, no seal opened them) are empty; a window
of empty panes only is not a window anyone saw, and is not announced (as a tumbling
window nobody opened is not).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from substreams.errors import SubstreamsError

N = TypeVar("N")


def windows_completed(prev: int | None, pane: int, panes: int) -> list[int]:
    """The windows (ids, ascending) that the notification of ``pane`` completes, when the
    previous notified pane was ``prev`` (None: none), for windows of ``panes`` panes."""
    if panes < 1:
        raise ValueError(f"a window spans at least one pane, not {panes}")
    if prev is not None and pane <= prev:
        raise ValueError(f"panes are notified in order: {pane} after {prev}")
    last = pane - panes + 1
    if prev is None:
        return [last]
    held = list(range(prev - panes + 2, min(prev, last) + 1))
    return held if held and held[-1] == last else [*held, last]


class PaneWindows(Generic[N]):
    """Turns pane notifications (each with a payload ``N``) into window notifications,
    keeping only the panes a later window can still hold (at most ``panes - 1``)."""

    def __init__(self, panes: int) -> None:
        if panes < 1:
            raise ValueError(f"a window spans at least one pane, not {panes}")
        self.panes = panes
        self.last: int | None = None
        self.recent: deque[tuple[int, N]] = deque()

    def add(self, pane: int, item: N) -> list[tuple[int, list[N]]]:
        """``pane`` was notified with ``item``: the windows it completes, in order, each
        with the payloads of its notified panes (ascending)."""
        if self.last is not None and pane <= self.last:
            raise SubstreamsError(
                f"hopping substream: pane {pane} notified after pane {self.last} "
                "(panes are notified in order, each once)"
            )
        done = windows_completed(self.last, pane, self.panes)
        self.recent.append((pane, item))
        out = [
            (w, [it for p, it in self.recent if w <= p < w + self.panes]) for w in done
        ]
        self.last = pane
        keep = pane - self.panes + 2  # the lowest pane a later window can hold
        while self.recent and self.recent[0][0] < keep:
            self.recent.popleft()
        return out


def lookback_enough(earliest: int | None, last: int | None, panes: int, at_start: bool) -> bool:
    """Whether panes read from some position on (``earliest`` .. ``last``, None: none
    read) rebuild the state :class:`PaneWindows` had there: the read began at the topic's
    start, or it holds the last pane no later window can hold (``<= last - panes + 1``)."""
    if at_start:
        return True
    if earliest is None or last is None:
        return False
    return earliest <= last - panes + 1


__all__ = ["PaneWindows", "lookback_enough", "windows_completed"]
