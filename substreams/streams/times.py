"""From a record to its time in each substream (the substream predicates of seed 001).

Why the publisher computes times (and writes them into the envelope) instead of every reader
recomputing them: a session's identity depends on the records that came before it for the
same key, which only the publisher has seen.  Readers, the acker and Spark then agree on
every record's time by construction.

Mapping of the configured kinds onto logical times:
- ``epoch``: the int value of ``field``.
- ``tumbling``: ``field // size_ms`` (the window index; window start = index * size_ms).
- ``session``: ``Keyed(str(key), start_ms)`` where start_ms is the event time of the
  session's first record; a new session starts for a key when its event time moves more
  than ``gap_ms`` past the key's previous record.  Sessions of different keys are
  incomparable, so they terminate independently.  Session substreams assume a key is
  written by one publisher (key-partitioned sources), as sessionization usually does.
- ``per_key``: ``Keyed(str(key), 0)``: one substream per key, sealed explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from substreams.config import SubstreamConfig
from substreams.frontier import Keyed, Time


@dataclass
class SessionState:
    start: int
    last: int


@dataclass
class TimeAssigner:
    """Computes a record's time in one substream; keeps session state for ``session``."""

    substream: SubstreamConfig
    order_key: str
    sessions: dict[str, SessionState] = field(default_factory=dict)

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
        if kind == "per_key":
            return Keyed(key, 0)
        assert self.substream.gap_ms is not None
        ts = int(payload[self._field()])
        state = self.sessions.get(key)
        if state is None or ts - state.last > self.substream.gap_ms:
            state = SessionState(start=ts, last=ts)
            self.sessions[key] = state
        else:
            state.last = max(state.last, ts)
        return Keyed(key, state.start)

    def expired_sessions(self, now_ms: int) -> list[Keyed]:
        """Sessions whose gap has passed at event time ``now_ms``: they can be sealed.

        They are forgotten here, so a later record of the same key opens a new session."""
        if self.substream.kind != "session":
            return []
        assert self.substream.gap_ms is not None
        done = [k for k, s in self.sessions.items() if now_ms - s.last > self.substream.gap_ms]
        return [Keyed(k, self.sessions.pop(k).start) for k in done]

    def open_sessions(self) -> list[Keyed]:
        return [Keyed(k, s.start) for k, s in self.sessions.items()]
