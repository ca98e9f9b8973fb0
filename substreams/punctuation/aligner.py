"""Punctuation alignment: when a time of a substream is over, as pure logic (no Kafka).

The trAcker paper's punctuations baseline: every producer writes its punctuations into
every partition of the data topic, in-band, so they are ordered with its records.  Per data
partition the aligner keeps the producers registered there (REGISTER / UNREGISTER) and, per
producer, the upper antichain of the times it has sealed (``SEAL t``: no more records of
this producer at times ``<= t`` in this partition; ``less_equal`` makes int, tuple and
:class:`~substreams.frontier.Keyed` times work alike).

A time ``t`` is *aligned in partition q* when every known producer either has sealed a time
``>= t`` in q, has left q (UNREGISTER), or cannot write ``t`` any more (it registered with a
start time that is not ``<= t``).  A producer known from another partition whose REGISTER in
q has not been read yet blocks q: it wrote REGISTER into every partition before any record,
so records of it may still be ahead in q.  ``t`` is *aligned* (the substream is over) when it
is aligned in every partition this aligner reads.  Alignment is downward closed (seals are),
so once ``t`` is aligned every known smaller time is too.

Events, in the order a consumer must process them:

- ``Released(entry)``: hand the record to the operator.  Soft bound: at once.  Firm bound:
  a record of ``t`` is held until every known time ``t' < t`` has terminated; when ``t``
  terminates, its held records are released first, then ``Terminated(t)``.
- ``Terminated(substream, time, ranges, records)``: ``time`` is over; ``ranges`` gives, per
  partition, the offsets ``[first, last + 1)`` of the records of ``time`` this aligner saw
  (the records are the ones inside the ranges whose time is ``time``).  With ``ordered``
  termination events come in time order (never before a smaller known time; times that
  align together come in ``sort_key`` order, a linear extension of the partial order).
- ``Late(entry, reason)``: a record that arrived after its time was terminated (a producer
  that registered too late, or one that wrote below its own seal).

Decision on late records: they are *not* merged into a later time nor released silently,
because the termination event already promised the operator that the time was complete;
re-opening it would break the firm bound, dropping it would lose data.  They are reported
as ``Late`` so that the caller routes them to the dead-letter topic where they can be seen
and replayed.  A producer that joins late should register with a start time (REGISTER
carries one) beyond the times already sealed by the others; it then only constrains times it
can still write.  Records of producers that never registered are accepted when their time
is still open but never block alignment (nothing tells the aligner to wait for them).
Every producer must seal every time it could write (or leave): a producer that stays
registered without sealing blocks the substream, which is the baseline's known cost.

State for a restart (:meth:`Aligner.to_state` / :meth:`Aligner.from_state`): what decides
terminations -- the producers and their seals per partition, the open times with their
ranges, the maximal terminated times, the latest punctuation stamp -- as a JSON-able
document.  Records held back by the firm bound are not in it (it refuses to dump while any
are): a caller that checkpoints reads with the soft bound, as the aligner service does,
which hands records to nobody.  An aligner restored from a dump taken after some messages
and fed the rest emits the same events as one fed everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from substreams.control.messages import OffsetRange
from substreams.errors import ProtocolError
from substreams.frontier import (
    Time,
    UpperAntichain,
    less_equal,
    less_than,
    sort_key,
    time_from_wire,
    time_to_wire,
)
from substreams.streams.records import Entry

PunctuationKind = Literal["REGISTER", "SEAL", "UNREGISTER"]
Bound = Literal["firm", "soft"]


@dataclass(frozen=True, slots=True)
class Punctuation:
    """One punctuation as read from (or written to) one data partition."""

    kind: PunctuationKind
    producer: str
    substream: str
    time: Time | None
    partition: int
    index: int = -1
    sent_at_ms: int = 0

    def to_wire(self) -> dict[str, Any]:
        """The Avro record of ``substreams/avro/punctuation.avsc`` (partition and index are
        positions)."""
        return {
            "kind": self.kind,
            "producer": self.producer,
            "substream": self.substream,
            "time": None if self.time is None else time_to_wire(self.time),
            "sent_at_ms": self.sent_at_ms,
        }

    @staticmethod
    def from_wire(fields: Mapping[str, Any], partition: int, index: int = -1) -> Punctuation:
        raw = fields.get("time")
        if isinstance(raw, tuple):  # a union decoded with its record name
            raw = raw[1]
        kind = fields["kind"]
        if kind not in ("REGISTER", "SEAL", "UNREGISTER"):
            raise ProtocolError(
                f"punctuation at partition {partition} offset {index}: unknown kind {kind!r}"
            )
        try:
            return Punctuation(
                kind,
                str(fields["producer"]),
                str(fields["substream"]),
                None if raw is None else time_from_wire(raw),
                partition,
                index,
                int(fields.get("sent_at_ms", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(
                f"punctuation at partition {partition} offset {index}: malformed: {exc}"
            ) from exc


@dataclass(frozen=True, slots=True)
class Released:
    """Process this record now."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class Terminated:
    """``time`` of ``substream`` is over: no record of it follows."""

    substream: str
    time: Time
    ranges: tuple[OffsetRange, ...]
    records: int
    sealed_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Late:
    """A record whose time had already terminated (for the dead-letter topic)."""

    entry: Entry
    reason: str


