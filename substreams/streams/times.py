"""From a record to its time in each substream (the substream predicates of the trAcker paper).

Why the publisher computes times (and writes them into the envelope) instead of every reader
recomputing them: readers, the acker and Spark then agree on every record's time by
construction, whatever configuration they were started with.

Mapping of the configured kinds onto logical times:
- ``epoch``: the int value of ``field``.
- ``tumbling``: ``field // size_ms`` (the window index; window start = index * size_ms).
- ``hopping``: ``field // slide_ms``, the record's *pane* (a tumbling window of
  ``slide_ms``).  A record lies in ``size_ms // slide_ms`` windows, but it has one time:
  windows are unions of panes, grouped by the firm readers (:mod:`substreams.control.panes`).
- ``session``: ``Keyed(str(key), event_ms)``, the record's own keyed event time.  Sessions
  (runs of one key's times at most ``gap_ms`` apart) are cut where every source's records
  meet -- the acker -- not here: with several sources writing one key, none of them sees a
  whole session (:mod:`substreams.frontier.sessions`).  So a publisher keeps no session
  state, and a restarted one has none to lose.
- ``per_key``: ``Keyed(str(key), 0)``: one substream per key, sealed explicitly.

Seals are promises, and this is where a publisher keeps them.  Rules (every kind, every
seal form; checked on the times a record is finally given, overrides included):

1. ``seal(s, t)`` promises no more records of ``s`` at times ``<= t`` in the partial order
   (:func:`~substreams.frontier.less_equal`): for ``epoch`` and ``tumbling`` every
   time/window up to ``t`` -- also one that never opened; for a tuple time its product-order
   down-set; for ``Keyed(k, t)`` key ``k``'s times up to ``t``.
2. A *keyed seal* (``seal_keys(s, T)``, and ``watermark(e)`` as ``seal_keys(s, e - 1)`` on
   session substreams) promises no more records at ``Keyed(k, t)``, ``t <= T``, for every key.
3. A record at a sealed time is refused with :class:`SealedTimeError` before anything is
   written (a batch is refused whole), as an order-key regression is.  Why refuse rather than
   let the acker drop its report: the time may already be announced, so the record would
   reach the data topic after its substream's notification and be in no substream -- a
   silent loss that a plain consumer of the topic would also see out of place.

The record is per publisher (per incarnation): a restarted source starts with none, and its
first seal re-establishes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from substreams.config import SubstreamConfig
from substreams.errors import SealedTimeError, SubstreamsError
from substreams.frontier import Keyed, Time, less_equal

_WINDOW_KINDS = frozenset({"tumbling", "hopping"})
"""Kinds whose time is a window index, ``field // pane_ms``."""


