"""The acker's whole recoverable state, its checkpoint encoding, and read-only views of it.

Why one value: the service writes it (with the acks-topic offsets) in the *same Kafka
transaction* as the notifications it explains, so a restarted or standby acker that loads
the latest checkpoint and seeks the acks topic to its offsets continues exactly where the
notifications stop — nothing lost, duplicated or reordered.  The encoding is versioned,
zlib-compressed JSON (times in their wire form), opaque to every other reader.

The views (:class:`AckerView` and friends) are frozen snapshots for the command protocol
and the CLI (``substreams acker status|epochs``); they never alias the live tables.
"""

from __future__ import annotations

import copy
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from substreams.acker.table import SegmentTable
from substreams.control.progress import ProgressTracker
from substreams.errors import ProtocolError
from substreams.frontier import Antichain, Time, UpperAntichain, time_from_wire, time_to_wire

STATE_VERSION = 3
"""3: sessions per (source, acks partition); ``retired`` (a shard handed over).  Version 2
(sessions per source) is still read: see :meth:`AckerState._from_doc`."""


@dataclass(frozen=True)
class OpenTime:
    """One open time of a substream as the acker sees it."""

    time: Time
    xor: int
    records: int
    unsealed_sources: list[str]
    first_seen_ms: int


@dataclass(frozen=True)
class SubstreamView:
    name: str
    lower: Antichain
    upper: UpperAntichain
    open_times: list[OpenTime]
    keyed_floor: bool = False
    """The frontiers hold event times, not keyed times (a session substream:
    :class:`~substreams.control.progress.ProgressTracker`)."""


@dataclass(frozen=True)
class AckerView:
    """What ``substreams acker status`` shows.  ``acks_lag`` is filled by the caller, which
    asks the broker for high watermarks (the acker answers from its state alone)."""

    name: str
    substreams: dict[str, SubstreamView]
    acks_offsets: dict[int, int]
    acks_lag: dict[int, int] | None
    last_notification: dict[str, tuple[Time, int] | None]


SessionKey = tuple[str, int]
"""(source id, acks partition): a source writes each partition it registered in as its own
ordered log (the segments of one partition), so the acker keeps one session per pair."""


@dataclass
class SourceSession:
    """The current incarnation of a source id on one acks partition, as the acker knows it.

    Invariants: ``incarnation`` is the incarnation of the latest Register the acker applied
    for the source id; a message of any other incarnation is stale (its writer was fenced
    by the newer one) and is not applied, nor is any message of an ``evicted`` incarnation
    (the acker fenced it before it stopped waiting for it).  ``seq`` is the latest applied
    sequence number *of that incarnation* (a new incarnation starts its own count);
    ``last_seen_ms`` is the acker's clock when its latest message was read (liveness; reset
    to "now" when an acker starts, so that an acker's own downtime evicts no one); ``writer``
    is its transactional id (what eviction fences); ``evict_when_silent`` is what its
    Register asked for (False: silence never evicts it, an operator's order does)."""

    incarnation: str
    seq: int
    last_seen_ms: int
    writer: str = ""
    evicted: bool = False
    evict_when_silent: bool = True

    def to_state(self) -> list[Any]:
        return [self.incarnation, self.seq, self.last_seen_ms, self.writer, self.evicted,
                self.evict_when_silent]

    @classmethod
    def from_state(cls, v: list[Any]) -> SourceSession:
        # A checkpoint written before the flag existed has five fields: evictable.
        return cls(str(v[0]), int(v[1]), int(v[2]), str(v[3]), bool(v[4]),
                   bool(v[5]) if len(v) > 5 else True)