Event = Released | Terminated | Late


ChainClass = tuple[int, str, int]


def _chain(t: Time) -> ChainClass:
    """The chain class of ``t`` (kind, key, arity): only times of one class are comparable."""
    k = sort_key(t)
    return (k[0], k[1], k[2])


class _Upper:
    """An upper antichain split by chain class (kind, key, arity): times of different classes
    are incomparable, so ``covers`` only looks at one class -- sessions have a class per key."""

    __slots__ = ("_by_class",)

    def __init__(self) -> None:
        self._by_class: dict[ChainClass, UpperAntichain] = {}

    def insert(self, t: Time) -> None:
        cls = _chain(t)
        upper = self._by_class.get(cls)
        if upper is None:
            upper = self._by_class[cls] = UpperAntichain()
        upper.insert(t)

    def covers(self, t: Time) -> bool:
        upper = self._by_class.get(_chain(t))
        return upper is not None and upper.covers(t)

    def elements(self) -> list[Time]:
        return sorted((t for u in self._by_class.values() for t in u), key=sort_key)


@dataclass
class _ProducerState:
    """What one producer said in one partition."""

    registered: bool = True
    start: Time | None = None
    sealed: _Upper = field(default_factory=_Upper)

    def blocks(self, t: Time) -> bool:
        if not self.registered:
            return False
        if self.start is not None and not less_equal(self.start, t):
            return False
        return not self.sealed.covers(t)


@dataclass
class _TimeState:
    """A known, not yet terminated time: where its records are."""

    ranges: dict[int, list[int]] = field(default_factory=dict)
    records: int = 0

    def add(self, partition: int, offset: int) -> None:
        r = self.ranges.get(partition)
        if r is None:
            self.ranges[partition] = [offset, offset + 1]
        else:
            r[0] = min(r[0], offset)
            r[1] = max(r[1], offset + 1)
        self.records += 1


