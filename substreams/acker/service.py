"""The acker service: applies acks, decides terminations, writes notifications exactly once.

Loop (:meth:`AckerService.step`): take whatever acks are buffered (up to ``max_batch``; wait
up to ``timeout`` only when none are), apply them to the segment tables, and write every
resulting control record — per substream one ``EpochComplete`` for a terminated time, or one
``EpochsComplete`` for a run of them (lower-frontier changes ride inside), periodic
``FrontierSnapshot``s — in ONE Kafka transaction together with a ``Checkpoint`` (acks
offsets + the serialized :class:`AckerState`). Steps that terminate nothing write nothing,
except every ``heartbeat_ms``: a ``WriterHeartbeat``, pending ``FrontierUpdate``s and a
fresh checkpoint (bounding replay after a crash).

Where checkpoints go: a dedicated control topic per acker, ``<control prefix>__acker.<name>``
(created at start), so subscribers of a substream never read state blobs and recovery finds
the latest checkpoint in one place.  Heartbeats go there too; a ``--standby`` acker tails it
and takes over when they stop for ``standby_timeout_ms``.

Exactly once: the transactional id is ``substreams.acker.<name>``.  Start-up initialises it
(fencing any zombie with the same name: its next write fails and it stops with
:class:`AckerFencedError`), continues the hash chains (:meth:`ControlWriter.recover`),
loads the latest checkpoint and seeks the acks topic to its offsets.  Every notification
was committed atomically with the checkpoint that accounts for it, so nothing is lost,
duplicated or reordered; acks applied after the last checkpoint are simply replayed.

Acks are read with ``assign()`` from stored offsets (never a consumer group).  Messages the
acker cannot apply go to the dead-letter topic (:mod:`substreams.acker.deadletter`) and the
acker keeps running.  ``command_handler`` (set by the command protocol) is called once per
step with the service; the ``(topic, value)`` pairs it returns are produced as plain
(non-transactional) messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_END, KafkaException, Message, TopicPartition

from substreams import metrics
from substreams.acker.agent import (
    AckReport,
    Evict,
    Register,
    SourceHeartbeat,
    Unregister,
    acks_partition,
    decode_ack,
)
from substreams.acker.deadletter import (
    REASON_MALFORMED,
    REASON_STALE,
    REASON_TERMINATED,
    REASON_UNKNOWN_SUBSTREAM,
    REASON_UNREGISTERED,
    DeadLetter,
    DeadLetterWriter,
)
from substreams.acker.state import AckerState, AckerView, SourceSession
from substreams.acker.table import Segment, SegmentTable, Violation, acker_segments
from substreams.config import Config
from substreams.control.io import ControlTail, ControlWriter, Corrupt, find_last, read_control
from substreams.control.messages import (
    Checkpoint,
    Completion,
    ControlBody,
    ControlRecord,
    FrontierSnapshot,
    SourceEvicted,
    WriterHeartbeat,
)
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.errors import ProtocolError, PublisherFencedError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics

CommandHandler = Callable[["AckerService"], list[tuple[str, bytes]]]

MAX_COMPLETIONS_PER_RECORD = 500
"""Times one ``EpochsComplete`` may announce.  Why bounded: a control record must stay well
under the broker's ``message.max.bytes`` (1 MiB) whatever the keys and ranges; 500 epochs
of a session substream with 100-byte keys and a few ranges each are ~100 KiB, and the
saving per record is already ~99 % at that size."""

log = logging.getLogger(__name__)


def fence(bootstrap: str, config: Config, writer: str) -> None:
    """Fence the transactional id ``writer``: its current producer's open transaction is
    aborted and its next transactional call fails (Kafka's producer epoch bump)."""
    producer = client.producer(bootstrap, config, transactional_id=writer)
    producer.init_transactions(30)
    producer.flush(1)



class AckerFencedError(PublisherFencedError):
    """Another acker with the same name took over; this one must stop."""


def checkpoint_topic(config: Config, name: str | None = None) -> str:
    """The acker's own control topic: checkpoints and heartbeats."""
    return config.acker.checkpoint_topic(name)


def latest_state(
    config: Config, bootstrap: str | None = None, name: str | None = None
) -> tuple[AckerState, int] | None:
    """The state in the latest checkpoint of acker ``name`` and when it was written."""

    name = name or config.acker.name
    server = client.resolve_bootstrap(config, bootstrap)
    found = latest_checkpoint(server, config, name)
    if found is None:
        return None
    _, rec = found
    assert isinstance(rec.body, Checkpoint)
    body = rec.body
    state = AckerState.loads(body.state, dict(body.acks_offsets), config.acker.snapshot_every)
    return state, rec.written_at_ms


def is_checkpoint_of(name: str) -> Callable[[ControlRecord], bool]:
    return lambda rec: rec.writer == name and isinstance(rec.body, Checkpoint)


def latest_checkpoint(
    bootstrap: str,
    config: Config,
    name: str,
    last: tuple[int, ControlRecord] | None = None,
) -> tuple[int, ControlRecord] | None:
    """The last Checkpoint written by acker ``name`` on its checkpoint topic, and its offset:
    read backwards from the topic's end (every transaction of the acker ends with one, so it
    is among the last records).  ``last``: the acker's last record there, if known (it is
    that checkpoint unless the acker wrote something after it)."""
    if last is not None and is_checkpoint_of(name)(last[1]):
        return last
    return find_last(bootstrap, checkpoint_topic(config, name), is_checkpoint_of(name), config)


def transactional_id(name: str) -> str:
    return f"substreams.acker.{name}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class AckerService:
    """One acker instance (``name`` defaults to ``config.acker.name``)."""

    def __init__(
        self,
        config: Config,
        bootstrap: str | None = None,
        name: str | None = None,
        *,
        standby: bool = False,
        max_batch: int = 5000,
    ) -> None:
        self.config = config
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.name = name or config.acker.name
        self.standby = standby
        self.max_batch = max_batch
        self.segments: dict[str, Segment] = acker_segments(config)
        self.control_topics = {s: config.acker.control_topic(s) for s in self.segments}
        self.checkpoint_topic = checkpoint_topic(config, self.name)
        self.acks_topic = config.acker.acks_topic
        self.state = AckerState()
        self.command_handler: CommandHandler | None = None
        self.dead_letters = 0
        self.duplicates = 0
        self.stale = 0
        self.evictions = 0
        self.recoveries = 0
        self._evicting: dict[str, tuple[int, int, str]] = {}
        """Sources being evicted: source -> (acks partition, offset to read up to, reason)."""
        self._evicted_items: list[tuple[str, ControlBody]] = []
        self._source_timeout_ms = config.acker.source_timeout_ms
        self._last_liveness = 0.0
        self._last_step_ms = 0
        self.notifications = 0
        self.started = False
        self.fenced = False
        self._writer: ControlWriter | None = None
        self._reader: Reader | None = None
        self._out: DeadLetterWriter | None = None
        self._last_write = float("-inf")
        self._heartbeat_s = config.acker.heartbeat_ms / 1000.0
        self._open_gauges = metrics.OpenTimes(self.name)
        self._gauges_due = metrics.Periodic(1.0)

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Take over the transactional id (fencing any zombie), recover and seek."""
        if self.started:
            return
        began = time.monotonic()
        log.info("acker '%s' starting: taking over transactional id '%s'", self.name,
                 transactional_id(self.name))
        ensure_topics(
            client.admin(self.bootstrap, self.config),
            [self.config.topic_spec(self.checkpoint_topic)],
        )
        topics = [*self.control_topics.values(), self.checkpoint_topic]
        try:
            self._writer = ControlWriter(
                self.bootstrap,
                self.name,
                topics,
                self.config,
                transactional_id=transactional_id(self.name),
            )
        except PublisherFencedError as exc:
            raise self._fenced() from exc
        heads = self._writer.recover_heads()
        found = latest_checkpoint(
            self.bootstrap, self.config, self.name, heads.get(self.checkpoint_topic)
        )
        every = self.config.acker.snapshot_every
        chains = ", ".join(
            f"{t}: {'genesis' if h is None else f'seq {h[1].seq} at offset {h[0]}'}"
            for t, h in heads.items()
        )
        if found is None:
            log.info("acker '%s' recovery: no checkpoint, empty state; chain heads: %s",
                     self.name, chains)
        else:
            at, rec = found
            assert isinstance(rec.body, Checkpoint)
            latest = rec.body
            self.state = AckerState.loads(latest.state, dict(latest.acks_offsets), every)
            metrics.RESTARTS.labels("acker", self.name).inc()
            log.info(
                "acker '%s' recovery: checkpoint #%d (%d bytes, offset %d of '%s', written at "
                "%d ms): %d open times, %d sources; chain heads: %s", self.name,
                self.state.checkpoints, len(latest.state), at, self.checkpoint_topic,
                rec.written_at_ms, sum(len(t.open) for t in self.state.tables.values()),
                len(self.state.sessions), chains,
            )
        for sub in self.segments:
            self.state.ensure(sub, every, self.config.substream(sub).gap_ms)
        start_ms = self._last_step_ms = _now_ms()
        for session in self.state.sessions.values():
            session.last_seen_ms = start_ms  # the acker's own downtime evicts no one
        self._out = DeadLetterWriter(self.config, self.bootstrap)
        self._reader = Reader(
            self.bootstrap, self.config, name=f"acker '{self.name}': acks topic"
        )
        for p in range(self.config.acker.acks_partitions):
            low, _ = self._reader.watermarks(self.acks_topic, p)
            if p not in self.state.acks_offsets:  # never read: the partition's start
                self.state.acks_offsets[p] = max(0, int(low))
            elif self.state.acks_offsets[p] < low:
                # Retention removed acks this acker never applied: the reports in them are
                # gone, so an epoch they belonged to may never close (or, had both halves of
                # a record's SND/RCV pair gone, close without it).  Not silently skipped.
                raise SubstreamsError(
                    f"acks topic '{self.acks_topic}' partition {p} starts at offset {low}, "
                    f"past the acker's checkpointed position {self.state.acks_offsets[p]}: "
                    "acks were deleted by retention before the acker read them; raise the "
                    "acks topic's retention.ms"
                )
        self._assign()
        self._last_write = float("-inf")
        self.started = True
        log.info(
            "acker '%s' started in %.3f s: reading acks topic '%s' from offsets %s",
            self.name, time.monotonic() - began, self.acks_topic,
            dict(sorted(self.state.acks_offsets.items())),
        )

    def _assign(self) -> None:
        """Point the acks consumer at the next expected offset of every partition."""
        assert self._reader is not None
        self._reader.assign(
            [
                TopicPartition(self.acks_topic, p, self.state.acks_offsets.get(p, 0))
                for p in range(self.config.acker.acks_partitions)
            ]
        )

    def wait_for_takeover(self, stop: threading.Event) -> bool:
        """Standby: follow the active acker's heartbeats; True once they stopped for
        ``standby_timeout_ms`` (False if ``stop`` was set first)."""
        timeout = self.config.acker.standby_timeout_ms / 1000.0
        ensure_topics(
            client.admin(self.bootstrap, self.config),
            [self.config.topic_spec(self.checkpoint_topic)],
        )
        # From the end: only heartbeats from now on tell whether the active acker lives
        # (reading the topic's history first would delay a take-over by its length).
        with ControlTail(self.bootstrap, self.checkpoint_topic, OFFSET_END, self.config) as tail:
            log.info("standby acker '%s': following the heartbeats on '%s' from its end "
                     "(taking over after %.1f s of silence)", self.name, self.checkpoint_topic,
                     timeout)
            last_seen = time.monotonic()
            while not stop.is_set():
                for _, rec in tail.poll(0.1):
                    if not isinstance(rec, Corrupt) and rec.writer == self.name:
                        last_seen = time.monotonic()
                silent = time.monotonic() - last_seen
                if silent > timeout:
                    log.warning("standby acker '%s': no heartbeat for %.1f s; taking over",
                                self.name, silent)
                    return True
        return False

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (as a standby: first wait to take over)."""
        if self.standby and not self.started and not self.wait_for_takeover(stop):
            return
        self.start()
        try:
            while not stop.is_set():
                try:
                    self.step(0.05)
                except KafkaException as exc:
                    # Not a fence (that is AckerFencedError): our own transaction was lost,
                    # e.g. the coordinator aborted it during a long outage and bumped the
                    # producer epoch.  Everything since the last checkpoint is replayed.
                    log.error(
                        "acker '%s': transaction failed (%s); recovering from the latest "
                        "checkpoint", self.name, exc,
                    )
                    self.recoveries += 1
                    if self._superseded(stop):
                        raise self._fenced() from exc
                    self.close()
                    self.state = AckerState()
                    self._evicting.clear()
                    self._evicted_items = []
                    self.start()
                    log.warning("acker '%s': rewound to its latest checkpoint; acks after it "
                                "are applied again", self.name)
        finally:
            self.close()
            log.info("acker '%s' stopped after %d notifications, %d dead letters",
                     self.name, self.notifications, self.dead_letters)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._out is not None:
            self._out.close()
            self._out = None
        if self._writer is not None:
            if not self.fenced:  # a fenced producer has nothing left to flush
                self._writer.close()
            self._writer = None
        self.started = False

    def _superseded(self, stop: threading.Event) -> bool:
        """After a failed commit: did another acker of this name take over?  Kafka 4 may
        answer the fenced party's EndTxn with an error librdkafka does not know instead of
        PRODUCER_FENCED; re-taking the transactional id then would fence the newcomer in
        turn.  So wait two heartbeats and look for checkpoint-topic records of this writer
        name that this process did not write (the newcomer heartbeats there)."""
        if self._writer is None:
            return False
        ours = self._writer.heads[self.checkpoint_topic].next_seq
        stop.wait(2 * self._heartbeat_s)
        try:
            records = read_control(self.bootstrap, self.checkpoint_topic, self.config)
        except (KafkaException, SubstreamsError):
            return False
        return any(rec.writer == self.name and rec.seq >= ours for _, rec in records)

    def _fenced(self) -> AckerFencedError:
        self.fenced = True
        return AckerFencedError(
            f"acker '{self.name}' was fenced: another acker with the same name (transactional "
            f"id '{transactional_id(self.name)}') took over; this one stops"
        )

    # -- one round -----------------------------------------------------------------------

    def step(self, timeout: float = 0.05) -> int:
        """Poll, apply, and commit one transaction if anything is to be written.  Returns
        how many ack messages were applied."""
        if not self.started:
            self.start()
        now = _now_ms()
        applied = 0
        assert self._reader is not None
        for msg in self._reader.poll_batch(timeout, self.max_batch):
            self.state.acks_offsets[msg.partition()] = msg.offset() + 1
            self._apply(msg, now)
            applied += 1
        self._excuse_own_stall(now)
        self._liveness(now)
        items = self._evicted_items + self._terminations(now)
        self._evicted_items = []
        if items or time.monotonic() - self._last_write >= self._heartbeat_s:
            self._commit(items, now)
        if self.command_handler is not None:
            out = self.command_handler(self)
            assert self._out is not None
            for topic, value in out:
                self._out.produce(topic, value)
        if self._gauges_due.due():
            self._export_gauges()
        return applied

    def _export_gauges(self) -> None:
        """Refresh the open-times and acks-lag gauges (from the loop: the tables are not
        safe to read from the scrape thread)."""
        for sub, table in self.state.tables.items():
            oldest = metrics.first_seen_min(e.first_seen_ms for e in table.open.values())
            self._open_gauges.update(sub, len(table.open), oldest)
        if self._reader is not None:
            metrics.record_lag("acker", self.name, self._reader.lag())

    def _apply(self, msg: Message, now: int) -> None:
        raw: bytes = msg.value() or b""
        try:
            ack = decode_ack(raw, msg.headers())
        except ProtocolError as exc:
            self._dead(msg, None, REASON_MALFORMED, str(exc))
            return
        body = ack.body
        problems: list[tuple[str, str]] = []
        if isinstance(body, Evict):  # an operator's order, not a source's message
            if not self._evict(body.source, f"evicted by hand: {body.reason}"):
                self._dead(msg, ack.source, REASON_UNREGISTERED,
                           f"cannot evict '{body.source}': not a live registered source")
            return
        session = self.state.sessions.get(ack.source)
        if isinstance(body, SourceHeartbeat):  # sent outside transactions: no sequence
            if session is not None and session.incarnation == ack.incarnation:
                session.last_seen_ms = now
            else:
                self.stale += 1
            return
        if isinstance(body, Register) and (
            session is None or session.incarnation != ack.incarnation
        ):
            # A new incarnation: everything the old one committed precedes this message in
            # the partition (its transactions were fenced by ours), the rest never will.
            self.state.sessions[ack.source] = SourceSession(
                ack.incarnation, ack.seq, now, body.writer
            )
            self._evicting.pop(ack.source, None)  # a new incarnation: nothing to evict
            self._membership(ack.source, body, problems)
        elif session is None:
            problems.append((REASON_UNREGISTERED, f"source '{ack.source}' is not registered"))
        elif session.incarnation != ack.incarnation or session.evicted:
            self.stale += 1
            problems.append(
                (
                    REASON_STALE,
                    f"message of incarnation {ack.incarnation!r} of source '{ack.source}', "
                    f"whose current incarnation is {session.incarnation!r}"
                    + (" (evicted)" if session.evicted else ""),
                )
            )
        elif ack.seq <= session.seq:
            self.duplicates += 1
            return
        else:
            session.seq = ack.seq
            session.last_seen_ms = now
            if isinstance(body, Register | Unregister):  # joins more substreams / leaves
                self._membership(ack.source, body, problems)
            elif isinstance(body, AckReport):
                self._apply_report(ack.source, body, now, problems)
        if problems:
            detail = "; ".join(p[1] for p in problems)
            self._dead(msg, ack.source, problems[0][0], detail)

    def _membership(
        self, source: str, body: Register | Unregister, problems: list[tuple[str, str]]
    ) -> None:
        for sub in body.substreams:
            table = self.state.tables.get(sub)
            if table is None:
                problems.append((REASON_UNKNOWN_SUBSTREAM, f"unknown substream '{sub}'"))
            elif isinstance(body, Register):
                table.register(source, body.role)
            else:
                table.unregister(source)

    # -- liveness ------------------------------------------------------------------------

    def _liveness(self, now: int) -> None:
        """Evict the sources silent for ``source_timeout_ms``; finish evictions whose acks
        were read up to the fence (checked at most every 100 ms)."""
        if time.monotonic() - self._last_liveness >= 0.1:
            self._last_liveness = time.monotonic()
            for source, session in list(self.state.sessions.items()):
                silent = now - session.last_seen_ms
                if silent > self._source_timeout_ms and source not in self._evicting:
                    self._evict(source, f"silent for {silent} ms")
        for source, (partition, upto, reason) in list(self._evicting.items()):
            assert self._reader is not None
            [pos] = self._reader.consumer.position([TopicPartition(self.acks_topic, partition)])
            if pos.offset >= upto:
                del self._evicting[source]
                self._finish_eviction(source, reason)

    def _excuse_own_stall(self, now: int) -> None:
        """Time the acker itself could not hear anyone (a broker outage blocks its commits
        and fetches; a long GC pause) does not count as a source's silence: every source's
        liveness is moved on by the stall, or an outage of the cluster would evict every
        source the moment it ends."""
        last, self._last_step_ms = self._last_step_ms, now
        stall = now - last - 2 * self.config.acker.heartbeat_ms
        if last and stall > 0:
            for session in self.state.sessions.values():
                session.last_seen_ms += stall

    def _evict(self, source: str, reason: str) -> bool:
        """Begin evicting ``source``: fence its writer (a stopped process that resumes can
        commit nothing more), then read its acks partition up to where it stands now, so
        that everything it committed before the fence is applied before the acker stops
        waiting for it.  False if it is not a live SOURCE of any substream."""
        session = self.state.sessions.get(source)
        if session is None or session.evicted or source in self._evicting:
            return False
        if not any(t.is_active_source(source) for t in self.state.tables.values()):
            return False
        if session.writer:
            fence(self.bootstrap, self.config, session.writer)
        partition = acks_partition(source, self.config.acker.acks_partitions)
        assert self._reader is not None
        _, high = self._reader.watermarks(self.acks_topic, partition)
        log.warning("evicting source '%s' (%s): fenced, reading acks up to %d", source,
                    reason, high)
        self._evicting[source] = (partition, int(high), reason)
        return True

    def _finish_eviction(self, source: str, reason: str) -> None:
        session = self.state.sessions[source]
        session.evicted = True
        self.evictions += 1
        metrics.EVICTIONS.labels(self.name).inc()
        for sub, table in self.state.tables.items():
            if not table.is_active_source(source):
                continue
            table.unregister(source)
            self._evicted_items.append(
                (
                    self.control_topics[sub],
                    SourceEvicted(sub, source, session.incarnation, session.last_seen_ms, reason),
                )
            )
        log.warning("source '%s' evicted (%s)", source, reason)

    def _table_for(
        self, source: str, sub: str, problems: list[tuple[str, str]]
    ) -> SegmentTable | None:
        table = self.state.tables.get(sub)
        if table is None:
            problems.append((REASON_UNKNOWN_SUBSTREAM, f"unknown substream '{sub}'"))
            return None
        if not table.is_registered(source):
            problems.append(
                (REASON_UNREGISTERED, f"source '{source}' is not registered for substream '{sub}'")
            )
            return None
        return table

    def _apply_report(
        self, source: str, body: AckReport, now: int, problems: list[tuple[str, str]]
    ) -> None:
        trackers = self.state.trackers
        for e in body.entries:
            table = self._table_for(source, e.substream, problems)
            if table is None:
                continue
            try:
                if table.report(e.time, e.xor, e.records, e.reports, e.ranges, now):
                    trackers[e.substream].activate(e.time)
            except Violation as v:
                problems.append((REASON_TERMINATED, v.reason))
        for block in body.blocks:
            table = self._table_for(source, block.substream, problems)
            if table is None:
                continue
            shape = block.problem()
            if shape is not None:
                problems.append((REASON_MALFORMED, shape))
                continue
            new, refused = table.report_block(
                block.times, block.xors, block.records, block.reports, block.range_counts,
                block.ranges, now,
            )
            tracker = trackers[block.substream]
            for t in new:
                tracker.activate(t)
            problems.extend((REASON_TERMINATED, v.reason) for v in refused)
        for s in body.seals:
            table = self._table_for(source, s.substream, problems)
            if table is None:
                continue
            try:
                if s.all_keys:
                    if type(s.time) is not int:
                        raise Violation(f"keyed seal with a non-integer time {s.time!r}")
                    table.seal_keys(source, s.time, s.sealed_at_ms)
                elif table.seal(source, s.time, s.sealed_at_ms, now):
                    trackers[s.substream].activate(s.time)
            except Violation as v:
                problems.append((REASON_UNREGISTERED, v.reason))

    def _dead(self, msg: Message, source: str | None, reason: str, detail: str) -> None:
        assert self._out is not None
        self._out.write(DeadLetter.of(msg, reason, detail, source))
        self.dead_letters += 1
        metrics.DEAD_LETTERS.labels(self.name, reason).inc()

    def _terminations(self, now: int) -> list[tuple[str, ControlBody]]:
        """The control records announcing what terminated now: per substream, its times in
        runs of at most ``MAX_COMPLETIONS_PER_RECORD`` per record (batched completions)."""
        items: list[tuple[str, ControlBody]] = []
        for sub, table in self.state.tables.items():
            terms = table.terminations()
            if not terms:
                continue
            tracker = self.state.trackers[sub]
            topic = self.control_topics[sub]
            for at in range(0, len(terms), MAX_COMPLETIONS_PER_RECORD):
                run = terms[at:at + MAX_COMPLETIONS_PER_RECORD]
                bodies = tracker.complete_many([
                    (Completion(term.time, term.ranges, term.records,
                                term.sealed_at_ms or now, term.until), term.members)
                    for term in run
                ])
                for body in bodies:
                    if isinstance(body, FrontierSnapshot):  # with the open times' starts
                        items.append((topic, tracker.snapshot(_open_starts(table))))
                    else:
                        items.append((topic, body))
            metrics.observe_notifications(
                self.name, sub, (term.sealed_at_ms for term in terms), now
            )
            self.state.last_notification[sub] = (terms[-1].time, now)
            self.notifications += len(terms)
            tracker.prune_keyed(table.keyed_floor())
        return items

    def _commit(self, items: list[tuple[str, ControlBody]], now: int) -> None:
        assert self._writer is not None
        heartbeat = time.monotonic() - self._last_write >= self._heartbeat_s
        if heartbeat:
            for sub, tracker in self.state.trackers.items():
                update = tracker.pending_update()
                if update is not None:
                    items.append((self.control_topics[sub], update))
            items.append((self.checkpoint_topic, WriterHeartbeat(None)))
        self.state.checkpoints += 1
        offsets = tuple(sorted(self.state.acks_offsets.items()))
        items.append((self.checkpoint_topic, Checkpoint(offsets, self.state.dumps())))
        try:
            self._writer.write(items)
        except PublisherFencedError as exc:
            raise self._fenced() from exc
        self._last_write = time.monotonic()
        by_topic = {t: s for s, t in self.control_topics.items()}
        for topic, _ in items:
            written = by_topic.get(topic)
            if written is not None:
                TRAFFIC.add(CONTROL_WRITTEN, written)

    # -- inspection ----------------------------------------------------------------------

    def view(self) -> AckerView:
        return self.state.view(self.name)


def _open_starts(table: SegmentTable) -> dict[tuple[str, int], int]:
    """Per data partition, the earliest offset of a record of a still-open time."""
    starts: dict[tuple[str, int], int] = {}
    for entry in table.open.values():
        for key, (lo, _) in entry.ranges.items():
            if lo < starts.get(key, lo + 1):
                starts[key] = lo
    return starts