@dataclass(frozen=True)
class Blocker:
    """An open transaction that holds the LSO of an acks partition (rule 4)."""

    partition: int
    offset: int
    """The LSO it holds: the offset of its first message on the partition."""
    since_ms: int
    """When the acker first found it holding that offset."""
    source: str | None = None
    incarnation: str | None = None
    writer: str | None = None
    looked: bool = False
    """Its first message was read (``source`` None after that: not one of ours)."""
    verdict: str = "waiting"
    """What the acker does about it: waiting | evicted | fenced | reported (rule 5)."""

    def holder(self) -> str:
        if self.source is None:
            return "an unknown writer (not a source of ours)"
        return f"source '{self.source}' (incarnation {self.incarnation})"

    def describe(self) -> str:
        return f"acks partition {self.partition} held at offset {self.offset} by {self.holder()}"

    def to_state(self) -> list[Any]:
        return [self.partition, self.offset, self.since_ms, self.source, self.incarnation,
                self.writer, self.looked, self.verdict]

    @classmethod
    def from_state(cls, v: list[Any]) -> Blocker:
        return cls(int(v[0]), int(v[1]), int(v[2]), v[3], v[4], v[5], bool(v[6]), str(v[7]))


@dataclass(frozen=True)
class Hold:
    """A live source holding a substream's time back (liveness rule 8): ``time`` is the
    oldest open time of ``substream`` that ``source`` has not sealed, held since ``since_ms``
    (the acker's clock)."""

    substream: str
    source: str
    time: Time
    since_ms: int

    def to_state(self) -> list[Any]:
        return [self.substream, self.source, time_to_wire(self.time), self.since_ms]

    @classmethod
    def from_state(cls, v: list[Any]) -> Hold:
        return cls(str(v[0]), str(v[1]), time_from_wire(v[2]), int(v[3]))