class Aligner:
    """Aligns the punctuations of one substream over a set of data partitions."""

    def __init__(
        self,
        substream: str,
        stream: str,
        partitions: Iterable[int],
        *,
        bound: Bound = "firm",
        ordered: bool = True,
    ) -> None:
        self.substream = substream
        self.stream = stream
        self.bound = bound
        self.ordered = ordered
        self.partitions = tuple(sorted(set(partitions)))
        self._parts: dict[int, dict[str, _ProducerState]] = {p: {} for p in self.partitions}
        self._producers: dict[str, Time | None] = {}  # every producer seen -> its latest start
        self._pending: dict[Time, _TimeState] = {}  # known, not terminated (insertion order)
        self._done = _Upper()  # maximal terminated times
        self._held: dict[Time, list[Entry]] = {}  # firm: records waiting, by time
        self._held_count = 0
        # pending times and firm-bound verdicts by chain class: a time is held back only by
        # smaller times of its own class (per key, for sessions)
        self._by_class: dict[ChainClass, dict[Time, bool | None]] = {}
        self._last_ms = 0
        self._new_times: list[Time] = []
        self.track_new_times = False
        self.terminated = 0

    # -- inputs --------------------------------------------------------------------------

    def on_record(self, entry: Entry) -> list[Event]:
        """A data record read from one of this aligner's partitions."""
        states = self._partition(entry.partition)
        t = entry.times.get(self.substream)
        if t is None:
            return [Late(entry, f"record has no time in substream '{self.substream}'")]
        own = states.get(entry.source)
        if own is not None and own.sealed.covers(t):
            sealed = ", ".join(map(repr, own.sealed.elements()))
            return [
                Late(
                    entry,
                    f"producer '{entry.source}' had sealed {sealed} in partition "
                    f"{entry.partition}, which covers time {t!r}",
                )
            ]
        if self._done.covers(t):
            return [
                Late(entry, f"time {t!r} of substream '{self.substream}' had already terminated")
            ]
        state = self._pending.get(t)
        new = state is None
        if state is None:
            state = self._open(t)
        state.add(entry.partition, entry.index)
        out: list[Event] = []
        if self.bound == "soft" or not self._blocked(t):
            out.append(Released(entry))
        else:
            self._held.setdefault(t, []).append(entry)
            self._held_count += 1
        if new:  # a record changes no other time's alignment
            out.extend(self._advance([t]))
        return out

    def on_punctuation(self, p: Punctuation) -> list[Event]:
        """A punctuation read from one of this aligner's partitions (others' are ignored)."""
        if p.substream != self.substream:
            return []
        states = self._partition(p.partition)
        self._last_ms = max(self._last_ms, p.sent_at_ms)
        st = states.get(p.producer)
        if p.kind == "REGISTER":
            if st is None:
                st = states[p.producer] = _ProducerState()
            st.registered = True
            st.start = p.time
            self._producers[p.producer] = p.time
            # a tighter start may free times; a new producer blocks, never frees
            return self._advance(list(self._pending))
        self._producers.setdefault(p.producer, None)
        if st is None:  # no REGISTER seen: it evidently writes here
            st = states[p.producer] = _ProducerState()
        if p.kind == "UNREGISTER":
            st.registered = False
            return self._advance(list(self._pending))
        if p.time is None:
            raise ProtocolError(
                f"SEAL of substream '{self.substream}' by '{p.producer}' in partition "
                f"{p.partition} (offset {p.index}) carries no time"
            )
        st.sealed.insert(p.time)
        if p.time not in self._pending and not self._done.covers(p.time):
            self._open(p.time)
        sealed = p.time  # a seal frees only times below it
        same = self._by_class.get(_chain(sealed), {})
        return self._advance([t for t in same if less_equal(t, sealed)])

    # -- state for a restart -----------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Everything that decides what terminates next, as JSON-able values (the open times
        in their order: unordered termination follows it)."""
        if self._held_count:
            raise ValueError(
                f"aligner of '{self.substream}' holds {self._held_count} records back (firm "
                "bound): its state would not hold them; checkpoint a soft-bound aligner"
            )

        def wire(t: Time | None) -> Any:
            return None if t is None else time_to_wire(t)

        return {
            "partitions": list(self.partitions),
            "parts": [
                [q, [[name, st.registered, wire(st.start), [wire(t) for t in st.sealed.elements()]]
                     for name, st in states.items()]]
                for q, states in self._parts.items()
            ],
            "producers": [[name, wire(start)] for name, start in self._producers.items()],
            "pending": [
                [wire(t), [[q, lo, hi] for q, (lo, hi) in st.ranges.items()], st.records]
                for t, st in self._pending.items()
            ],
            "done": [wire(t) for t in self._done.elements()],
            "last_ms": self._last_ms,
            "terminated": self.terminated,
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        substream: str,
        stream: str,
        *,
        bound: Bound = "soft",
        ordered: bool = True,
    ) -> Aligner:
        """The aligner :meth:`to_state` dumped; :class:`ProtocolError` for a document that is
        not one."""

        def time(raw: Any) -> Time | None:
            return None if raw is None else time_from_wire(raw)

        try:
            aligner = cls(substream, stream, state["partitions"], bound=bound, ordered=ordered)
            for q, producers in state["parts"]:
                states = aligner._partition(int(q))
                for name, registered, start, sealed in producers:
                    st = states[str(name)] = _ProducerState(bool(registered), time(start))
                    for t in sealed:
                        st.sealed.insert(time_from_wire(t))
            for name, start in state["producers"]:
                aligner._producers[str(name)] = time(start)
            for raw, ranges, records in state["pending"]:
                t = time_from_wire(raw)
                aligner._pending[t] = _TimeState(
                    {int(q): [int(lo), int(hi)] for q, lo, hi in ranges}, int(records)
                )
                # the class index in the same (insertion) order; verdicts recomputed
                aligner._by_class.setdefault(_chain(t), {})[t] = None
            for raw in state["done"]:
                aligner._done.insert(time_from_wire(raw))
            aligner._last_ms = int(state["last_ms"])
            aligner.terminated = int(state["terminated"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(
                f"aligner state of '{substream}' is malformed: {exc!r}"
            ) from exc
        return aligner

    # -- queries -------------------------------------------------------------------------

    def pending_times(self) -> list[Time]:
        """Known times not terminated yet, in ``sort_key`` order."""
        return sorted(self._pending, key=sort_key)

    def held(self) -> int:
        """Records held back by the firm bound."""
        return self._held_count

    def producers(self) -> dict[str, Time | None]:
        """Every producer seen, with its latest start time."""
        return dict(self._producers)

    def open_starts(self) -> dict[int, int]:
        """Per partition, the first offset of a record of a time not terminated yet (where a
        subscriber joining now must start reading to see those times whole)."""
        starts: dict[int, int] = {}
        for state in self._pending.values():
            for q, (lo, _) in state.ranges.items():
                starts[q] = min(lo, starts.get(q, lo))
        return starts

    def take_new_times(self) -> list[Time]:
        """Times first seen since the last call (only with ``track_new_times``)."""
        out, self._new_times = self._new_times, []
        return out

    # -- internals -----------------------------------------------------------------------

    def _partition(self, partition: int) -> dict[str, _ProducerState]:
        states = self._parts.get(partition)
        if states is None:
            raise ValueError(
                f"aligner of '{self.substream}' reads partitions {list(self.partitions)}, "
                f"not {partition}"
            )
        return states

    def _open(self, t: Time) -> _TimeState:
        state = self._pending[t] = _TimeState()
        same = self._by_class.setdefault(_chain(t), {})
        for k, blocked in same.items():
            if blocked is False and less_than(t, k):
                same[k] = True
        same[t] = None
        if self.track_new_times:
            self._new_times.append(t)
        return state

    def _blocked(self, t: Time) -> bool:
        """Firm bound: some known smaller time has not terminated yet."""
        same = self._by_class[_chain(t)]
        hit = same[t]
        if hit is None:
            hit = same[t] = any(less_than(u, t) for u in same)
        return hit

    def _aligned(self, t: Time) -> bool:
        if not self._producers:
            return False
        for states in self._parts.values():
            for producer, start in self._producers.items():
                st = states.get(producer)
                if st is None:
                    if start is None or less_equal(start, t):
                        return False  # its REGISTER here is still ahead of us
                elif st.blocks(t):
                    return False
        return True

    def _advance(self, candidates: list[Time]) -> list[Event]:
        """Terminate those of ``candidates`` (pending times) that became aligned."""
        if not candidates:
            return []
        if self.ordered:
            candidates.sort(key=sort_key)
        aligned = [t for t in candidates if self._aligned(t)]
        if not aligned:
            return []
        out: list[Event] = []
        done = set(aligned)
        for t in aligned:
            if self.ordered and any(
                less_than(u, t) and u not in done for u in self._by_class.get(_chain(t), {})
            ):  # cannot happen (alignment is downward closed); kept as a guard
                continue
            out.extend(self._terminate(t))
        if self._held:
            out.extend(self._release_unblocked({_chain(t) for t in aligned}))
        return out

    def _terminate(self, t: Time) -> list[Event]:
        state = self._pending.pop(t)
        cls = _chain(t)
        same = self._by_class[cls]
        del same[t]
        if not same:
            del self._by_class[cls]
        for k, blocked in same.items():
            if blocked and less_than(t, k):
                same[k] = None  # may be free now: recomputed when asked
        held = self._held.pop(t, [])
        self._held_count -= len(held)
        out: list[Event] = [Released(e) for e in held]
        ranges = tuple(
            OffsetRange(self.stream, q, lo, hi) for q, (lo, hi) in sorted(state.ranges.items())
        )
        out.append(Terminated(self.substream, t, ranges, state.records, self._last_ms))
        self._done.insert(t)
        self.terminated += 1
        return out

    def _release_unblocked(self, classes: set[ChainClass]) -> list[Event]:
        """Held records of ``classes`` (where times terminated) no longer held back, in time
        order."""
        out: list[Event] = []
        free = [
            t
            for cls in classes
            for t in self._by_class.get(cls, {})
            if t in self._held and not self._blocked(t)
        ]
        for t in sorted(free, key=sort_key):
            held = self._held.pop(t)
            self._held_count -= len(held)
            out.extend(Released(e) for e in held)
        return out
