"""The acker's rules as one pure state machine: acks messages and time in, effects out.

No Kafka, clock, thread, logging or metrics here.  :class:`~substreams.acker.service.
AckerService` is the shell around it: it reads the acks topic and calls :meth:`AckerCore.
apply` per message and :meth:`AckerCore.tick` per step, feeds it the broker's answers
(:meth:`AckerCore.probed`, :meth:`AckerCore.named`, :meth:`AckerCore.fenced`), and carries out
the effects: dead letters for the refusals, fences, and the control records, written with the
checkpoint of :attr:`AckerCore.state` in one transaction.  So every rule below is unit-tested
on a simulated clock, and a simulator can drive the same code.

Rules (the termination rule is :mod:`substreams.acker.table`'s, liveness is
:mod:`substreams.acker.liveness`'s, both applied here):

1. *Ownership.*  The core owns the acks partitions it was given and the segments (substreams)
   whose home partition (:func:`~substreams.acker.protocol.segment_partition`) is one of them; a
   message about another segment is refused as ``unknown_substream`` (it was written for
   another ``acks_partitions`` layout, and applying it could reorder it against the segment's
   own partition).
2. *Sessions.*  A source has one session per acks partition it writes: its current
   incarnation, the last sequence number applied, when it was last heard, its transactional
   id.  A Register of another incarnation starts a new session (everything the old one
   committed precedes it in the partition: the new one's ``init_transactions`` fenced it) and
   drops an eviction in progress for it.
3. *Exactly once.*  A message of the current incarnation is applied iff its sequence number is
   above the session's (a lower or equal one was applied before the acker's last checkpoint
   and is replayed: a duplicate, ignored).
4. *Stale and unknown.*  A message of another incarnation, or of an evicted one, is refused as
   ``stale_incarnation``; of a source without a session as ``unregistered_source``.
   Heartbeats carry no sequence number: one of the current incarnation refreshes liveness,
   any other is counted stale and dropped.
5. *Reports and seals* go to the segments' tables; a report for a time that already
   terminated is refused as ``terminated_time`` (its time was announced without it), a seal of
   a source not registered there as ``unregistered_source``.  Every refusal is per message:
   the rest of the message applies.
6. *Eviction* (for silence, a silent blocker, an overdue hold or an operator's ``Evict``;
   its *cause* is one of :data:`EVICTION_CAUSES`) of a live SOURCE of a segment of the
   partition: first its writer is fenced and the partition's high watermark asked (effect
   :class:`Evict`; the shell answers with :meth:`AckerCore.fenced`); it takes effect once the
   partition was read up to that offset (liveness rule 6): the source is unregistered from the
   partition's segments and a ``SourceEvicted`` goes on each one's control topic.
7. *Departed sessions are forgotten.*  A session that was evicted, or whose source left every
   segment of its partition, is pruned :data:`DEPARTED_KEEP_MS` after it was last heard.
   Nothing it could still send needs it: an evicted incarnation was fenced and its partition
   read past the fence before the eviction took effect, and a source that left committed its
   last transaction with the Unregister; a heartbeat of either is dropped with or without a
   session, and a message of a forgotten incarnation is still refused (as
   ``unregistered_source``).  Kept that long only so that ``acker sources`` shows who left.
8. *Terminations.*  Per substream, the times that terminated go out in order, as
   ``EpochComplete``/``EpochsComplete`` (runs of at most :data:`MAX_COMPLETIONS_PER_RECORD`
   per record) with their frontier changes, in the same transaction as the state that
   accounts for them.
9. *Holds.*  Every :func:`~substreams.acker.liveness.holds_every_ms`, each live SOURCE's
   oldest unsealed open time per segment and since when it holds it are recomputed
   (liveness rule 8) and kept in :attr:`AckerState.holds` for operators; with
   ``unsealed_timeout_ms`` set, an overdue hold (liveness rule 9) evicts its source by rule 6
   with cause ``unsealed``, unless it registered as never evicted for silence (then it is
   warned of, once per hold).  Off by default: an eviction makes the source's later records
   at the times then notified late (module :mod:`substreams.acker.liveness`; docs/design.md,
   "A live source that never seals").
10. *Heartbeat.*  A transaction is committed at least every ``heartbeat_ms`` even with nothing
   to notify (:meth:`AckerCore.heartbeat_due`): the acker's ``WriterHeartbeat`` (what a standby
   watches), every substream's pending lower-frontier update, and a fresh checkpoint, which
   bounds what a restart replays.  The partitions' ends are asked every
   :func:`~substreams.acker.liveness.probe_interval_ms` (:meth:`AckerCore.probe_due`).
11. *Start-up* (:func:`recovery`, :func:`start_offsets`).  A shard serves the state of its own
   latest checkpoint; a checkpoint marked retired is never served (its partitions moved to
   another layout), unless this shard is told to take them over; a checkpoint holding
   partitions the shard does not own is refused (``acks_partitions`` changed).  Each partition
   is read from the checkpoint's offset, or from its log start if never read; a checkpoint
   offset below the log start is refused (retention deleted acks never applied).
12. *Take-over* (:func:`predecessors`, :func:`may_retire`).  Partition ``p`` of a shard of
   ``N`` comes from shard ``p % M`` of the previous ``M``-shard layout; a predecessor already
   retired to another layout than this one's is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from substreams.acker.liveness import (
    Holds,
    Liveness,
    Silent,
    SilentBlocker,
    excuse_stall,
    holds_every_ms,
    probe_interval_ms,
)
from substreams.acker.protocol import (
    AckMessage,
    AckReport,
    Columns,
    Register,
    SourceHeartbeat,
    Unregister,
    decode_ack,
)
from substreams.acker.protocol import (
    Evict as EvictMessage,
)
from substreams.acker.state import AckerState, Blocker, Hold, SessionKey, SourceSession
from substreams.acker.table import SegmentTable, Violation
from substreams.control.messages import (
    Completion,
    ControlBody,
    ControlRecord,
    FrontierSnapshot,
    OffsetRange,
    SourceEvicted,
    completion,
)
from substreams.control.notes import format_time
from substreams.control.progress import ProgressTracker
from substreams.errors import ProtocolError, SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.streams.deadletter import (
    REASON_MALFORMED,
    REASON_STALE,
    REASON_TERMINATED,
    REASON_UNKNOWN_SUBSTREAM,
    REASON_UNREGISTERED,
)

MAX_COMPLETIONS_PER_RECORD = 500
"""Times one ``EpochsComplete`` may announce.  Why bounded: a control record must stay well
under the broker's ``message.max.bytes`` (1 MiB) whatever the keys and ranges; 500 epochs
of a session substream with 100-byte keys and a few ranges each are ~100 KiB, and the
saving per record is already tiny at that size."""

DEPARTED_KEEP_MS = 600_000
"""How long a departed session stays in the state (rule 7): for operators, not for the rules."""

LIVENESS_EVERY_MS = 100
"""How often silence is judged (a session table walk): often enough next to any timeout."""

SILENT = "silent"
BLOCKER = "blocker"
UNSEALED = "unsealed"
OPERATOR = "operator"
EVICTION_CAUSES = (SILENT, BLOCKER, UNSEALED, OPERATOR)
"""Why a source was evicted, in one word (the ``reason`` label of
``substreams_source_evictions_total``): silent for the timeout, its open transaction held
an acks partition, it held a time unsealed for ``unsealed_timeout_ms``, an operator's
``Evict``.  The ``SourceEvicted`` record says more, in words."""


@dataclass(frozen=True)
class Refusal:
    """A message (or part of one) the core did not apply: the shell dead-letters it."""

    reason: str
    detail: str
    source: str | None


@dataclass(frozen=True)
class Evict:
    """Effect: fence ``writer`` (if any), then tell :meth:`AckerCore.fenced` the acks
    partition's high watermark (``read_uncommitted``) asked after it."""

    key: SessionKey
    writer: str
    reason: str
    cause: str
    """One of :data:`EVICTION_CAUSES`."""


