"""From a record to its time in each substream (the substream predicates of seed 001).

Why the publisher computes times (and writes them into the envelope) instead of every reader
recomputing them: readers, the acker and Spark then agree on every record's time by
construction, whatever configuration they were started with.

Mapping of the configured kinds onto logical times:
- ``epoch``: the int value of ``field``.
- ``tumbling``: ``field // size_ms`` (the window index; window start = index * size_ms).
- ``session``: ``Keyed(str(key), event_ms)``, the record's own keyed event time.  Sessions
  (runs of one key's times at most ``gap_ms`` apart) are cut where every source's records
  meet -- the acker -- not here: with several sources writing one key, none of them sees a
  whole session (:mod:`substreams.frontier.sessions`).  So a publisher keeps no session
  state, and a restarted one has none to lose.
- ``per_key``: ``Keyed(str(key), 0)``: one substream per key, sealed explicitly.

A *keyed seal* (:meth:`TimeAssigner.seal_keys`) promises no more records at ``Keyed(k, t)``,
``t <= T``, for every key: afterwards a record at such a time is refused here, before
anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from substreams.config import SubstreamConfig
from substreams.errors import SealedTimeError, SubstreamsError
from substreams.frontier import Keyed, Time


@dataclass
class TimeAssigner:
    """Computes a record's time in one substream, and refuses one below its keyed seal."""

    substream: SubstreamConfig
    order_key: str
    keys_sealed: int | None = None
    """This source's keyed seal (session/per_key), if any."""

    def _field(self) -> str:
        return self.substream.field or self.order_key

    def time_of(self, payload: Mapping[str, Any]) -> Time:
        kind = self.substream.kind
        if kind == "epoch":
            return int(payload[self._field()])
        if kind == "tumbling":
            assert self.substream.size_ms is not None
            return int(payload[self._field()]) // self.substream.size_ms
        assert self.substream.key is not None
        key = str(payload[self.substream.key])
        t = 0 if kind == "per_key" else int(payload[self._field()])
        if self.keys_sealed is not None and t <= self.keys_sealed:
            what = "" if kind == "per_key" else f" at event time {t}"
            raise SealedTimeError(
                f"substream '{self.substream.name}': a record of key {key!r}{what} after this "
                f"source sealed every key up to {self.keys_sealed}"
            )
        return Keyed(key, t)

    def times_of(self, payloads: Sequence[Mapping[str, Any]]) -> list[Time]:
        """``time_of`` of every payload, as one column (``Publisher.publish_many``): the kind
        is dispatched once, not per record; a record below the keyed seal raises
        :class:`SealedTimeError` before any time is returned."""
        kind = self.substream.kind
        field = self._field()
        if kind == "epoch":
            return [int(p[field]) for p in payloads]
        if kind == "tumbling":
            size = self.substream.size_ms
            assert size is not None
            return [int(p[field]) // size for p in payloads]
        time_of = self.time_of
        return [time_of(p) for p in payloads]

    def seal_keys(self, upto: int) -> bool:
        """Remember the keyed seal ``upto``; False if it seals nothing new (not above the
        previous one)."""
        if self.substream.kind not in ("session", "per_key"):
            raise SubstreamsError(
                f"substream '{self.substream.name}' is of kind '{self.substream.kind}': keyed "
                "seals are for session and per_key substreams"
            )
        if self.keys_sealed is not None and upto <= self.keys_sealed:
            return False
        self.keys_sealed = upto
        return True