@dataclass
class AckerState:
    """Tables, frontier trackers, de-duplication counters and acks offsets."""

    tables: dict[str, SegmentTable] = field(default_factory=dict)
    trackers: dict[str, ProgressTracker] = field(default_factory=dict)
    acks_offsets: dict[int, int] = field(default_factory=dict)
    sessions: dict[SessionKey, SourceSession] = field(default_factory=dict)
    last_notification: dict[str, tuple[Time, int] | None] = field(default_factory=dict)
    checkpoints: int = 0
    commands: dict[str, Any] | None = None
    """The command handler's reduced history and where it stands on the command and response
    topics (a JSON document the handler writes and reads, :mod:`substreams.acker.handler`);
    None when no handler ran.  In the checkpoint so that a restarted acker's handler replays
    a few commands, not the command topic from offset 0."""
    blockers: list[Blocker] = field(default_factory=list)
    """Open transactions holding an acks partition's last stable offset, as the service
    found them (:mod:`substreams.acker.liveness`); in the checkpoint for ``acker sources``
    and the dashboard, never read back by the acker (a restarted one probes afresh)."""
    holds: list[Hold] = field(default_factory=list)
    """Per live source and substream, the oldest open time it has not sealed and since when
    (:class:`~substreams.acker.liveness.Holds`); like ``blockers``, in the checkpoint for
    ``acker sources`` and the dashboard and never read back by the acker."""
    retired: dict[str, Any] | None = None
    """Set in the last checkpoint of an acker whose partitions were handed over to another
    shard layout (``{"to_shards": N, "by": name}``): the state is still what its successors
    load, but no acker of this name may serve from it again."""

    def ensure(self, substream: str, snapshot_every: int, gap_ms: int | None = None) -> None:
        """Tables and trackers for ``substream`` (``gap_ms`` for a session substream)."""
        if substream in self.tables:
            self.tables[substream].gap_ms = gap_ms  # the configuration decides, not the past
            if gap_ms is not None:
                self.trackers[substream].use_keyed_floor()
        else:
            self.tables[substream] = SegmentTable(substream, gap_ms)
            self.trackers[substream] = ProgressTracker(
                substream, snapshot_every, keyed_floor=gap_ms is not None
            )
            self.last_notification.setdefault(substream, None)

    # -- views ---------------------------------------------------------------------------

    def view(self, name: str) -> AckerView:
        subs: dict[str, SubstreamView] = {}
        for sub, table in self.tables.items():
            tracker = self.trackers[sub]
            opens = [
                OpenTime(t, e.xor, e.records, table.unsealed_sources(t), e.first_seen_ms)
                for t, e in table.open.items()
            ]
            subs[sub] = SubstreamView(sub, tracker.lower.frontier(), tracker.upper.copy(), opens,
                                      tracker.keyed_floor)
        return AckerView(name, subs, dict(self.acks_offsets), None, dict(self.last_notification))

    # -- checkpoint encoding -------------------------------------------------------------

    def dumps(self) -> bytes:
        return self.encode(self._doc(share=True))

    def to_doc(self, light: bool = False) -> dict[str, Any]:
        """The checkpoint's JSON document.  It shares no mutable object with the state, so
        it can be encoded later (:meth:`encode`) and still be the state of now: the
        simulator keeps the document of each commit and encodes one only when it restarts
        from it.  ``light``: without the open times, terminated times, seals and upper
        frontiers, which the changelog writes as entries (:mod:`substreams.acker.
        changelog`)."""
        return self._doc(share=False, light=light)

    def head_doc(self) -> dict[str, Any]:
        """:meth:`to_doc` with ``light``, sharing the handler's documents (for a changelog
        record encoded at once)."""
        return self._doc(share=True, light=True)

    def _doc(self, *, share: bool, light: bool = False) -> dict[str, Any]:
        """``share``: the handler's documents by reference (encoded at once)."""
        doc: dict[str, Any] = {
            "version": STATE_VERSION,
            "checkpoints": self.checkpoints,
            "tables": {s: t.to_state(light) for s, t in self.tables.items()},
            "trackers": {s: t.to_state(light) for s, t in self.trackers.items()},
            "sessions": [[k[0], k[1], *v.to_state()] for k, v in self.sessions.items()],
            "last_notification": {
                s: None if v is None else [time_to_wire(v[0]), v[1]]
                for s, v in self.last_notification.items()
            },
        }
        if self.commands is not None:
            doc["commands"] = self.commands if share else copy.deepcopy(self.commands)
        if self.retired is not None:
            doc["retired"] = self.retired if share else copy.deepcopy(self.retired)
        if self.blockers:
            doc["blockers"] = [b.to_state() for b in self.blockers]
        if self.holds:
            doc["holds"] = [h.to_state() for h in self.holds]
        return doc

    @staticmethod
    def encode(doc: dict[str, Any]) -> bytes:
        """A :meth:`to_doc` document as the checkpoint's bytes (what :meth:`loads` reads)."""
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 1)

    @classmethod
    def loads(cls, data: bytes, acks_offsets: dict[int, int], snapshot_every: int) -> AckerState:
        try:
            doc = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError) as exc:
            raise ProtocolError(f"acker checkpoint is not readable: {exc}") from exc
        version = doc.get("version") if isinstance(doc, dict) else None
        if version not in (2, STATE_VERSION):
            raise ProtocolError(
                f"acker checkpoint has version {version!r}; this acker reads "
                f"versions 2 and {STATE_VERSION}"
            )
        try:
            return cls._from_doc(doc, acks_offsets, snapshot_every)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ProtocolError(f"acker checkpoint is malformed: {exc!r}") from exc

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], acks_offsets: dict[int, int], snapshot_every: int
    ) -> AckerState:
        """:meth:`loads` of a decoded document (a changelog's head)."""
        try:
            return cls._from_doc(doc, acks_offsets, snapshot_every)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ProtocolError(f"acker checkpoint is malformed: {exc!r}") from exc

    @classmethod
    def _from_doc(
        cls, doc: dict[str, Any], acks_offsets: dict[int, int], snapshot_every: int
    ) -> AckerState:
        state = cls(acks_offsets=dict(acks_offsets), checkpoints=int(doc["checkpoints"]))
        for sub, t in doc["tables"].items():
            state.tables[sub] = SegmentTable.from_state(sub, t)
        for sub, t in doc["trackers"].items():
            state.trackers[sub] = ProgressTracker.from_state(sub, t, snapshot_every)
        if doc["version"] == 2:
            # Before sharding a source wrote every message to its own partition,
            # crc32(source) % partitions, and an unsharded acker's checkpoint names every
            # partition: its session lives there.  (With one acks partition, the default,
            # nothing else changed: a commit's messages all go to partition 0 as before.)
            n = max(1, len(acks_offsets))
            state.sessions = {
                (str(k), zlib.crc32(str(k).encode()) % n): SourceSession.from_state(v)
                for k, v in doc["sessions"].items()
            }
        else:
            state.sessions = {
                (str(v[0]), int(v[1])): SourceSession.from_state(v[2:])
                for v in doc["sessions"]
            }
        state.last_notification = {
            s: None if v is None else (time_from_wire(v[0]), int(v[1]))
            for s, v in doc["last_notification"].items()
        }
        commands = doc.get("commands")
        if commands is not None and not isinstance(commands, dict):
            raise ProtocolError("acker checkpoint: 'commands' is not a JSON object")
        state.commands = commands
        retired = doc.get("retired")
        if retired is not None and not isinstance(retired, dict):
            raise ProtocolError("acker checkpoint: 'retired' is not a JSON object")
        state.retired = retired
        state.blockers = [Blocker.from_state(v) for v in doc.get("blockers", ())]
        state.holds = [Hold.from_state(v) for v in doc.get("holds", ())]
        return state

    def part(
        self, partitions: set[int], substreams: set[str], commands: bool
    ) -> AckerState:
        """The part of this state that belongs to acks ``partitions`` (whose segments are
        ``substreams``): what a shard taking these partitions over starts from.  Everything
        of a segment lives in its partition's tables, trackers and sessions, so parts of
        disjoint partition sets never overlap and their merge (:meth:`merge`) is the whole.
        ``commands``: keep the command handler's state (every shard reads the whole command
        topic, so a new shard continues from one predecessor's)."""
        return AckerState(
            tables={s: t for s, t in self.tables.items() if s in substreams},
            trackers={s: t for s, t in self.trackers.items() if s in substreams},
            acks_offsets={p: o for p, o in self.acks_offsets.items() if p in partitions},
            sessions={k: v for k, v in self.sessions.items() if k[1] in partitions},
            last_notification={
                s: v for s, v in self.last_notification.items() if s in substreams
            },
            checkpoints=self.checkpoints,
            commands=self.commands if commands else None,
        )

    def merge(self, other: AckerState) -> None:
        """Add ``other``'s part (of other partitions) to this state."""
        clash = self.acks_offsets.keys() & other.acks_offsets.keys()
        if clash:
            raise ProtocolError(f"acker states overlap on acks partitions {sorted(clash)}")
        self.tables.update(other.tables)
        self.trackers.update(other.trackers)
        self.acks_offsets.update(other.acks_offsets)
        self.sessions.update(other.sessions)
        self.last_notification.update(other.last_notification)
        self.checkpoints = max(self.checkpoints, other.checkpoints)
        if other.commands is not None:
            self.commands = other.commands


