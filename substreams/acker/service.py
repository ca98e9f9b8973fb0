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

Shards (docs/design.md, "Sharded ackers"): with ``shards=N`` this instance is shard ``shard``
and owns the acks partitions ``p % N == shard`` and only the segments mapped to them
(:func:`~substreams.acker.protocol.segment_partition`); its name, and so its checkpoint topic,
transactional id, chain writer and standby, is ``<name>.shard<i>of<N>``.  A shard that has
no checkpoint of its own yet, or whose own was retired, and is given ``from_shards=M`` takes
its partitions over from the shards of the M-shard layout that owned them
(:meth:`_take_over`): fence each (its transactional id), read its latest checkpoint, retire
it (a copy of that checkpoint marked ``retired``, committed with the fenced id: it succeeds
only if no one else took the id since, so the state read is final), then commit the parts
that belong to its partitions as its own first checkpoint.

Acks are read with ``assign()`` from stored offsets (never a consumer group).  Messages the
acker cannot apply go to the dead-letter topic (:mod:`substreams.streams.deadletter`, flushed
before the checkpoint that moves past them) and the acker keeps running.
``command_handler`` (the command protocol's, built with the service from the ``commands``
factory: :meth:`substreams.app.Application.acker`) is called once per step with the
service.

Time is read from a :class:`~substreams.kafka.clock.Clock` (the system's by default), and
every decision about a source, a time or a shard is the core's (:mod:`substreams.acker.core`):
this module reads, writes, logs and counts.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from confluent_kafka import OFFSET_END, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from substreams import metrics
from substreams.acker.changelog import StateLog, base_of, is_changelog, is_first_chunk, restore
from substreams.acker.core import (
    AckerCore,
    Effects,
    Evict,
    check_retirable,
    predecessors,
    recovery,
    start_offsets,
    superseded,
)
from substreams.acker.protocol import (
    segment_partition,
    shard_partitions,
)
from substreams.acker.state import AckerState, AckerView, Blocker
from substreams.acker.table import Segment, acker_segments
from substreams.config import Config
from substreams.control.follower import LOG, ControlFollower
from substreams.control.io import ControlWriter, find_last, read_control
from substreams.control.messages import (
    Checkpoint,
    ControlBody,
    ControlRecord,
    WriterHeartbeat,
)
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.errors import ProtocolError, PublisherFencedError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.client import fence
from substreams.kafka.clock import SYSTEM, Clock
from substreams.kafka.read import Reader, record_at
from substreams.kafka.topics import ensure_topics
from substreams.kafka.write import fenced_as
from substreams.streams.deadletter import DeadLetterWriter, UndeliveredError


class StepHandler(Protocol):
    """What serves beside the loop, called once per step by the thread that owns the state
    (the command protocol's :class:`~substreams.acker.handler.CommandHandler`)."""

    def __call__(self, service: AckerService) -> None:
        """One round."""

    def close(self) -> None: ...


StepHandlerFactory = Callable[["AckerService"], StepHandler]
"""Builds a service's step handler from the service (it needs its name and substreams)."""

log = logging.getLogger(__name__)

PHASES_ENV = "SUBSTREAMS_ACKER_PHASES"
"""Set (to anything) to log, per step that wrote notifications, where its time went (the
``substreams.acker.phases`` logger at DEBUG): where seal -> notification time goes."""
phase_log = logging.getLogger("substreams.acker.phases")
if os.environ.get(PHASES_ENV):
    phase_log.setLevel(logging.DEBUG)


GC_GEN0_THRESHOLD = 50_000
"""Allocations between two collections of the youngest generation (CPython: 700)."""


def relax_gc() -> None:
    """Run CPython's cycle collector's youngest generation every 50 000 container
    allocations instead of every 700 (the older generations' ratios stay).

    Why: a backlog opens hundreds of thousands of times at once (an ``OpenEntry``, its
    ranges dict and hull list, then a ``Completion`` and ``OffsetRange`` each); with the
    default threshold the collector ran so often over that growing heap that it took a
    large share of the acker's CPU (bench/README.md, the acker's profile).  The acker's own
    structures hold no reference cycles (reference counting frees them), so a rarer
    collection only delays freeing the few cyclic leftovers of libraries.  Process-wide, so
    the service's entry point calls it (``substreams acker run``: a process of its own), not
    :class:`AckerService`, which may share a process with a user's code."""
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GC_GEN0_THRESHOLD:
        gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


OLDEST_AMONG = 64
"""Open times looked at for the oldest-open-time gauge: the first ones to have opened
(after a restore, nearly so)."""


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
    loaded = load_state(server, config, name)
    if loaded is None:
        return None
    return loaded.state, loaded.record.written_at_ms


@dataclass(frozen=True)
class Loaded:
    """An acker's state as its checkpoint topic holds it."""

    state: AckerState
    base: int | None
    """The changelog snapshot it was restored from (None: a version-3 checkpoint)."""
    offset: int
    """Where its latest checkpoint record is."""
    record: ControlRecord
    read_bytes: int
    """The state bytes read to restore it."""


def _first_chunk(bootstrap: str, config: Config, name: str, last: bytes) -> int:
    """The offset of the first chunk of the snapshot that changelog record ``last`` names."""
    base = base_of(last)
    topic = checkpoint_topic(config, name)
    first = find_last(
        bootstrap, topic,
        lambda r: r.writer == name and isinstance(r.body, Checkpoint)
        and is_first_chunk(r.body.state, base),  # type: ignore[arg-type]
        config,
    )
    if first is None:
        raise ProtocolError(
            f"acker '{name}': the first chunk of checkpoint snapshot {base} is not on "
            f"'{topic}' (deleted by retention? raise acker.checkpoint_retention_bytes)"
        )
    return first[0]


def changelog_start(bootstrap: str, config: Config, name: str) -> int | None:
    """Where a follower of acker ``name``'s changelog starts reading (None: its latest
    checkpoint is not a changelog record, or there is none)."""
    found = latest_checkpoint(bootstrap, config, name)
    if found is None:
        return None
    body = found[1].body
    assert isinstance(body, Checkpoint)
    if not is_changelog(body.state):
        return None
    return _first_chunk(bootstrap, config, name, body.state)


def load_state(
    bootstrap: str, config: Config, name: str, last: tuple[int, ControlRecord] | None = None
) -> Loaded | None:
    """The state of acker ``name``: its latest checkpoint record, and if that is a changelog
    delta (:mod:`substreams.acker.changelog`), the records from the first chunk of the
    snapshot it names to it.  None: the acker never wrote one."""
    found = latest_checkpoint(bootstrap, config, name, last)
    if found is None:
        return None
    at, rec = found
    body = rec.body
    assert isinstance(body, Checkpoint)
    offsets = dict(body.acks_offsets)
    every = config.acker.snapshot_every
    if not is_changelog(body.state):  # a version-3 checkpoint: the whole state
        return Loaded(AckerState.loads(body.state, offsets, every), None, at, rec,
                      len(body.state))
    topic = checkpoint_topic(config, name)
    start = _first_chunk(bootstrap, config, name, body.state)
    data = [
        r.body.state for o, r in read_control(bootstrap, topic, config, start=start)
        if o <= at and r.writer == name and isinstance(r.body, Checkpoint)
    ]
    state, base = restore(data, offsets, every)
    return Loaded(state, base, at, rec, sum(len(d) for d in data))


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
        shard: int = 0,
        shards: int | None = None,
        from_shards: int | None = None,
        commands: StepHandlerFactory | None = None,
        on_step: Callable[[AckerService], None] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        """``commands``: builds the command handler (called once, with this service);
        ``on_step``: called after every step (a progress line); ``clock``: where time is
        read (a :class:`~substreams.kafka.clock.SimClock` in tests)."""
        self.config = config
        self.clock = clock
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.standby = standby
        self.max_batch = max_batch
        self._layout(name, shard, shards, from_shards)
        self.core = self._new_core(AckerState())
        self.on_step = on_step
        self.dead_letters = 0
        self._admin: AdminClient | None = None
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"acker-io-{self.name}")
        """Fences run here, off the loop (see :meth:`_fence_for`)."""
        self._evictions: list[tuple[Evict, Future[int]]] = []
        self._fences: list[Future[None]] = []
        self.committed_notes: list[tuple[str, str, ControlBody]] = []
        """(control topic, substream, body) of what this step committed: the command handler
        keeps completed times for peeks from here instead of reading them back."""
        self.started = False
        self.fenced = False
        self._writer: ControlWriter | None = None
        self._reader: Reader | None = None
        self._letters: DeadLetterWriter | None = None
        self._log: StateLog | None = None
        """What the checkpoint records of the next transaction hold (the changelog writer)."""
        self._backlog: list[Message] = []
        """Acks read but not applied yet (a step applies for :attr:`_apply_budget_s` at
        most); the liveness horizon stops at the first of them."""
        self._apply_budget_s = config.acker.heartbeat_ms / 4000.0
        """How long one step applies acks: a quarter of the heartbeat, so that a step with
        its terminations and commit stays well within it."""
        self._heartbeat_s = config.acker.heartbeat_ms / 1000.0
        self._open_gauges = metrics.OpenTimes(self.name)
        self._hold_gauges = metrics.UnsealedAges(self.name)
        self._gauges_due = metrics.Periodic(1.0)
        self._commands: StepHandler | None = None if commands is None else commands(self)

    @property
    def command_handler(self) -> StepHandler | None:
        """The command protocol's handler, built with the service (None: commands are not
        served); closed by :meth:`close`."""
        return self._commands

    def _layout(
        self, name: str | None, shard: int, shards: int | None, from_shards: int | None
    ) -> None:
        """This shard's name, acks partitions, substreams (segments) and topics."""
        config = self.config
        self.shards = shards or config.acker.shards
        self.shard = shard
        self.from_shards = from_shards
        self.base_name = name or config.acker.name
        self.name = config.acker.shard_name(shard, self.shards, self.base_name)
        parts = config.acker.acks_partitions
        self.partitions = shard_partitions(shard, self.shards, parts)
        if from_shards is not None:
            shard_partitions(0, from_shards, parts)  # refuse an impossible layout now
        self.home = {s: segment_partition(s, parts) for s in acker_segments(config)}
        """Every acker substream's acks partition (this shard's and the others')."""
        self.segments: dict[str, Segment] = {
            s: seg for s, seg in acker_segments(config).items()
            if self.home[s] in self.partitions
        }
        self.control_topics = {s: config.acker.control_topic(s) for s in self.segments}
        self.checkpoint_topic = checkpoint_topic(config, self.name)
        self.acks_topic = config.acker.acks_topic

    def _new_core(self, state: AckerState, old: AckerCore | None = None) -> AckerCore:
        core = AckerCore(
            self.name, self.partitions, self.home, self.control_topics,
            acks_partitions=self.config.acker.acks_partitions,
            source_timeout_ms=self.config.acker.source_timeout_ms,
            heartbeat_ms=self.config.acker.heartbeat_ms,
            unsealed_timeout_ms=self.config.acker.unsealed_timeout_ms, state=state,
        )
        if old is not None:  # the counters are the process's, not the state's
            core.duplicates, core.stale = old.duplicates, old.stale
            core.evictions, core.notifications = old.evictions, old.notifications
        return core

    @property
    def state(self) -> AckerState:
        """The core's state (what the checkpoint holds)."""
        return self.core.state

    @state.setter
    def state(self, state: AckerState) -> None:
        """A loaded or recovered state: a new core (liveness and evictions in progress
        start afresh; a restarted acker re-reads what it had not checkpointed)."""
        self.core = self._new_core(state, self.core)

    @property
    def duplicates(self) -> int:
        return self.core.duplicates

    @property
    def stale(self) -> int:
        return self.core.stale

    @property
    def evictions(self) -> int:
        return self.core.evictions

    @property
    def notifications(self) -> int:
        return self.core.notifications

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Take over the transactional id (fencing any zombie), recover and seek."""
        if self.started:
            return
        began = self.clock.monotonic()
        log.info("acker '%s' starting: taking over transactional id '%s'", self.name,
                 transactional_id(self.name))
        self._admin = client.admin(self.bootstrap, self.config)
        ensure_topics(self._admin, [self.config.topic_spec(self.checkpoint_topic)])
        heads = self._open_writer()
        took_over = self._recover(heads)
        every = self.config.acker.snapshot_every
        for sub in self.segments:
            self.state.ensure(sub, every, self.config.substream(sub).gap_ms)
        self.core.started(self.clock.now_ms())  # the acker's own downtime evicts no one
        self._open_reader()
        self.started = True
        if took_over:
            # The moved state becomes this shard's own: its first checkpoint.  A crash
            # before it takes over again from the (retired) predecessors, same state.
            self._commit([], self.clock.now_ms())
        log.info(
            "acker '%s' started in %.3f s: reading acks topic '%s' from offsets %s",
            self.name, self.clock.monotonic() - began, self.acks_topic,
            dict(sorted(self.state.acks_offsets.items())),
        )

    def _open_writer(self) -> dict[str, tuple[int, ControlRecord] | None]:
        """The transactional control writer (its ``init_transactions`` fences a zombie of
        this name) and the head of each of its chains."""
        topics = [*self.control_topics.values(), self.checkpoint_topic]
        try:
            self._writer = ControlWriter(
                self.bootstrap, self.name, topics, self.config,
                transactional_id=transactional_id(self.name),
            )
        except PublisherFencedError as exc:
            raise self._fenced() from exc
        return self._writer.recover_heads()

    def _recover(self, heads: dict[str, tuple[int, ControlRecord] | None]) -> bool:
        """Load the state the core's start-up rule picks (:func:`~substreams.acker.core.
        recovery`); True if it was taken over from the previous layout's shards."""
        began = self.clock.monotonic()
        loaded = load_state(
            self.bootstrap, self.config, self.name, heads.get(self.checkpoint_topic)
        )
        chains = ", ".join(
            f"{t}: {'genesis' if h is None else f'seq {h[1].seq} at offset {h[0]}'}"
            for t, h in heads.items()
        )
        own = None if loaded is None else loaded.state
        decided = recovery(self.name, own, self.partitions, self.from_shards,
                           f"shard {self.shard} of {self.shards}")
        if decided == "take_over":
            self.state = self._take_over()
            self._log = StateLog(self.state)  # its first checkpoint is a whole snapshot
            log.info("acker '%s' took acks partitions %s over from the %d-shard layout; "
                     "chain heads: %s", self.name, list(self.partitions), self.from_shards,
                     chains)
            return True
        if decided == "empty" or loaded is None or own is None:
            self._log = StateLog(self.state)
            log.info("acker '%s' recovery: no checkpoint, empty state; chain heads: %s",
                     self.name, chains)
            return False
        self.state = own
        self._log = StateLog.adopt(own, loaded.base)
        metrics.RESTARTS.labels("acker", self.name).inc()
        log.info(
            "acker '%s' recovery: checkpoint #%d (%s, %d bytes read in %.3f s, offset %d "
            "of '%s', written at %d ms): %d open times, %d sources; chain heads: %s",
            self.name, self.state.checkpoints,
            "version 3" if loaded.base is None else f"changelog from snapshot {loaded.base}",
            loaded.read_bytes, self.clock.monotonic() - began, loaded.offset,
            self.checkpoint_topic, loaded.record.written_at_ms,
            sum(len(t.open) for t in self.state.tables.values()),
            len(self.state.sessions), chains,
        )
        return False

    def _open_reader(self) -> None:
        """The dead-letter writer and the acks reader, at the offsets the core's start-up
        rule gives (:func:`~substreams.acker.core.start_offsets`)."""
        self._letters = DeadLetterWriter(self.config, self.name, bootstrap=self.bootstrap)
        self._reader = Reader(
            self.bootstrap, self.config, name=f"acker '{self.name}': acks topic"
        )
        lows = {p: int(self._reader.watermarks(self.acks_topic, p)[0]) for p in self.partitions}
        start_offsets(self.state.acks_offsets, lows, self.acks_topic)
        self._assign()

    def _take_over(self) -> AckerState:
        """The state of this shard's partitions, taken from the shards of the
        ``from_shards`` layout that owned them; each of those is retired on the way.

        Per predecessor: (1) take its transactional id (``init_transactions`` fences it and
        aborts its open transaction, so its committed checkpoints are all there will be);
        (2) read its latest checkpoint; (3) commit a copy of it marked ``retired`` with the
        same id.  (3) fails if anyone (its standby, a restart) took the id after (1), so
        what (2) read is its final state; any later start of that name loads the retired
        copy and refuses to serve.  A predecessor already retired to this layout (a sibling
        shard of ours took its other partitions) is read the same way."""
        assert self.from_shards is not None
        old = self.from_shards
        preds = predecessors(
            self.name, self.partitions, old,
            lambda i: self.config.acker.shard_name(i, old, self.base_name),
        )
        state = AckerState()
        admin = client.admin(self.bootstrap, self.config)
        for pred, parts in sorted(preds.items()):
            topic = checkpoint_topic(self.config, pred)
            ensure_topics(admin, [self.config.topic_spec(topic)])
            full, found = self._retire(pred, topic)
            subs = {s for s, p in self.home.items() if p in parts}
            # Every shard serves commands: the first predecessor's command history is
            # this shard's (all of them read the same command topic).
            state.merge(full.part(parts, subs, commands=state.commands is None))
            log.warning(
                "acker '%s': took acks partitions %s over from '%s' (%s; %d substreams), "
                "and retired it", self.name, sorted(parts), pred,
                "no checkpoint" if found is None else f"checkpoint #{full.checkpoints}",
                len(subs),
            )
        return state

    def _retire(
        self, pred: str, topic: str, attempts: int = 10
    ) -> tuple[AckerState, tuple[int, ControlRecord] | None]:
        """Fence ``pred``, read its latest checkpoint and commit it again marked retired;
        again from the fence when someone else (a sibling shard retiring it too, its
        standby) took the id in between.  The state and the checkpoint it came from."""
        for attempt in range(attempts):
            writer = ControlWriter(
                self.bootstrap, pred, [topic], self.config, transactional_id=transactional_id(pred)
            )
            fenced = False
            try:
                heads = writer.recover_heads()
                loaded = load_state(self.bootstrap, self.config, pred, heads.get(topic))
                full = AckerState() if loaded is None else loaded.state
                check_retirable(pred, full, self.shards)
                # The retired mark: one more delta of its changelog (head only), or a whole
                # snapshot for a predecessor that never wrote one.
                marked = StateLog.adopt(full, None if loaded is None else loaded.base)
                full.retired = {"to_shards": self.shards, "by": self.name}
                full.checkpoints += 1
                offsets = tuple(sorted(full.acks_offsets.items()))
                writer.write([(topic, Checkpoint(offsets, data)) for data in marked.records()])
                full.retired = None  # what is taken over is the state, not the mark
                found = None if loaded is None else (loaded.offset, loaded.record)
                return full, found
            except (PublisherFencedError, KafkaException) as exc:
                # Fenced: a sibling shard retiring it too, or its standby.  Kafka 4 may say
                # so with an error librdkafka does not know (see _superseded).
                fenced = True
                log.warning("acker '%s': retiring '%s' failed (%s; attempt %d); again from "
                            "the fence", self.name, pred, exc, attempt + 1)
                self.clock.sleep(0.2 * (attempt + 1))
            finally:
                if not fenced:
                    writer.close()
        raise SubstreamsError(
            f"acker '{self.name}': could not retire '{pred}' in {attempts} attempts (someone "
            "keeps taking its transactional id)"
        )

    def _assign(self) -> None:
        """Point the acks consumer at the next expected offset of every partition."""
        assert self._reader is not None
        self._reader.assign(
            [
                TopicPartition(self.acks_topic, p, self.state.acks_offsets.get(p, 0))
                for p in self.partitions
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
        with ControlFollower(
            self.bootstrap, self.config, name=f"standby acker '{self.name}'", on_bad=LOG,
            verify=False,
        ) as tail:
            tail.assign({self.checkpoint_topic: OFFSET_END})
            log.info("standby acker '%s': following the heartbeats on '%s' from its end "
                     "(taking over after %.1f s of silence)", self.name, self.checkpoint_topic,
                     timeout)
            last_seen = self.clock.monotonic()
            while not stop.is_set():
                if any(f.record.writer == self.name for f in tail.poll(0.1)):
                    last_seen = self.clock.monotonic()
                silent = self.clock.monotonic() - last_seen
                if silent > timeout:
                    log.warning("standby acker '%s': no heartbeat for %.1f s; taking over",
                                self.name, silent)
                    return True
        return False

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (as a standby: first wait to take over); then close
        (the command handler too)."""
        try:
            if self.standby and not self.started and not self.wait_for_takeover(stop):
                return
            self.start()
            while not stop.is_set():
                try:
                    self.step(0.05)
                except (KafkaException, UndeliveredError) as exc:
                    self._rewind(exc, stop)
        finally:
            self.close()
            log.info("acker '%s' stopped after %d notifications, %d dead letters",
                     self.name, self.notifications, self.dead_letters)

    def _rewind(self, exc: KafkaException | UndeliveredError, stop: threading.Event) -> None:
        """Not a fence (that is AckerFencedError): our own transaction was lost, e.g. the
        coordinator aborted it during a long outage and bumped the producer epoch, or dead
        letters could not be delivered before it.  Everything since the last checkpoint is
        replayed."""
        log.error("acker '%s': could not commit (%s); recovering from the latest "
                  "checkpoint", self.name, exc)
        if self._superseded(stop):
            raise self._fenced() from exc
        # The newcomer may not have heartbeated yet; librdkafka then learns of the fence
        # only now, when the failed producer is flushed and closed.
        try:
            with fenced_as(self._fenced):
                self._disconnect()
        except AckerFencedError:
            raise
        except PublisherFencedError as fence:
            raise self._fenced() from fence
        self.state = AckerState()
        self.start()
        log.warning("acker '%s': rewound to its latest checkpoint; acks after it are applied "
                    "again", self.name)

    def close(self) -> None:
        """Stop for good: the Kafka clients and the command handler.  (A recovery inside
        :meth:`run` only reconnects: the handler keeps its state.)"""
        self._disconnect()
        if self._commands is not None:
            self._commands.close()
            self._commands = None

    def _disconnect(self) -> None:
        """Close the Kafka clients; :meth:`start` opens them again."""
        for _, done in self._evictions:
            done.cancel()
        self._evictions = []
        self._backlog = []  # read again from the checkpoint's offsets
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._letters is not None:
            self._letters.close()
            self._letters = None
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
        return superseded((rec for _, rec in records), self.name, ours)

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
        assert self._reader is not None
        t_poll = time.perf_counter()
        core = self.core
        if self._backlog:  # read before, not applied yet: applied first, nothing polled
            msgs, self._backlog = self._backlog, []
        else:
            busy = any(t.dirty for t in core.state.tables.values())
            msgs = self._reader.poll_batch(0 if busy else timeout, self.max_batch)
        t_woke = time.perf_counter()
        now = self.clock.now_ms()
        applied = 0
        self.committed_notes = []
        deadline = t_woke + self._apply_budget_s
        for msg in msgs:
            for refusal in core.apply(msg.partition(), msg.offset(), msg.value() or b"",
                                      msg.headers(), now):
                self._dead(msg, refusal.source, refusal.reason, refusal.detail)
            applied += 1
            if time.perf_counter() > deadline and applied < len(msgs):
                # the rest in the next step: no step holds the acker past its heartbeat
                self._backlog = msgs[applied:]
                break
        t_applied = time.perf_counter()
        notified = self.notifications
        self._collect()
        items = self._carry_out(core.tick(now, self._liveness(now)), now)
        t_decided = time.perf_counter()
        heartbeat = core.heartbeat_due(now)
        committed = bool(items) or heartbeat
        if committed:
            assert self._letters is not None
            self._letters.flush()  # durable before the checkpoint moves past their acks
            self._commit(items, now, heartbeat)
        t_committed = time.perf_counter()
        self.serve_commands()
        if self.on_step is not None:
            self.on_step(self)
        if self._gauges_due.due():
            self._export_gauges()
        if committed and self.notifications > notified and phase_log.isEnabledFor(logging.DEBUG):
            self._log_phases(msgs, t_poll, t_woke, t_applied, t_decided, t_committed)
        return applied

    def serve_commands(self) -> None:
        """One round of the command handler, if any (its first one is its start-up: a
        benchmark runs it before it starts the clock)."""
        if self._commands is not None:
            self._commands(self)

    def _log_phases(
        self, msgs: list[Message], t_poll: float, t_woke: float, t_applied: float,
        t_decided: float, t_committed: float,
    ) -> None:
        """One line per step that notified: wall clock at wake-up (to line up with the
        publisher's and the subscriber's clocks), the first ack's CreateTime, and the
        step's phases in ms (waited in poll, apply, decide, the transaction's begin /
        encode+produce / commit, the command handler and gauges)."""
        assert self._writer is not None
        begin, produce_s, commit_s = self._writer.last_timing
        woke_wall = time.time() - (time.perf_counter() - t_woke)
        first_ts = msgs[0].timestamp()[1] if msgs else -1
        lasts = ",".join(
            f"{s}@{v[0]}" for s, v in self.state.last_notification.items() if v is not None
        )
        phase_log.debug(
            "phases acks=%d first_ack_create_ms=%d woke_wall=%.4f waited=%.2f apply=%.2f "
            "decide=%.2f begin=%.2f produce=%.2f commit=%.2f after=%.2f last=%s",
            len(msgs), first_ts, woke_wall, (t_woke - t_poll) * 1e3,
            (t_applied - t_woke) * 1e3, (t_decided - t_applied) * 1e3, begin * 1e3,
            produce_s * 1e3, commit_s * 1e3, (time.perf_counter() - t_committed) * 1e3, lasts,
        )

    def _export_gauges(self) -> None:
        """Refresh the open-times and acks-lag gauges (from the loop: the tables are not
        safe to read from the scrape thread)."""
        for sub, table in self.state.tables.items():
            # The open times in the order they opened (a dict keeps it; first_seen_ms is
            # the clock then): the oldest is among the first, not worth a walk of a million.
            first = islice(table.open.values(), OLDEST_AMONG)
            oldest = metrics.first_seen_min(e.first_seen_ms for e in first)
            self._open_gauges.update(sub, len(table.open), oldest)
        self._hold_gauges.update(self.core.holds.watched, self.state.holds)
        if self._reader is not None:
            metrics.record_lag("acker", self.name, self._reader.lag())

    def _positions(self) -> dict[int, int]:
        """How far each acks partition has been read: the consumer's fetch position (past
        transaction markers) or ours (past the last message, or its end of partition).  One
        call for all partitions: it runs every step."""
        assert self._reader is not None
        fetched = self._reader.consumer.position(
            [TopicPartition(self.acks_topic, p) for p in self.partitions]
        )
        ours = self._reader.positions
        read = {
            tp.partition: max(int(tp.offset), ours.get((self.acks_topic, tp.partition), 0))
            for tp in fetched
        }
        for msg in self._backlog:  # not applied yet: not read, for liveness and evictions
            p = msg.partition()
            read[p] = min(read[p], msg.offset())
        return read

    def _liveness(self, now: int) -> dict[int, int]:
        """How far each acks partition was read; every ``probe_interval_ms`` its ends are
        asked of the broker for the core (liveness rules 2 and 4), and the blockers it wants
        named are read.  A broker that cannot answer moves no horizon (nobody is judged on
        a guess)."""
        positions = self._positions()
        if not self.core.probe_due(now):
            return positions
        assert self._admin is not None
        parts = list(self.partitions)
        try:
            stable = client.end_offsets(self._admin, self.acks_topic, parts, committed=True)
            high = client.end_offsets(self._admin, self.acks_topic, parts, committed=False)
        except KafkaException as exc:
            log.info("acker '%s': acks partitions' ends not available (%s); liveness waits",
                     self.name, exc)
            return positions
        for p in parts:
            self.core.probed(p, now, positions[p], stable[p], high[p])
        for blocker in self.core.to_name(now):
            named = self._name(blocker)
            log.warning(
                "acker '%s': %s, open for at least %d ms: %s", self.name,
                named.describe(), now - named.since_ms,
                "the sources behind it are not judged silent until it ends"
                if named.source is not None else
                "not a source of ours: reported and waited out (its coordinator aborts it "
                "after its transaction.timeout.ms); our sources behind it are not evicted",
            )
        return positions

    def _name(self, blocker: Blocker) -> Blocker:
        """Read the blocker's first message (``read_uncommitted``) and say whose it is."""
        msg = record_at(self.bootstrap, self.config, self.acks_topic, blocker.partition,
                        blocker.offset)
        if msg is None:
            return self.core.named_record(blocker, None, None)
        return self.core.named_record(blocker, msg.value() or b"", msg.headers())

    def _carry_out(self, effects: Effects, now: int) -> list[tuple[str, ControlBody]]:
        """The core's effects: fences (and, for an eviction, the high watermark after it,
        read ``read_uncommitted``: the LSO would stop short of what the source committed
        behind another open transaction), logs, metrics; the control records to commit."""
        for warning in effects.warnings:
            log.warning("acker '%s': %s", self.name, warning)
        for f in effects.fence:
            log.warning("acker '%s': %s: '%s'", self.name, f.why, f.writer)
            self._fences.append(self._io.submit(fence, self.bootstrap, self.config, f.writer))
        for e in effects.evict:
            self._evictions.append((e, self._io.submit(self._fence_for, e)))
        for (source, _), reason, cause in effects.evicted:
            metrics.EVICTIONS.labels(self.name, cause).inc()
            log.warning("source '%s' evicted (%s)", source, reason)
        for sub, sealed_at in effects.notified:
            metrics.observe_notifications(self.name, sub, sealed_at, now)
        return effects.records

    def _fence_for(self, e: Evict) -> int:
        """An eviction's I/O, off the loop (a fence aborts the writer's open transaction:
        up to a second or more, while every other substream's notifications go on): fence
        its writer, then the partition's high watermark, asked after the fence."""
        if e.writer:
            fence(self.bootstrap, self.config, e.writer)
        assert self._admin is not None
        partition = e.key[1]
        return client.end_offsets(self._admin, self.acks_topic, [partition],
                                  committed=False)[partition]

    def _collect(self) -> None:
        """Hand the core the fences that finished; a failed one (a broker outage) is tried
        again, the eviction waiting meanwhile."""
        pending: list[tuple[Evict, Future[int]]] = []
        for e, done in self._evictions:
            if not done.done():
                pending.append((e, done))
                continue
            try:
                high = done.result()
            except (KafkaException, SubstreamsError) as exc:
                log.warning("acker '%s': fencing '%s' for its eviction failed (%s); again",
                            self.name, e.key[0], exc)
                pending.append((e, self._io.submit(self._fence_for, e)))
                continue
            log.warning("evicting source '%s' (%s): fenced, reading acks partition %d up to "
                        "%d", e.key[0], e.reason, e.key[1], high)
            self.core.fenced(e.key, high)
        self._evictions = pending
        for f in [f for f in self._fences if f.done()]:
            self._fences.remove(f)
            if f.exception() is not None:
                log.warning("acker '%s': a fence failed: %s", self.name, f.exception())

    def _dead(self, msg: Message, source: str | None, reason: str, detail: str) -> None:
        assert self._letters is not None
        self._letters.write_message(msg, reason, detail, source)
        self.dead_letters += 1

    def _commit(
        self, items: list[tuple[str, ControlBody]], now: int, heartbeat: bool = False
    ) -> None:
        """One transaction: ``items``, with ``heartbeat`` the core's pending frontier
        updates and a ``WriterHeartbeat``, and the checkpoint that accounts for them."""
        assert self._writer is not None
        if heartbeat:
            items.extend(self.core.heartbeat_records())
            items.append((self.checkpoint_topic, WriterHeartbeat(None)))
        self.state.checkpoints += 1
        offsets = tuple(sorted(self.state.acks_offsets.items()))
        if self._log is None or self._log.state is not self.state:
            self._log = StateLog(self.state)  # a state from elsewhere: written whole
        items.extend(
            (self.checkpoint_topic, Checkpoint(offsets, data)) for data in self._log.records()
        )
        try:
            self._writer.write(items)
        except PublisherFencedError as exc:
            raise self._fenced() from exc
        self._log.committed()
        self.core.committed(now)
        by_topic = {t: s for s, t in self.control_topics.items()}
        notes = self.committed_notes
        for topic, body in items:
            written = by_topic.get(topic)
            if written is not None:
                TRAFFIC.add(CONTROL_WRITTEN, written)
                notes.append((topic, written, body))

    # -- inspection ----------------------------------------------------------------------

    def view(self) -> AckerView:
        return self.state.view(self.name)