@dataclass(frozen=True)
class Fence:
    """Effect: fence ``writer``, a transaction's writer the core has no session of."""

    writer: str
    why: str


@dataclass
class Effects:
    """What a :meth:`AckerCore.tick` (and the messages applied before it) asks of the shell."""

    records: list[tuple[str, ControlBody]] = field(default_factory=list)
    """Control records, (topic, body), for the next transaction (with the checkpoint)."""
    evict: list[Evict] = field(default_factory=list)
    fence: list[Fence] = field(default_factory=list)
    notified: list[tuple[str, list[int]]] = field(default_factory=list)
    """Per substream that notified, each time's ``sealed_at_ms`` (for the latency metric)."""
    evicted: list[tuple[SessionKey, str, str]] = field(default_factory=list)
    """Evictions that took effect: (source, acks partition), reason, cause
    (:data:`EVICTION_CAUSES`)."""
    warnings: list[str] = field(default_factory=list)
    """What an operator should read in the log."""

    def __bool__(self) -> bool:
        return bool(self.records or self.evict or self.fence or self.warnings)


class AckerCore:
    """The rules of one acker (or acker shard); see the module doc.

    Invariants: ``state.acks_offsets[p]`` is one past the last message of partition ``p``
    applied; ``evicting[k]`` holds the sessions whose eviction began, with the offset to read
    up to (None until :meth:`fenced`); a session in ``evicting`` is not ``evicted``."""

    reintroduced: frozenset[str] = frozenset()
    """Bugs put back on purpose, by name: the deterministic simulator's switches
    (``tests/sim``), set only by its tests to show that it finds each one; always empty
    otherwise.  Each is a one-line change in the rule it breaks, marked ``BUG SWITCH``:
    ``old_unregister`` (rule 4: another incarnation's Unregister applied to the current
    session), ``old_heartbeat`` (rule 4: another incarnation's heartbeat refreshes the
    current one), ``seq_not_reset`` (rule 3: a new incarnation inherits the old one's
    sequence number), ``clock_silence`` (liveness rule 2: silence judged on the clock, not
    the read horizon), ``evict_at_lso`` (liveness rule 6, in the shell: an eviction reads
    only up to the last stable offset after the fence), ``evicted_driver`` (liveness rule 3:
    a source registered as never evicted for silence is evicted for it),
    ``key_seal_every_key`` (rule 5: a seal of one key's time ``Keyed(k, t)`` also seals
    every other key up to ``t``, as a keyed seal would)."""

    def __init__(
        self,
        name: str,
        partitions: Iterable[int],
        home: Mapping[str, int],
        control_topics: Mapping[str, str],
        *,
        acks_partitions: int,
        source_timeout_ms: int,
        heartbeat_ms: int,
        unsealed_timeout_ms: int | None = None,
        state: AckerState | None = None,
    ) -> None:
        self.name = name
        self.partitions = tuple(partitions)
        self.home = dict(home)
        """Every acker substream's acks partition (this core's and the others')."""
        self.control_topics = dict(control_topics)
        self.acks_partitions = acks_partitions
        self.heartbeat_ms = heartbeat_ms
        self.state = state or AckerState()
        self.live = Liveness(source_timeout_ms)
        self.holds = Holds(unsealed_timeout_ms)
        self._holds_every_ms = holds_every_ms(unsealed_timeout_ms)
        self._last_held_ms: int | None = None
        self._unsealed_warned: set[Hold] = set()
        self.evicting: dict[SessionKey, tuple[int | None, str, str]] = {}
        self.duplicates = 0
        self.stale = 0
        self.evictions = 0
        self.notifications = 0
        self._pending = Effects()
        self._kept_warned: set[SessionKey] = set()
        self._last_step_ms = 0
        self._last_judged_ms: int | None = None
        self._last_pruned_ms = 0
        self._probe_every_ms = probe_interval_ms(source_timeout_ms)
        self._last_probe_ms: int | None = None
        self._last_write_ms: int | None = None

    # -- life cycle ----------------------------------------------------------------------

    def started(self, now: int) -> None:
        """The shell (re)started at ``now``: an acker's own downtime evicts no one."""
        for session in self.state.sessions.values():
            session.last_seen_ms = now
        self._last_step_ms = now
        self._last_write_ms = None  # a (re)started acker heartbeats at once

    # -- the shell's timers (rule 10) -------------------------------------------------

    def heartbeat_due(self, now: int) -> bool:
        """Whether this step commits a transaction even with nothing to notify (rule 10)."""
        return self._last_write_ms is None or now - self._last_write_ms >= self.heartbeat_ms

    def committed(self, now: int) -> None:
        """The shell committed a transaction (with a checkpoint) at ``now``."""
        self._last_write_ms = now

    def probe_due(self, now: int) -> bool:
        """Whether to ask the broker the acks partitions' ends now (rule 10); True counts as
        the probe (one that fails waits for the next, like one that answered)."""
        if self._last_probe_ms is not None and now - self._last_probe_ms < self._probe_every_ms:
            return False
        self._last_probe_ms = now
        return True

    # -- messages ------------------------------------------------------------------------

    def apply(
        self, partition: int, offset: int, value: bytes,
        headers: Iterable[tuple[str, bytes]] | None, now: int,
    ) -> list[Refusal]:
        """Apply the acks message at ``offset`` of ``partition``; what of it was refused."""
        self.state.acks_offsets[partition] = offset + 1
        try:
            ack = decode_ack(value, headers)
        except ProtocolError as exc:
            return [Refusal(REASON_MALFORMED, str(exc), None)]
        body = ack.body
        if isinstance(body, EvictMessage):  # an operator's order, not a source's message
            return self._operator_evict(ack.source, body, partition)
        skey = (ack.source, partition)
        session = self.state.sessions.get(skey)
        if isinstance(body, SourceHeartbeat):  # sent outside transactions: no sequence
            self._heartbeat(session, ack.incarnation, now)
            return []
        problems: list[tuple[str, str]] = []
        if isinstance(body, Register) and (
            session is None or session.incarnation != ack.incarnation
        ):
            self._new_session(ack, body, partition, session, now, problems)
        elif session is None:
            problems.append((REASON_UNREGISTERED, f"source '{ack.source}' is not registered"))
        elif self._is_stale(ack, session):
            self.stale += 1
            problems.append((
                REASON_STALE,
                f"message of incarnation {ack.incarnation!r} of source '{ack.source}', "
                f"whose current incarnation is {session.incarnation!r}"
                + (" (evicted)" if session.evicted else ""),
            ))
        elif ack.seq <= session.seq:  # rule 3: applied before the last checkpoint
            self.duplicates += 1
            return []
        else:
            self._in_session(ack, session, partition, now, problems)
        if not problems:
            return []
        return [Refusal(problems[0][0], "; ".join(p[1] for p in problems), ack.source)]

    def _operator_evict(
        self, sender: str, body: EvictMessage, partition: int
    ) -> list[Refusal]:
        """Rule 6, an operator's ``Evict`` (sent to every acks partition): begin the
        eviction where the source is a live SOURCE; elsewhere it is nothing to do."""
        key = (body.source, partition)
        if self._begin_eviction(key, f"evicted by hand: {body.reason}", OPERATOR):
            return []
        if key in self.evicting or (
            key in self.state.sessions and self.state.sessions[key].evicted
        ):
            return []  # already on its way out here
        if self.acks_partitions == 1:
            return [Refusal(REASON_UNREGISTERED,
                            f"cannot evict '{body.source}': not a live registered source",
                            sender)]
        # the order goes to every partition; this one's segments lack the source
        self._pending.warnings.append(
            f"nothing to evict for '{body.source}' on acks partition {partition}"
        )
        return []

    def _heartbeat(self, session: SourceSession | None, incarnation: str, now: int) -> None:
        """Rule 4: a heartbeat of the current incarnation refreshes liveness; any other is
        counted stale and dropped."""
        if session is not None and (
            session.incarnation == incarnation
            or "old_heartbeat" in self.reintroduced  # BUG SWITCH (rule 4)
        ):
            session.last_seen_ms = now
        else:
            self.stale += 1

    def _new_session(
        self, ack: AckMessage, body: Register, partition: int, old: SourceSession | None,
        now: int, problems: list[tuple[str, str]],
    ) -> None:
        """Rule 2: a Register of another incarnation starts a new session (and drops an
        eviction in progress of the old one)."""
        seq = ack.seq
        if old is not None and "seq_not_reset" in self.reintroduced:
            seq = max(seq, old.seq)  # BUG SWITCH (rule 3)
        skey = (ack.source, partition)
        self.state.sessions[skey] = SourceSession(
            ack.incarnation, seq, now, body.writer, evict_when_silent=body.evict_when_silent,
        )
        self.evicting.pop(skey, None)  # a new incarnation: nothing to evict
        self._membership(ack.source, body, partition, problems)

    def _is_stale(self, ack: AckMessage, session: SourceSession) -> bool:
        """Rule 4: a message of another incarnation than the session's, or of an evicted
        one."""
        return (session.incarnation != ack.incarnation and not (
            "old_unregister" in self.reintroduced  # BUG SWITCH (rule 4)
            and isinstance(ack.body, Unregister)
        )) or session.evicted

    def _in_session(
        self, ack: AckMessage, session: SourceSession, partition: int, now: int,
        problems: list[tuple[str, str]],
    ) -> None:
        """Rules 3 and 5: a new message of the current incarnation moves the session on and
        applies (membership, reports and seals)."""
        session.seq = ack.seq
        session.last_seen_ms = now
        body = ack.body
        if isinstance(body, Register | Unregister):  # joins more substreams / leaves
            self._membership(ack.source, body, partition, problems)
        elif isinstance(body, AckReport):
            self._apply_report(ack.source, body, partition, now, problems)

    def _segment(
        self, sub: str, partition: int, problems: list[tuple[str, str]]
    ) -> SegmentTable | None:
        """The table of segment ``sub`` if its messages belong on acks ``partition``."""
        table = self.state.tables.get(sub)
        if table is None:
            problems.append((REASON_UNKNOWN_SUBSTREAM, f"unknown substream '{sub}'"))
            return None
        if self.home[sub] != partition:
            problems.append((
                REASON_UNKNOWN_SUBSTREAM,
                f"substream '{sub}' belongs to acks partition {self.home[sub]}, not "
                f"{partition} (is acker.acks_partitions the same everywhere?)",
            ))
            return None
        return table

    def _membership(
        self, source: str, body: Register | Unregister, partition: int,
        problems: list[tuple[str, str]],
    ) -> None:
        for sub in body.substreams:
            table = self._segment(sub, partition, problems)
            if table is None:
                pass
            elif isinstance(body, Register):
                table.register(source, body.role)
            else:
                table.unregister(source)

    def _table_for(
        self, source: str, sub: str, partition: int, problems: list[tuple[str, str]]
    ) -> SegmentTable | None:
        table = self._segment(sub, partition, problems)
        if table is None:
            return None
        if not table.is_registered(source):
            problems.append(
                (REASON_UNREGISTERED, f"source '{source}' is not registered for substream '{sub}'")
            )
            return None
        return table

    def _apply_report(
        self, source: str, body: AckReport, partition: int, now: int,
        problems: list[tuple[str, str]],
    ) -> None:
        trackers = self.state.trackers
        # A message's entries share a few substreams: each one's table is looked up and
        # checked once (a refusal is not kept, so every refused entry still says why).
        tables: dict[str, SegmentTable] = {}
        for e in body.entries:
            table = tables.get(e.substream)
            if table is None:
                table = self._table_for(source, e.substream, partition, problems)
                if table is None:
                    continue
                tables[e.substream] = table
            try:
                apply_entry(table, trackers[e.substream], e.time, e.xor, e.records, e.reports,
                            e.ranges, now)
            except Violation as v:
                problems.append((REASON_TERMINATED, v.reason))
        for block in body.columns:
            table = self._table_for(source, block.substream, partition, problems)
            if table is None:
                continue
            columns = block.unpack()  # the shape check: a malformed block applies nothing
            if isinstance(columns, str):
                problems.append((REASON_MALFORMED, columns))
                continue
            refused = apply_block(table, trackers[block.substream], columns, now)
            problems.extend((REASON_TERMINATED, v.reason) for v in refused)
        for s in body.seals:
            table = tables.get(s.substream)
            if table is None:
                table = self._table_for(source, s.substream, partition, problems)
                if table is None:
                    continue
            try:
                if s.all_keys:
                    if type(s.time) is not int:
                        raise Violation(f"keyed seal with a non-integer time {s.time!r}")
                    table.seal_keys(source, s.time, s.sealed_at_ms)
                else:
                    if table.seal(source, s.time, s.sealed_at_ms, now):
                        trackers[s.substream].activate(s.time)
                    if "key_seal_every_key" in self.reintroduced and isinstance(
                        s.time, Keyed
                    ) and type(s.time.time) is int:  # BUG SWITCH (rule 5)
                        table.seal_keys(source, s.time.time, s.sealed_at_ms)
            except Violation as v:
                problems.append((REASON_UNREGISTERED, v.reason))

    # -- liveness ------------------------------------------------------------------------

    def probed(self, partition: int, now: int, position: int, lso: int, high: int) -> None:
        """Liveness rules 2 and 4: a probe of the partition's ends."""
        self.live.probed(partition, now, position, lso, high)

    def to_name(self, now: int) -> list[Blocker]:
        """Blockers whose first message the shell should read (then :meth:`named`)."""
        return self.live.to_name(now)

    def named(self, blocker: Blocker, source: str | None, incarnation: str | None,
              writer: str | None) -> Blocker:
        """What the blocker's first message said of its writer.  A message that does not
        name its writer (not a Register) is matched to the session of that incarnation."""
        if writer is None and source is not None:
            session = self.state.sessions.get((source, blocker.partition))
            if session is not None and session.incarnation == incarnation:
                writer = session.writer or None
        return self.live.named(blocker, source, incarnation, writer)

    def named_record(
        self, blocker: Blocker, value: bytes | None, headers: Iterable[tuple[str, bytes]] | None
    ) -> Blocker:
        """:meth:`named` from the blocker's first message as read (``value`` None: there
        was none to read): a Register names its writer, any other ack its source and
        incarnation, an undecodable one nothing."""
        source = incarnation = writer = None
        if value is not None:
            try:
                ack = decode_ack(value, headers)
            except ProtocolError:
                pass
            else:
                source, incarnation = ack.source, ack.incarnation
                if isinstance(ack.body, Register):
                    writer = ack.body.writer or None
        return self.named(blocker, source, incarnation, writer)

    def fenced(self, key: SessionKey, high: int) -> None:
        """The shell fenced the writer of an :class:`Evict` and read the partition's high
        watermark after it: the eviction takes effect once read up to there (rule 6)."""
        if key in self.evicting:
            _, reason, cause = self.evicting[key]
            self.evicting[key] = (high, reason, cause)

    def _tables_of(self, partition: int) -> list[tuple[str, SegmentTable]]:
        return [(s, t) for s, t in self.state.tables.items() if self.home.get(s) == partition]

    def _begin_eviction(self, key: SessionKey, reason: str, cause: str) -> bool:
        """Rule 6's first half; False if ``key`` is not a live SOURCE of a segment of its
        partition (or is on its way out already)."""
        source, partition = key
        session = self.state.sessions.get(key)
        if session is None or session.evicted or key in self.evicting:
            return False
        if not any(t.is_active_source(source) for _, t in self._tables_of(partition)):
            return False
        self.evicting[key] = (None, reason, cause)
        self._pending.evict.append(Evict(key, session.writer, reason, cause))
        return True

    def _finish_eviction(self, key: SessionKey, reason: str, cause: str) -> None:
        source, partition = key
        session = self.state.sessions[key]
        session.evicted = True
        self.evictions += 1
        for sub, table in self._tables_of(partition):
            if not table.is_active_source(source):
                continue
            table.unregister(source)
            self._pending.records.append((
                self.control_topics[sub],
                SourceEvicted(sub, source, session.incarnation, session.last_seen_ms, reason),
            ))
        self._pending.evicted.append((key, reason, cause))

    def _judge(self, now: int) -> None:
        """Liveness rules 3 and 5, at most every :data:`LIVENESS_EVERY_MS`."""
        if self._last_judged_ms is not None and now - self._last_judged_ms < LIVENESS_EVERY_MS:
            return
        self._last_judged_ms = now
        if "clock_silence" in self.reintroduced:  # BUG SWITCH (liveness rule 2)
            self.live.horizon = dict.fromkeys(self.partitions, now)
        silent: set[SessionKey] = set()
        for decision in self.live.decide(self.state.sessions, now, set(self.evicting)):
            if isinstance(decision, Silent):
                silent.add(decision.key)
                self._silent(decision)
            else:
                self._silent_blocker(decision)
        self._kept_warned &= silent  # heard again: warn at the next silence

    def _silent(self, decision: Silent) -> None:
        key = decision.key
        if decision.evict or "evicted_driver" in self.reintroduced:  # BUG SWITCH (liveness 3)
            self._begin_eviction(key, f"silent for {decision.silence_ms} ms", SILENT)
        elif key not in self._kept_warned:
            self._kept_warned.add(key)
            self._pending.warnings.append(
                f"source '{key[0]}' (acks partition {key[1]}) silent for "
                f"{decision.silence_ms} ms; not evicted: it registered as never evicted for "
                "silence (a Spark query's driver), so its substreams wait for it; if it is "
                f"gone for good: substreams acker evict-source {key[0]}"
            )

    def _judge_holds(self, now: int) -> None:
        """Rule 9, at most every :func:`holds_every_ms`."""
        if self._last_held_ms is not None and now - self._last_held_ms < self._holds_every_ms:
            return
        self._last_held_ms = now
        self.state.holds = self.holds.update(self.state.tables, now)
        overdue: set[Hold] = set()
        for hold, held_ms in self.holds.overdue(self.live.horizon, self.home):
            key = (hold.source, self.home[hold.substream])
            session = self.state.sessions.get(key)
            if session is None or session.evicted or key in self.evicting:
                continue
            what = (f"held {hold.substream} time {format_time(hold.time)} unsealed for "
                    f"{held_ms} ms (acker.unsealed_timeout_ms: {self.holds.timeout_ms})")
            if session.evict_when_silent:
                self._begin_eviction(key, what, UNSEALED)
                continue
            overdue.add(hold)
            if hold not in self._unsealed_warned:
                self._pending.warnings.append(
                    f"source '{hold.source}' {what}; not evicted: it registered as never "
                    "evicted automatically (a Spark query's driver), so its substreams wait "
                    f"for its seals; if it is gone for good: substreams acker evict-source "
                    f"{hold.source}"
                )
        self._unsealed_warned = overdue

    def _silent_blocker(self, decision: SilentBlocker) -> None:
        blocker = decision.blocker
        held = f"{blocker.describe()} for over {self.live.timeout_ms} ms"
        if decision.key is not None:
            session = self.state.sessions[decision.key]
            if session.incarnation == blocker.incarnation:
                reason = f"its open transaction held {held}"
            else:
                reason = (f"superseded: incarnation {blocker.incarnation} took its writer and "
                          f"its first transaction held {held}")
            self._begin_eviction(decision.key, reason, BLOCKER)
            if decision.writer is not None and decision.writer != session.writer:
                self._pending.fence.append(Fence(decision.writer, f"{held}; fencing its writer"))
        elif decision.writer is not None:
            self._pending.fence.append(Fence(
                decision.writer, f"{held}; fencing its writer (no session of it to evict)"
            ))
        else:
            self._pending.warnings.append(
                f"{held}; not ours to fence (or never evicted for silence): waited out, no "
                "source is evicted for the silence it causes"
            )

    # -- invariants ----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise :class:`AssertionError` naming the first broken rule or invariant of the
        state (rules 1, 2, 6, 8 and the class doc), then check every table's, the liveness
        and the holds'.  Pure and O(state): the simulator calls it after every step; the
        service never does."""
        state, name = self.state, self.name
        owned = set(self.partitions)
        for p in state.acks_offsets:
            if p not in owned:
                raise AssertionError(f"{name}: acks offset kept for partition {p}, which it "
                                     f"does not own ({sorted(owned)})")
        for sub in state.tables:  # rule 1
            if self.home.get(sub) not in owned:
                raise AssertionError(f"{name}: holds the table of '{sub}', whose home acks "
                                     f"partition {self.home.get(sub)} is not one of its "
                                     f"{sorted(owned)}")
            if sub not in state.trackers:
                raise AssertionError(f"{name}: table '{sub}' has no progress tracker")
        for sub in state.last_notification:
            if sub not in state.tables:
                raise AssertionError(f"{name}: last notification of '{sub}', which it has "
                                     "no table of")
        for (source, p), session in state.sessions.items():  # rules 2 and 6
            if p not in owned:
                raise AssertionError(f"{name}: session of '{source}' on acks partition {p}, "
                                     "which it does not own")
            if session.evicted:
                for sub, table in self._tables_of(p):
                    if table.is_active_source(source):
                        raise AssertionError(
                            f"{name}: source '{source}' (incarnation {session.incarnation}) "
                            f"was evicted on acks partition {p}, yet is still a registered "
                            f"SOURCE of '{sub}' (rule 6)")
        for key, (upto, _, cause) in self.evicting.items():  # the class doc
            evicted = state.sessions.get(key)
            if evicted is None:
                raise AssertionError(f"{name}: evicting {key!r}, which has no session")
            if evicted.evicted:
                raise AssertionError(f"{name}: evicting {key!r}, whose session is evicted "
                                     "already")
            if cause not in EVICTION_CAUSES:
                raise AssertionError(f"{name}: evicting {key!r} for cause {cause!r}, not one "
                                     f"of {EVICTION_CAUSES}")
            if upto is not None and upto < 0:
                raise AssertionError(f"{name}: evicting {key!r} up to offset {upto}")
        for table in state.tables.values():
            table.check_invariants()
        self.live.check_invariants()
        self.holds.check_invariants(state.tables)

    # -- one step ------------------------------------------------------------------------

    def tick(self, now: int, positions: Mapping[int, int]) -> Effects:
        """After the step's messages: liveness (given how far each partition was read),
        evictions that took effect, terminations.  Returns every effect since the last."""
        stall = excuse_stall(self.state.sessions, self._last_step_ms, now, self.heartbeat_ms)
        self.holds.excuse(stall)
        self._last_step_ms = now
        for p, at in positions.items():
            self.live.advance(p, at)
        self._judge(now)
        self._judge_holds(now)
        for key, (upto, reason, cause) in list(self.evicting.items()):
            if upto is not None and positions[key[1]] >= upto:
                del self.evicting[key]
                self._finish_eviction(key, reason, cause)
        self._terminations(now)
        if now - self._last_pruned_ms >= DEPARTED_KEEP_MS // 60:
            self._last_pruned_ms = now
            self._prune(now)
        self.state.blockers = list(self.live.blockers.values())
        effects, self._pending = self._pending, Effects()
        return effects

    def _prune(self, now: int) -> None:
        """Rule 7: forget the sessions departed for :data:`DEPARTED_KEEP_MS`."""
        for key, session in list(self.state.sessions.items()):
            if key in self.evicting or now - session.last_seen_ms <= DEPARTED_KEEP_MS:
                continue
            if session.evicted or not any(
                t.is_registered(key[0]) for _, t in self._tables_of(key[1])
            ):
                del self.state.sessions[key]

    def _terminations(self, now: int) -> None:
        """Rule 8: per substream, what terminated now, in runs of at most
        ``MAX_COMPLETIONS_PER_RECORD`` times per record."""
        for sub, table in self.state.tables.items():
            tracker = self.state.trackers[sub]
            bodies, sealed_at, last = announce(table, tracker, now)
            if last is None:
                continue
            topic = self.control_topics[sub]
            self._pending.records.extend((topic, body) for body in bodies)
            self._pending.notified.append((sub, sealed_at))
            self.state.last_notification[sub] = (last, now)
            self.notifications += len(sealed_at)
            tracker.prune_keyed(table.keyed_floor())

    def heartbeat_records(self) -> list[tuple[str, ControlBody]]:
        """Every substream's pending lower-frontier update (written with the heartbeat)."""
        out: list[tuple[str, ControlBody]] = []
        for sub, tracker in self.state.trackers.items():
            update = tracker.pending_update()
            if update is not None:
                out.append((self.control_topics[sub], update))
        return out


