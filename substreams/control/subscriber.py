"""The subscriber side of the control-topic protocol (Strymon's, mapped onto Kafka).

A subscriber follows the control topics of one or more substreams and turns them into
``Data`` and ``FrontierAdvanced`` events.  Why a filter at all: a subscriber may join at any
offset, and an epoch that was already active when it joined may have records it can no longer
see (soft mode) or announcements it has missed; Strymon's *upper-frontier filter* drops every
time at or below the snapshot's upper frontier until the lower frontier has passed it, so a
subscriber sees each epoch whole or not at all.  Why one filter for all topics: Strymon merges
the parts' snapshots (upper by union, lower by meet) so atomicity holds across all of them.

Firm mode builds a ``Data`` event from each ``EpochComplete`` (and from each epoch of an
``EpochsComplete``, in order) by reading exactly its offset ranges, so records always precede
the frontier change that completes them; a batched record's frontier change comes once, after
its last epoch's ``Data``.  Soft mode streams
records from the data topics as they arrive and holds each control record back until the data
reader has passed the ranges it names (so no record of a time follows its completion).
"""

from __future__ import annotations

import time as _time
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import TopicPartition

from substreams.config import Config, SubstreamConfig
from substreams.control.chain import TrustingVerifier
from substreams.control.follower import RAISE, ControlFollower, Followed
from substreams.control.io import ResumeLookup, find_last
from substreams.control.messages import (
    ControlBody,
    ControlRecord,
    EpochComplete,
    FrontierSnapshot,
    FrontierUpdate,
    OffsetRange,
    completions,
    merge_ranges,
)
from substreams.control.notes import EpochNote
from substreams.control.progress import event_time
from substreams.control.ranges import EpochIndex, read_ranges
from substreams.control.subscription import SubscriptionFrontiers
from substreams.control.traffic import CONTROL_READ, TRAFFIC
from substreams.control.writers import WriterCheck
from substreams.errors import DecodeError, SubstreamsError
from substreams.frontier import Antichain, Time
from substreams.kafka import client
from substreams.kafka.clock import Deadline, until_idle
from substreams.kafka.read import Reader
from substreams.streams.badrecords import BadRecords
from substreams.streams.listener import StreamDecoder
from substreams.streams.records import Entry

Start = Literal["latest_snapshot", "beginning", "end"] | int
"""Where a subscriber begins on each control topic: its latest snapshot, offset 0, its end
(only what is written from now on), or an explicit offset (a reader that kept its position:
the offset after the last note it handled, ``note.control_offset + 1``)."""
Mode = Literal["firm", "soft"]


# --- events ---------------------------------------------------------------------------------


_Pending = tuple[str, int, ControlBody, tuple[EpochComplete, ...]]
"""A control record waiting to be handled: its topic, offset, body and the notifications it
carries."""

@dataclass(frozen=True)
class Data:
    """Records of one time of one substream.  Firm mode: the whole epoch, once (possibly no
    records: a skipped epoch is still announced).  Soft mode: a batch as it arrived."""

    substream: str
    time: Time
    records: list[Entry] = field(default_factory=list)
    note: EpochNote | None = None
    """Firm mode: the notification (count, ranges, seal time, when it arrived)."""


@dataclass(frozen=True)
class FrontierAdvanced:
    """The merged lower frontier (minimal active times of all parts) after it changed."""

    frontier: Antichain


Event = Data | FrontierAdvanced


def _note(
    substream: str, offset: int, index: int, note: EpochComplete, now_ms: int,
    unreadable: int = 0,
) -> EpochNote:
    return EpochNote(
        note.time, offset, index, note.records, note.sealed_at_ms, now_ms,
        substream=substream, ranges=note.ranges, until=note.until, unreadable=unreadable,
    )


# --- finding the starting snapshot ----------------------------------------------------------------


def find_latest_snapshot(
    bootstrap: str,
    topic: str,
    config: Config | None = None,
    timeout: float = 30.0,
    window: int = 256,
) -> tuple[int, ControlRecord] | None:
    """The latest FrontierSnapshot of ``topic`` and its offset, or None (a backwards search
    from the high watermark: :func:`~substreams.control.io.find_last`).  With a config, only
    a snapshot by a writer it trusts (:class:`~substreams.control.writers.WriterCheck`):
    a foreign one is never a starting point."""
    check = WriterCheck.of(config) if config is not None else None
    return find_last(
        bootstrap, topic,
        lambda rec: isinstance(rec.body, FrontierSnapshot)
        and (check is None or check.admits(topic, rec)),
        config, timeout=timeout, window=window,
    )