@dataclass(frozen=True)
class SourceLiveness:
    """One source as ``acker sources`` and the dashboard show it."""

    source: str
    incarnation: str
    roles: list[str]
    substreams: list[str]
    last_seen_ms: int
    status: str
    """live | silent (quiet for over half the eviction timeout) | left | evicted"""
    held: Hold | None = None
    """The oldest time it holds back (of all its substreams: the one held longest)."""


def source_liveness(state: AckerState, written_ms: int, timeout_ms: int) -> list[SourceLiveness]:
    """The sources of a checkpointed state (written at ``written_ms``), by name (a source
    on several acks partitions: its most recently seen session)."""
    out: list[SourceLiveness] = []
    latest: dict[str, SourceSession] = {}
    for (source, _), session in state.sessions.items():
        seen = latest.get(source)
        if seen is None or session.last_seen_ms > seen.last_seen_ms:
            latest[source] = session
    held: dict[str, Hold] = {}
    for h in state.holds:
        if h.source not in held or h.since_ms < held[h.source].since_ms:
            held[h.source] = h
    for source, session in sorted(latest.items()):
        roles = {st.role for t in state.tables.values() if (st := t.sources.get(source))}
        subs = [s for s, t in state.tables.items() if t.is_registered(source)]
        if session.evicted:
            status = "evicted"
        elif not subs:
            status = "left"
        elif written_ms - session.last_seen_ms > timeout_ms // 2:
            status = "silent" if session.evict_when_silent else "silent (kept)"
        else:
            status = "live"
        out.append(SourceLiveness(
            source, session.incarnation, sorted(roles), subs, session.last_seen_ms, status,
            held.get(source) if status not in ("evicted", "left") else None,
        ))
    return out
