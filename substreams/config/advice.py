"""Warnings about a valid configuration (``substreams config check``): choices that work but
surprise, with what to do about them.  Pure functions of the model, no I/O.

Late-for-one: late is per substream (``Publisher.publish``), so two seal policies on one
stream that tolerate different delays put some records in one substream and not the other.
With a seal policy of lateness ``L`` (``substreams/streams/policy.py``), a record arriving
``d`` ms of event time behind the highest its publisher wrote is

* late for a session substream when ``d > L`` (its keyed seal follows the event time);
* on time for a tumbling/hopping substream at least while ``d <= L`` and at most while
  ``d <= L + pane - 1`` (its window seals at its end: how far depends on where in the
  window the record falls), late for it from ``d >= L + 1`` (a record at a window's end).

So a record can be late for A and on time for B roughly when ``L_A < L_B + pane_B`` --
e.g. per-user sessions with a lateness below a window's size on the same stream (issue 43's
orders: 52 of 87 late orders were on time for their 10 s revenue window); exactly as
:func:`can_be_late_for_one` says (two windows whose panes align need more).
"""

from __future__ import annotations

import math

from substreams.config.model import Config, SubstreamConfig

_EVENT_KINDS = frozenset({"tumbling", "hopping", "session"})


def _pane(sub: SubstreamConfig) -> int:
    """The width the seal moves in: a window substream's pane, 1 ms for sessions."""
    return 1 if sub.kind == "session" else (sub.pane_ms or 1)


def can_be_late_for_one(a: SubstreamConfig, b: SubstreamConfig) -> bool:
    """Whether some record can be late for ``a`` and on time for ``b`` (both with seal
    policies, on one event-time field).

    Why this formula: with ``r(e) = p - e mod p`` (how far the record is from its pane's
    end; 1 for sessions), a record ``d`` behind is late for ``a`` iff ``d >= r_a(e) + L_a``
    and on time for ``b`` iff ``d < r_b(e) + L_b``: some ``d`` fits iff ``r_a(e) - r_b(e) <
    L_b - L_a`` for some ``e``, and the least ``r_a - r_b`` over every ``e`` is
    ``gcd(p_a, p_b) - p_b`` (``e mod p_a`` and ``e mod p_b`` agree modulo the gcd)."""
    assert a.seal is not None and b.seal is not None
    pa, pb = _pane(a), _pane(b)
    return a.seal.lateness_ms + math.gcd(pa, pb) < b.seal.lateness_ms + pb


def _shape(sub: SubstreamConfig) -> str:
    assert sub.seal is not None
    width = f"gap {sub.gap_ms} ms" if sub.kind == "session" else f"{sub.pane_ms} ms panes"
    if sub.kind == "tumbling":
        width = f"{sub.size_ms} ms windows"
    return f"{sub.kind}, {width}, lateness_ms {sub.seal.lateness_ms}, late: {sub.seal.late}"


def late_for_one(config: Config) -> list[str]:
    """One warning per ordered pair (A, B) of substreams of one stream whose seal policies
    let a record be late for A and on time for B, saying what A's ``late`` rule then does."""
    out: list[str] = []
    for stream in config.streams:
        subs = [s for s in config.substreams_of(stream.name)
                if s.seal is not None and s.kind in _EVENT_KINDS]
        for a in subs:
            for b in subs:
                if a is b or (a.field or stream.order_key) != (b.field or stream.order_key):
                    continue
                if not can_be_late_for_one(a, b):
                    continue
                assert a.seal is not None and b.seal is not None
                low, high = a.seal.lateness_ms + 1, b.seal.lateness_ms + _pane(b) - 1
                if a.seal.late == "raise":
                    fate = (f"'{a.name}' has late: raise, so such a record is refused whole and "
                            f"'{b.name}' loses it too (late: dead_letter would keep it out of "
                            f"'{a.name}' only)")
                else:
                    fate = (f"such a record is kept out of '{a.name}' only and dead-lettered "
                            f"naming it (late is per substream)")
                out.append(
                    f"stream '{stream.name}': a record {low}..{high} ms of event time behind "
                    f"the latest can be late for substream '{a.name}' ({_shape(a)}) and on "
                    f"time for '{b.name}' ({_shape(b)}); {fate}.  If both should see the "
                    f"same records, give '{a.name}' a lateness_ms of at least {high}"
                )
    return out


__all__ = ["late_for_one"]
