"""Hopping windows from pane notifications (substreams.control.panes): each window once, in
order, with exactly its notified panes, checked against the definition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.control.panes import PaneWindows, lookback_enough, windows_completed
from substreams.errors import SubstreamsError


def brute_force(notified: list[int], panes: int) -> list[tuple[int, int, list[int]]]:
    """``(step, window, notified panes)`` straight from the definition: a window completes
    at the first notification at or after its last pane, if it holds a pane notified by
    then."""
    out: list[tuple[int, int, list[int]]] = []
    for w in range(notified[0] - panes + 1, notified[-1] - panes + 2):
        end = w + panes - 1
        step = next(i for i, p in enumerate(notified) if p >= end)
        held = [p for p in notified[: step + 1] if w <= p <= end]
        if held:
            out.append((step, w, held))
    return out


def run(notified: list[int], panes: int) -> list[tuple[int, int, list[int]]]:
    acc: PaneWindows[int] = PaneWindows(panes)
    return [(i, w, items) for i, p in enumerate(notified) for w, items in acc.add(p, p)]


def test_contiguous_panes_complete_one_window_each() -> None:
    assert run([0, 1, 2, 3], 3) == [
        (0, -2, [0]), (1, -1, [0, 1]), (2, 0, [0, 1, 2]), (3, 1, [1, 2, 3])
    ]


def test_a_gap_completes_the_windows_that_held_the_last_pane() -> None:
    # pane 0, then nothing until pane 10: windows -1 and 0 still held pane 0, and 8 ends at 10
    assert run([0, 10], 3) == [(0, -2, [0]), (1, -1, [0]), (1, 0, [0]), (1, 8, [10])]


def test_one_pane_windows_are_the_panes() -> None:
    assert run([3, 4, 9], 1) == [(0, 3, [3]), (1, 4, [4]), (2, 9, [9])]


def test_panes_out_of_order_are_refused() -> None:
    acc: PaneWindows[int] = PaneWindows(2)
    acc.add(5, 5)
    with pytest.raises(SubstreamsError, match="pane 5 notified after pane 5"):
        acc.add(5, 5)
    with pytest.raises(ValueError, match="in order"):
        windows_completed(5, 4, 2)


panes_st = st.integers(min_value=1, max_value=6)
times_st = st.lists(st.integers(min_value=-20, max_value=40), min_size=1, max_size=25, unique=True)


@given(times_st, panes_st)
def test_matches_the_definition(times: list[int], panes: int) -> None:
    notified = sorted(times)
    got = run(notified, panes)
    assert got == brute_force(notified, panes)
    windows = [w for _, w, _ in got]
    assert windows == sorted(set(windows))  # each once, in order
    # every window that ended by the last notification and holds a pane is there
    expected = {w for p in notified for w in range(p - panes + 1, p + 1)
                if w + panes - 1 <= notified[-1]}
    assert set(windows) == expected


@given(times_st, panes_st, st.data())
def test_resuming_after_a_sufficient_lookback_gives_the_same_windows(
    times: list[int], panes: int, data: st.DataObject
) -> None:
    """A reader resuming at step ``cut`` re-reads panes from ``lo`` on (discarding their
    windows): once :func:`lookback_enough` holds, it completes the same windows after the
    cut as a reader that never stopped."""
    notified = sorted(times)
    cut = data.draw(st.integers(min_value=0, max_value=len(notified) - 1))
    whole = [(i, w, items) for i, w, items in run(notified, panes) if i >= cut]
    lo = cut
    while True:
        before = notified[lo:cut]
        if lookback_enough(before[0] if before else None, before[-1] if before else None,
                           panes, at_start=lo == 0):
            break
        lo -= 1
    acc: PaneWindows[int] = PaneWindows(panes)
    for p in notified[lo:cut]:
        acc.add(p, p)
    resumed = [(i, w, items) for i in range(cut, len(notified))
               for w, items in acc.add(notified[i], notified[i])]
    assert resumed == whole


def test_a_hopping_records_time_and_its_policy_seals_are_panes() -> None:
    from substreams.config import SealPolicy, SubstreamConfig
    from substreams.streams.policy import SealClock
    from substreams.streams.times import TimeAssigner

    sub = SubstreamConfig("h", "s", "hopping", field="ts", size_ms=3000, slide_ms=1000)
    assigner = TimeAssigner(sub, "ts")
    assert assigner.time_of({"ts": 2500}) == 2
    assert assigner.times_of([{"ts": 999}, {"ts": 1000}]) == [0, 1]
    clock = SealClock(sub, SealPolicy(lateness_ms=0), now_ms=0)
    clock.published(0, now_ms=0)
    seal = clock.published(3000, now_ms=1)  # event time 3000: panes 0..2 are over
    assert seal is not None and (seal.kind, seal.upto) == ("time", 2)