def apply_entry(
    table: SegmentTable, tracker: ProgressTracker, t: Time, xor: int, records: int,
    reports: int, ranges: Iterable[OffsetRange], now: int,
) -> None:
    """Apply one report entry to ``table`` and what it changed to ``tracker``: a newly open
    time is activated; in a session table, a time that joined a run moves only the upper
    frontier, and a run whose first time moved or that merged into another is followed
    (:meth:`ProgressTracker.rekey`: the tracker counts a run by its first time).  Raises
    :class:`Violation` as :meth:`SegmentTable.report` does."""
    if table.report(t, xor, records, reports, ranges, now):
        tracker.activate(t)
    elif table.runs:
        tracker.observe(t)
    if table.rekeyed:
        for old, new in table.drain_rekeyed():
            tracker.rekey(old, new)


def apply_block(
    table: SegmentTable, tracker: ProgressTracker, columns: Columns, now: int
) -> list[Violation]:
    """Apply a block's checked columns (:meth:`AckBlock.unpack`): the table's entries, the
    tracker's newly active times; the refused entries' violations."""
    new, refused = table.report_block(*columns, now)
    tracker.activate_many(new)
    return refused


def announce(
    table: SegmentTable, tracker: ProgressTracker, now: int
) -> tuple[list[ControlBody], list[int], Time | None]:
    """What terminated in ``table`` now, as control bodies (``tracker`` retires it): the
    bodies, each time's ``sealed_at_ms`` (for the latency metric; one per time, in order) and
    the last time announced (None: nothing terminated).  A module function, so that the
    benchmark times exactly what the service runs (``substreams bench acker``)."""
    run, entries, terms = table.termination_runs()
    if not run and not terms:
        return [], [], None
    # One Completion per time is the wire form; the int run's are built straight from the
    # table's entries (no Termination), and a chunk of them is retired as a run.
    done: list[tuple[Completion, tuple[Time, ...]]] = [
        (completion(t, e.offset_ranges(), e.records, e.sealed_at_ms or now), ())
        for t, e in zip(run, entries, strict=True)
    ]
    done.extend(
        (Completion(term.time, term.ranges, term.records, term.sealed_at_ms or now,
                    term.until), term.members)
        for term in terms
    )
    out: list[ControlBody] = []
    for at in range(0, len(done), MAX_COMPLETIONS_PER_RECORD):
        chunk = done[at:at + MAX_COMPLETIONS_PER_RECORD]
        if at + len(chunk) <= len(run):
            bodies = tracker.complete_run([c for c, _ in chunk])
        else:
            bodies = tracker.complete_many(chunk)
        for body in bodies:
            if isinstance(body, FrontierSnapshot):  # with the open times' starts
                out.append(tracker.snapshot(_open_starts(table)))
            else:
                out.append(body)
    sealed_at = [e.sealed_at_ms for e in entries]
    sealed_at.extend(term.sealed_at_ms for term in terms)
    return out, sealed_at, (terms[-1].time if terms else run[-1])


