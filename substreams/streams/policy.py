"""Seal policies: from the event times a publisher wrote, and its clock, to its seals.

Pure logic (event time and clock in, seals out), so the rule is tested on a simulated
clock; :class:`~substreams.streams.publisher.Publisher` applies what it returns, inside the
transaction of the records that moved it.

The rule (bounded out-of-orderness at the source, plus idleness): the publisher keeps a
*watermark* ``W`` -- every later record it writes has event time ``>= W``.

- Publishing event time ``h`` raises ``W`` to ``h - lateness_ms``.
- After ``idle_ms`` of processing time without a record (and again every ``idle_ms`` while
  it stays idle), ``W`` rises to ``now - lateness_ms``.  A firm promise: a record that then
  arrives below ``W`` is late, and the policy's ``late`` rule decides its fate.
- ``W`` never falls.  What it seals, per kind: ``tumbling`` every window that ends at or
  before ``W`` (``(w + 1) * size_ms <= W``, i.e. once the event time passed the window's
  end plus the lateness); ``epoch`` every epoch below ``W`` (in the epoch field's own
  units); ``session`` every key up to ``W - 1`` (the keyed seal, as ``watermark(W)``).
- A time seal below the first time the publisher wrote is not sent: a seal of a time
  without records opens it (the acker announces it, empty), and the times before a source's
  first record are no business of its own.  Idleness before any record does seal: a source
  with nothing to say must not hold the others' windows back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from substreams.config import SealPolicy, SubstreamConfig

SealKind = Literal["time", "keys"]


@dataclass(frozen=True)
class PolicySeal:
    """A seal the policy asks for: ``seal(substream, upto)`` (``time``) or
    ``seal_keys(substream, upto)`` (``keys``)."""

    kind: SealKind
    upto: int


class SealClock:
    """The policy of one substream for one publisher: its watermark and what it sealed."""

    def __init__(self, substream: SubstreamConfig, policy: SealPolicy, now_ms: int) -> None:
        if substream.kind == "per_key":
            raise ValueError(f"substream '{substream.name}': per_key times have no event time")
        self.substream = substream
        self.policy = policy
        self.watermark: int | None = None
        """Every later record has event time >= this (None: no promise yet)."""
        self.sealed: int | None = None
        """The last ``upto`` asked for."""
        self._quiet_since = now_ms
        """Processing time of the last record, or of the last idle seal."""
        self._first: int | None = None
        """The time of the first record published (time seals below it are not sent)."""

    def published(self, high_event_ms: int, now_ms: int) -> PolicySeal | None:
        """Records up to event time ``high_event_ms`` were just written: the seal that
        follows, if it moved."""
        self._quiet_since = now_ms
        if self._first is None:
            self._first = self.upto(high_event_ms) + 1
        return self._raise_to(high_event_ms - self.policy.lateness_ms)

    def idle(self, now_ms: int) -> PolicySeal | None:
        """The clock reads ``now_ms``: after ``idle_ms`` without a record, the seal of the
        clock minus the lateness, if it moved."""
        idle_ms = self.policy.idle_ms
        if idle_ms is None or now_ms - self._quiet_since < idle_ms:
            return None
        self._quiet_since = now_ms
        return self._raise_to(now_ms - self.policy.lateness_ms)

    def _raise_to(self, watermark: int) -> PolicySeal | None:
        if self.watermark is not None and watermark <= self.watermark:
            return None
        self.watermark = watermark
        upto = self.upto(watermark)
        if self.sealed is not None and upto <= self.sealed:
            return None
        if self.substream.kind != "session" and self._first is not None and upto < self._first:
            return None
        self.sealed = upto
        return PolicySeal("keys" if self.substream.kind == "session" else "time", upto)

    def state(self) -> tuple[int | None, int | None, int | None]:
        """What a restarted source must continue from: (watermark, sealed, first time)."""
        return self.watermark, self.sealed, self._first

    def restore(self, state: tuple[int | None, int | None, int | None], now_ms: int) -> None:
        """Continue a previous incarnation's promises (:meth:`state`): a new process of the
        same source must never seal below, nor accept a record at, what it sealed."""
        self.watermark, self.sealed, self._first = state
        self._quiet_since = now_ms

    def upto(self, watermark: int) -> int:
        """The highest time sealed by a watermark (see the module docstring)."""
        kind = self.substream.kind
        if kind in ("tumbling", "hopping"):  # a hopping substream's times are its panes
            size = self.substream.pane_ms
            assert size is not None
            return watermark // size - 1
        return watermark - 1


__all__ = ["PolicySeal", "SealClock", "SealKind"]
