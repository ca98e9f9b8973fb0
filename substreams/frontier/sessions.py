"""Sessions over keyed event times, and the keyed seal that closes them (pure logic).

Why sessions are not assigned by publishers: a session is a maximal run of one key's
records whose event times are at most ``gap`` apart.  When several sources write the same
key, no one source sees the whole run, so a session start one source computed is not the
session's start.  Records therefore carry their plain keyed event time ``Keyed(key, ts)``,
and whoever sees every source's reports (the acker; a lone direct publisher) cuts them
into sessions with :func:`session_runs` once they are final.

The keyed seal ("every key's times up to event time ``T``") is what makes them final: a
source that seals keys up to ``T`` promises no record at ``Keyed(k, t)`` with ``t <= T``
for *any* key ``k``, including keys it has never written.  Invariants (``gap >= 0``):

* A run ``[s, e]`` of key ``k`` is **closed** once every source covers ``Keyed(k, e + gap)``:
  a record at ``t <= e + gap`` would join or extend the run (``t`` within ``gap`` of some
  member) or fall before it, and none can come; a record at ``t > e + gap`` starts a new
  run.  So a closed run is a session, whatever any source writes later.
* Runs of one key are disjoint and ordered; a run closes only after every earlier run of
  its key closed (``e1 < s2``, and ``e1 + gap < s2 <= e2 + gap``), so sessions of one key
  are announced in start order.
* Runs of different keys are independent (keyed times of different keys are incomparable).
"""

from __future__ import annotations

from collections.abc import Iterable

from substreams.frontier.time import Keyed

__all__ = ["by_key", "closed_runs", "run_members", "session_runs"]


def by_key(times: Iterable[object]) -> dict[str, list[int]]:
    """The ``Keyed(key, event_ms)`` times among ``times``, as sorted distinct event times per
    key (other times are ignored): the one grouping both session cutters start from."""
    grouped: dict[str, set[int]] = {}
    for t in times:
        if type(t) is Keyed and type(t.time) is int:
            grouped.setdefault(t.key, set()).add(t.time)
    return {k: sorted(ts) for k, ts in grouped.items()}


def run_members(sorted_times: list[int], gap: int) -> list[list[int]]:
    """``sorted_times`` (sorted, distinct) cut into maximal runs whose neighbours are at most
    ``gap`` apart, in order: each run's member times (first = start, last = end)."""
    runs: list[list[int]] = []
    for t in sorted_times:
        if runs and t - runs[-1][-1] <= gap:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def session_runs(times: Iterable[int], gap: int) -> list[tuple[int, int]]:
    """The maximal runs ``(start, end)`` of ``times`` whose neighbours are at most ``gap``
    apart, in order.  ``times`` may repeat and come in any order."""
    return [(run[0], run[-1]) for run in run_members(sorted(set(times)), gap)]


def closed_runs(times: Iterable[int], gap: int, sealed_upto: int | None) -> list[list[int]]:
    """The leading runs of :func:`run_members` (as member lists) that the keyed seal
    ``sealed_upto`` closes (``end + gap <= sealed_upto``); ``None`` (nothing sealed) closes
    none."""
    if sealed_upto is None:
        return []
    out = []
    for run in run_members(sorted(set(times)), gap):
        if run[-1] + gap > sealed_upto:
            break
        out.append(run)
    return out