def _open_starts(table: SegmentTable) -> dict[tuple[str, int], int]:
    """Per data partition, the earliest offset of a record of a still-open time."""
    return table.open_starts()


# -- start-up and shards (rules 11 and 12): the shell's decisions, as values ----------------

Recovery = Literal["resume", "empty", "take_over"]


def retired_error(name: str, state: AckerState) -> SubstreamsError:
    """Why acker ``name``, whose checkpoint ``state`` is marked retired, may not serve."""
    retired = state.retired or {}
    return SubstreamsError(
        f"acker '{name}' was retired: its acks partitions were handed over to a "
        f"{retired.get('to_shards', '?')}-shard layout (by '{retired.get('by', '?')}'); start "
        "the shards of that layout instead (or this one again with --from-shards)"
    )


def recovery(
    name: str, own: AckerState | None, partitions: Iterable[int], from_shards: int | None,
    owner: str = "this shard",
) -> Recovery:
    """Rule 11: what a starting acker does with the state of its own latest checkpoint
    (``own``; None: it has none): take its partitions over from the ``from_shards`` layout,
    start empty, or resume ``own``.  Raises for a retired checkpoint not to be taken over,
    and for one holding partitions that ``owner`` does not own."""
    if from_shards is not None and (own is None or own.retired is not None):
        return "take_over"
    if own is None:
        return "empty"
    if own.retired is not None:
        raise retired_error(name, own)
    foreign = set(own.acks_offsets) - set(partitions)
    if foreign:
        raise SubstreamsError(
            f"acker '{name}': its checkpoint holds acks partitions {sorted(foreign)} that "
            f"{owner} does not own (did acks_partitions change?)"
        )
    return "resume"