def _log_start(bootstrap: str, topic: str, config: Config | None) -> int:
    with Reader(bootstrap, config, name=f"control topic '{topic}'") as reader:
        return reader.log_start(topic)


def _check_start(start: Start) -> None:
    if isinstance(start, bool) or not (
        start in ("latest_snapshot", "beginning", "end")
        or (isinstance(start, int) and start >= 0)
    ):
        raise SubstreamsError(
            "start must be 'latest_snapshot', 'beginning', 'end' or a control offset "
            f">= 0, not {start!r}"
        )


def _mode(subs: Sequence[SubstreamConfig], mode: Mode | None) -> Mode:
    """``mode``, else the substreams' common configured bound."""
    if mode is None:
        bounds = {s.bound for s in subs}
        if len(bounds) > 1:
            raise SubstreamsError(
                f"substreams {', '.join(s.name for s in subs)} have different bounds "
                f"({', '.join(sorted(bounds))}); pass mode='firm' or mode='soft'"
            )
        mode = subs[0].bound
    if mode not in ("firm", "soft"):
        raise SubstreamsError(f"mode must be 'firm' or 'soft', not {mode!r}")
    return mode


# --- the subscriber ------------------------------------------------------------------------------


class Subscriber:
    """Follows the control topics of ``substreams`` and yields ``Data``/``FrontierAdvanced``.

    ``stream`` restricts data to one data stream (default: every stream the ranges name in
    firm mode, each substream's own stream in soft mode).  ``start``: ``latest_snapshot``
    begins at each topic's latest FrontierSnapshot (offset 0 if it has none), ``beginning``
    at offset 0 with empty frontiers, ``end`` at each topic's end and an int at that offset
    (both with empty frontiers: the notes are exact, the frontier is known once the times
    before the start have left it).  ``mode`` defaults to the substreams' configured bound.
    ``read_records=False`` (firm mode): the ``Data`` events carry their notes and no records
    (no data topic is read).
    Every control record read counts as one CONTROL_READ of its substream.  A corrupt record
    or a broken hash chain raises :class:`ProtocolError` naming the topic and offset (a break
    an operator accepted with ``substreams control resume`` is passed, and logged).  A data
    record that does not decode follows its stream's ``on_bad_record``
    (:class:`~substreams.streams.badrecords.BadRecords`, named ``reader``): dead-lettered
    and passed over (a firm note counts those inside its ranges, ``note.unreadable``), or
    a :class:`~substreams.errors.BadRecordError`.
    """

    def __init__(
        self,
        config: Config,
        substreams: Sequence[str],
        *,
        stream: str | None = None,
        bootstrap: str | None = None,
        start: Start = "latest_snapshot",
        mode: Mode | None = None,
        idle_timeout: float | None = None,
        read_records: bool = True,
        reader: str = "subscriber",
    ) -> None:
        if not substreams:
            raise SubstreamsError("a subscriber needs at least one substream")
        _check_start(start)
        self.config = config
        self.substreams = list(dict.fromkeys(substreams))
        subs = [config.substream(s) for s in self.substreams]
        if stream is not None:
            config.stream(stream)
        self.mode: Mode = _mode(subs, mode)
        self.stream = stream
        self.start: Start = start
        self.idle_timeout = idle_timeout
        self.read_records = read_records
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.topics = {config.acker.control_topic(s): s for s in self.substreams}
        self._floors = {
            t for t, s in self.topics.items() if config.substream(s).gap_ms is not None
        }
        """The topics of session substreams: event-time frontiers (:meth:`_admits`)."""
        self.frontiers = SubscriptionFrontiers()
        self._pending: deque[_Pending] = deque()
        self._data_from: dict[str, dict[tuple[str, int], int]] = {}
        self._closed = False
        self._control = ControlFollower(
            self.bootstrap, config, name="subscriber: control", on_bad=RAISE,
            resume=ResumeLookup(self.bootstrap, config),
        )
        self._data: Reader | None = None
        self._decoders: dict[str, StreamDecoder] = {}
        self.bad = BadRecords(config, reader, bootstrap=self.bootstrap)
        try:
            self._position()
            if self.mode == "soft":
                self._open_data()
        except BaseException:
            self.close()
            raise

    @property
    def verifiers(self) -> dict[str, TrustingVerifier]:
        """The hash-chain check of each control topic (chains are per topic)."""
        return self._control.verifiers

    @property
    def positions(self) -> dict[str, int]:
        """The next control offset of each topic."""
        return self._control.positions

    # -- start-up ------------------------------------------------------------------------

    def _position(self) -> None:
        starts: dict[str, int] = {}
        strict_topics: list[str] = []
        for topic, sub in self.topics.items():
            found = (
                find_latest_snapshot(self.bootstrap, topic, self.config)
                if self.start == "latest_snapshot"
                else None
            )
            strict = (
                self.start in ("latest_snapshot", "beginning")
                and found is None
                and _log_start(self.bootstrap, topic, self.config) == 0
            )
            if strict:
                strict_topics.append(topic)
            reader = self._control.reader
            if found is None:
                self.frontiers.start(topic, (), ())
                self._data_from[topic] = {}
                if self.start == "end":
                    starts[topic] = reader.watermarks(topic)[1]
                elif isinstance(self.start, int):
                    starts[topic] = max(self.start, reader.log_start(topic))
                else:
                    starts[topic] = 0
            else:
                offset, rec = found
                snap = rec.body
                assert isinstance(snap, FrontierSnapshot)
                self._control.anchor(topic, offset, rec)
                TRAFFIC.add(CONTROL_READ, sub)
                self.frontiers.start(topic, snap.lower, snap.upper)
                self._data_from[topic] = {(r.stream, r.partition): r.start for r in snap.data_from}
                starts[topic] = offset + 1
        self._control.assign(starts, strict_topics)

    def _open_data(self) -> None:
        streams = [self.stream] if self.stream else list(
            dict.fromkeys(self.config.substream(s).stream for s in self.substreams)
        )
        starts: dict[tuple[str, int], int] = {}
        for s in streams:
            for p in range(self.config.stream(s).partitions):
                froms = [
                    self._data_from[t].get((s, p), 0)
                    for t, sub in self.topics.items()
                    if self.config.substream(sub).stream == s
                ]
                starts[(s, p)] = min(froms, default=0)
            self._decoders[s] = StreamDecoder(self.config, s)
        self._data = Reader(self.bootstrap, self.config, name="subscriber: data")
        self._data.assign([TopicPartition(s, p, o) for (s, p), o in starts.items()])

    @property
    def _data_pos(self) -> dict[tuple[str, int], int]:
        """Soft mode: the next offset of the data reader, per partition."""
        return {} if self._data is None else self._data.positions

    # -- reading -------------------------------------------------------------------------

    @property
    def frontier(self) -> Antichain:
        """The merged lower frontier as the subscriber knows it now."""
        return self.frontiers.lower

    def poll(self, timeout: float = 1.0) -> list[Event]:
        """Events that became available within ``timeout`` seconds (possibly none)."""
        if self._closed:
            raise SubstreamsError("poll() on a closed subscriber")
        deadline = Deadline(timeout)
        while True:
            events = self._step(deadline.left(cap=0.1))
            if events or deadline.passed:
                return events

    def events(self, idle_timeout: float | None = None) -> Iterator[Event]:
        """Iterate events; with ``idle_timeout`` stop after that long without one."""
        return until_idle(lambda: self.poll(0.2), idle_timeout)

    def __iter__(self) -> Iterator[Event]:
        return self.events(self.idle_timeout)

    def _step(self, timeout: float) -> list[Event]:
        events: list[Event] = []
        if self._data is not None:
            events.extend(self._read_data(timeout / 2))
            timeout /= 2
        for followed in self._control.poll(timeout, 500):
            self._take_control(followed)
        ready: list[_Pending] = []
        while self._pending and self._ready(self._pending[0][3]):
            ready.append(self._pending.popleft())
        epochs, unreadable = (
            self._read_epochs(ready) if self._data is None and self.read_records else ({}, {})
        )
        by_record: dict[int, dict[int, list[Entry]]] = defaultdict(dict)
        for (i, j), entries in epochs.items():
            by_record[i][j] = entries
        bad_of: dict[int, dict[int, int]] = defaultdict(dict)
        for (i, j), n in unreadable.items():
            bad_of[i][j] = n
        for i, pending in enumerate(ready):
            events.extend(self._handle(pending, by_record.get(i, {}), bad_of.get(i, {})))
        return events

    def _take_control(self, followed: Followed) -> None:
        """A decoded record whose chain checked out (the follower raised otherwise)."""
        topic, offset, rec = followed.topic, followed.offset, followed.record
        TRAFFIC.add(CONTROL_READ, self.topics[topic])
        # Expanded once here: readiness, the firm read and the events all need the notes.
        self._pending.append((topic, offset, rec.body, completions(rec.body)))

    def _ready(self, notes: tuple[EpochComplete, ...]) -> bool:
        """Soft mode: the data reader has passed every range the notifications name."""
        if self._data is None:
            return True
        return all(
            self._data_pos.get((r.stream, r.partition), r.end) >= r.end
            for note in notes
            for r in note.ranges
        )

    def _handle(
        self, pending: _Pending, records: Mapping[int, list[Entry]],
        unreadable: Mapping[int, int] | None = None,
    ) -> list[Event]:
        """The events of one control record: a Data per announced epoch (firm mode;
        ``records`` and ``unreadable`` by index in the record), then the frontier it moved
        to."""
        bad = unreadable or {}
        topic, offset, body, notes = pending
        sub = self.topics[topic]
        out: list[Event] = []
        moved: Antichain | None = None
        if notes:
            if self._data is None:
                now = int(_time.time() * 1000)
                out.extend(
                    Data(sub, note.time, records.get(j, []),
                         _note(sub, offset, j, note, now, bad.get(j, 0)))
                    for j, note in enumerate(notes)
                    if self._admits(topic, note.time, note.ranges)
                )
            # A run's frontier changes hold after its last time (see complete_many).
            moved = self.frontiers.complete_many(
                topic, [n.time for n in notes], notes[-1].lower_updates
            )
        elif isinstance(body, FrontierUpdate):
            moved = self.frontiers.apply(topic, body.updates)
        if moved is not None:
            out.append(FrontierAdvanced(moved))
        return out

    def _read_epochs(
        self, ready: Sequence[_Pending]
    ) -> tuple[dict[tuple[int, int], list[Entry]], dict[tuple[int, int], int]]:
        """Firm mode: the records of every epoch announced in ``ready``, by (position in
        ``ready``, index in its record), read in one pass over the hull of their ranges: one
        consumer per batch, not per epoch; and how many undecodable records each one's
        ranges hold."""
        wanted: dict[tuple[int, int], tuple[OffsetRange, ...]] = {}
        index: dict[str, EpochIndex[tuple[int, int]]] = {}
        for i, (topic, _, _, notes) in enumerate(ready):
            for j, note in enumerate(notes):
                wanted[(i, j)] = tuple(
                    r for r in note.ranges if self.stream is None or r.stream == self.stream
                )
                index.setdefault(self.topics[topic], EpochIndex()).add(
                    note.time, note.until, (i, j)
                )
        out: dict[tuple[int, int], list[Entry]] = {k: [] for k in wanted}
        hull = merge_ranges([r for rs in wanted.values() for r in rs])
        read = read_ranges(self.bootstrap, self.config, hull, bad=self.bad) if hull else []
        self.bad.flush()
        unreadable = {
            k: self.bad.within((r.stream, r.partition, r.start, r.end) for r in rs)
            for k, rs in wanted.items()
        } if self.bad.dead_lettered else {}
        for entry in read:
            for sub, epochs in index.items():
                t = entry.times.get(sub)
                for key in epochs.get(t) if t is not None else ():
                    if any(
                        r.stream == entry.stream and r.partition == entry.partition
                        and r.start <= entry.index < r.end
                        for r in wanted[key]
                    ):
                        out[key].append(entry)
        return out, unreadable

    def _admits(
        self, topic: str, t: Time, ranges: Sequence[OffsetRange] | None
    ) -> bool:
        """Strymon's filter for time ``t`` of ``topic``'s substream.  A session substream
        publishes event-time frontiers (``ProgressTracker.keyed_floor``), so its keyed times
        are filtered by their event time; a completion whose offset ``ranges`` all start
        where this subscriber's data reading began or later was seen whole whatever its
        time, so it is admitted too (firm mode: a session of a key that started after the
        join below the snapshot's highest event time)."""
        if topic not in self._floors:
            return self.frontiers.admits(t)
        if self.frontiers.admits(event_time(t)):
            return True
        if ranges is None:
            return False
        starts = self._data_from[topic]
        return bool(ranges) and all(
            r.start >= starts.get((r.stream, r.partition), 0) for r in ranges
        )

    def _read_data(self, timeout: float) -> list[Event]:
        assert self._data is not None
        batches: dict[tuple[str, Time], list[Entry]] = {}
        for msg in self._data.poll(timeout, 1000):
            key = (msg.topic(), msg.partition())
            try:
                entry = self._decoders[msg.topic()].decode(msg)
            except DecodeError as exc:
                self.bad.message(msg, exc)
                continue
            self.bad.good()
            if not isinstance(entry, Entry):
                continue
            for topic, sub in self.topics.items():
                t = entry.times.get(sub)
                if t is None or entry.index < self._data_from[topic].get(key, 0):
                    continue
                if self._admits(topic, t, None):
                    batches.setdefault((sub, t), []).append(entry)
        return [Data(sub, t, recs) for (sub, t), recs in batches.items()]

    # -- life cycle ------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.bad.close()
        finally:
            self._control.close()
            if self._data is not None:
                self._data.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