@dataclass
class TimeAssigner:
    """Computes a record's time in one substream, and refuses one its source has sealed.

    Invariants: ``sealed`` is the highest int time sealed (None: none); ``keys_sealed`` the
    highest keyed seal; ``sealed_keyed[k]`` and ``sealed_other`` hold the maximal sealed times
    of key ``k`` and of tuple times (antichains: no element ``<=`` another)."""

    substream: SubstreamConfig
    order_key: str | None
    keys_sealed: int | None = None
    """This source's keyed seal (session/per_key), if any."""
    sealed: int | None = None
    sealed_keyed: dict[str, list[int | tuple[int, ...]]] = field(default_factory=dict)
    sealed_other: list[tuple[int, ...]] = field(default_factory=list)

    def _field(self) -> str:
        field = self.substream.field or self.order_key
        if field is None:  # the loader names the field of a stream without an order key
            raise SubstreamsError(
                f"substream '{self.substream.name}' has no field and its stream no order key"
            )
        return field

    def time_of(self, payload: Mapping[str, Any]) -> Time:
        kind = self.substream.kind
        if kind == "epoch":
            t = int(payload[self._field()])
        elif kind in _WINDOW_KINDS:
            pane = self.substream.pane_ms
            assert pane is not None
            t = int(payload[self._field()]) // pane
        else:
            assert self.substream.key is not None
            keyed = Keyed(
                str(payload[self.substream.key]),
                0 if kind == "per_key" else int(payload[self._field()]),
            )
            self.check(keyed)
            return keyed
        if self.sealed is not None and t <= self.sealed:
            self._refuse(t)
        return t

    def raw_time_of(self, payload: Mapping[str, Any]) -> Time:
        """The record's time, whatever this source sealed (to name what a late one missed)."""
        kind = self.substream.kind
        if kind == "epoch":
            return int(payload[self._field()])
        if kind in _WINDOW_KINDS:
            pane = self.substream.pane_ms
            assert pane is not None
            return int(payload[self._field()]) // pane
        assert self.substream.key is not None
        return Keyed(
            str(payload[self.substream.key]),
            0 if kind == "per_key" else int(payload[self._field()]),
        )

    def sealed_below(self, t: Time) -> str | None:
        """Why ``t`` is at a time this source sealed (None: it is not)."""
        try:
            self.check(t)
        except SealedTimeError as exc:
            return str(exc)
        return None

    def times_of(self, payloads: Sequence[Mapping[str, Any]]) -> list[Time]:
        """``time_of`` of every payload, as one column (``Publisher.publish_many``): the kind
        is dispatched once, not per record; a record at a sealed time raises
        :class:`SealedTimeError` before any time is returned."""
        kind = self.substream.kind
        name = self._field()
        col: list[int]
        if kind == "epoch":
            col = [int(p[name]) for p in payloads]
        elif kind in _WINDOW_KINDS:
            size = self.substream.pane_ms
            assert size is not None
            col = [int(p[name]) // size for p in payloads]
        else:
            time_of = self.time_of
            return [time_of(p) for p in payloads]
        if self.sealed is not None and col:
            lowest = min(col)
            if lowest <= self.sealed:
                self._refuse(lowest)
        return cast(list[Time], col)  # a fresh list already: no copy on the batch path

    def check(self, t: Time) -> None:
        """Raise :class:`SealedTimeError` if ``t`` is at or below a seal of this source."""
        if type(t) is int:
            if self.sealed is not None and t <= self.sealed:
                self._refuse(t)
        elif type(t) is Keyed:
            if (
                self.keys_sealed is not None
                and type(t.time) is int
                and t.time <= self.keys_sealed
            ):
                what = "" if self.substream.kind == "per_key" else f" at event time {t.time}"
                raise SealedTimeError(
                    f"substream '{self.substream.name}': a record of key {t.key!r}{what} after "
                    f"this source sealed every key up to {self.keys_sealed}"
                )
            for s in self.sealed_keyed.get(t.key, ()):
                if less_equal(t.time, s):
                    self._refuse(t, Keyed(t.key, s))
        elif self.sealed_other:
            for s in self.sealed_other:
                if less_equal(t, s):
                    self._refuse(t, s)

    def _refuse(self, t: Time, seal: Time | None = None) -> None:
        seal = self.sealed if seal is None else seal
        what = "window" if self.substream.kind in _WINDOW_KINDS else "time"
        raise SealedTimeError(
            f"substream '{self.substream.name}': a record at {what} {t!r} after this source "
            f"sealed {seal!r} (a seal promises no more records at or below it)"
        )

    def seal(self, t: Time) -> None:
        """Remember the seal ``t`` (rule 1); a seal below an earlier one changes nothing."""
        if type(t) is int:
            if self.sealed is None or t > self.sealed:
                self.sealed = t
        elif type(t) is Keyed:
            self.sealed_keyed[t.key] = _with(self.sealed_keyed.get(t.key, []), t.time)
        elif type(t) is tuple:
            self.sealed_other = _with(self.sealed_other, t)

    def seals_keys_anew(self, upto: int) -> bool:
        """Whether the keyed seal ``upto`` seals anything new (is above the previous one);
        raises for a kind without keys."""
        if self.substream.kind not in ("session", "per_key"):
            raise SubstreamsError(
                f"substream '{self.substream.name}' is of kind '{self.substream.kind}': keyed "
                "seals are for session and per_key substreams"
            )
        return self.keys_sealed is None or upto > self.keys_sealed

    def seal_keys(self, upto: int) -> None:
        """Remember the keyed seal ``upto`` (rule 2), once the mechanism took it."""
        if self.seals_keys_anew(upto):
            self.keys_sealed = upto


_T = TypeVar("_T", bound=int | tuple[int, ...])


def _with(maximal: list[_T], t: _T) -> list[_T]:
    """The antichain of maximal seals ``maximal`` after sealing ``t``."""
    if any(less_equal(t, s) for s in maximal):
        return maximal
    return [s for s in maximal if not less_equal(s, t)] + [t]