def start_offsets(offsets: dict[int, int], lows: Mapping[int, int], topic: str) -> None:
    """Rule 11: where each acks partition is read from, given its log start (``lows``):
    ``offsets`` (the checkpoint's) gains the log start of every partition never read, and a
    checkpointed offset below the log start is refused -- retention removed acks this acker
    never applied, so an epoch they belonged to may never close (or, had both halves of a
    record's SND/RCV pair gone, close without it): not silently skipped."""
    for p, low in lows.items():
        if p not in offsets:
            offsets[p] = max(0, low)
        elif offsets[p] < low:
            raise SubstreamsError(
                f"acks topic '{topic}' partition {p} starts at offset {low}, past the acker's "
                f"checkpointed position {offsets[p]}: acks were deleted by retention before "
                "the acker read them; raise the acks topic's retention.ms"
            )


def predecessors(
    name: str, partitions: Iterable[int], from_shards: int, shard_name: Callable[[int], str]
) -> dict[str, set[int]]:
    """Rule 12: per acker of the ``from_shards`` layout (``shard_name(i)``: shard ``i``'s
    name), the partitions of ``partitions`` it owned.  Refuses a layout naming ``name``
    itself (the same layout: nothing to take over)."""
    preds: dict[str, set[int]] = {}
    for p in partitions:
        preds.setdefault(shard_name(p % from_shards), set()).add(p)
    if name in preds:
        raise SubstreamsError(
            f"acker '{name}': --from-shards {from_shards} names this same layout"
        )
    return preds


def check_retirable(pred: str, state: AckerState, shards: int) -> None:
    """Rule 12: predecessor ``pred`` (its latest checkpoint's ``state``) may be retired to
    a ``shards``-shard layout unless it was retired to another one already."""
    if state.retired is not None and state.retired.get("to_shards") != shards:
        raise retired_error(pred, state)


def superseded(records: Iterable[ControlRecord], name: str, next_seq: int) -> bool:
    """After a failed commit: did another acker of ``name`` take over?  It did if the
    checkpoint topic holds a record of that writer name at or past ``next_seq``, the
    sequence number this process would have written next (the newcomer heartbeats there)."""
    return any(rec.writer == name and rec.seq >= next_seq for rec in records)
