"""The progress writer of punctuation substreams: aligned punctuations -> control topic.

Why a service at all: subscribers (Python or Spark) follow one protocol, the control topic,
whichever mechanism tracks a substream.  This service is the punctuation baseline's
counterpart of the acker: it reads every data partition, aligns the punctuations and, for
each terminated time, writes the ``EpochComplete`` (with the offset ranges holding exactly
that time's records, and a snapshot every ``snapshot_every`` completions) produced by the
shared :class:`~substreams.control.progress.ProgressTracker`.

Restart, bounded (docs/design.md, "Bounded recovery"): every transaction that writes the
control topic also writes an :class:`~substreams.punctuation.checkpoint.AlignerCheckpoint`
on the aligner's checkpoint topic, as does the heartbeat once the aligner has read on.  A
restart ``recover_heads()`` its control writer (continuing its hash chain from the end,
fencing a zombie), loads the latest checkpoint and reads the data topic from its positions:
the aligner's state there is the one that wrote the control topic up to its end, so the next
notification is the next one, none lost or repeated.  Without a usable checkpoint (the
first start of an aligner whose control topic an older version wrote) it falls back to the
full replay: the ``EpochComplete`` records on the control topic into a fresh tracker, the
data topic from the start, every time already announced skipped.  The aligner reads with
the soft bound (it hands records to nobody, so the firm bound's holding would only cost
memory, and held records could not be checkpointed).  Late records (see
:mod:`substreams.punctuation.aligner`; reason ``late_record``) go to the dead-letter topic
(:mod:`substreams.streams.deadletter`, service ``aligner.<substream>``); undecodable
messages follow the stream's ``on_bad_record`` as in every reader
(:mod:`substreams.streams.badrecords`: dead-lettered with its reasons and logged once per
run of them, or the aligner stops naming topic, partition and offset).  Letters are
flushed before the checkpoint that moves past them; the ones already there (from the
checkpoint's ``dead_from``) are read back on start so that a restart does not report them
twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, TopicPartition

from substreams import metrics
from substreams.config import Config
from substreams.control.io import ControlWriter, find_last, now_ms, read_control
from substreams.control.messages import (
    Checkpoint,
    ControlBody,
    ControlRecord,
    FrontierSnapshot,
    completions,
)
from substreams.control.progress import ProgressTracker
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.errors import BrokerError, ProtocolError, SubstreamsError
from substreams.frontier import Time, sort_key
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.kafka.topics import ensure_topics
from substreams.punctuation.aligner import Aligner, Event, Late, Terminated
from substreams.punctuation.checkpoint import AlignerCheckpoint
from substreams.punctuation.reader import PunctuatedReader
from substreams.streams.badrecords import BadRecords
from substreams.streams.deadletter import DeadLetter, DeadLetterWriter, late_letter

DeadKey = tuple[str, int, int]

log = logging.getLogger(__name__)


class PunctuationAligner:
    """Writes the control topic of one punctuation substream."""

    def __init__(
        self,
        config: Config,
        substream: str,
        *,
        bootstrap: str | None = None,
        on_terminated: Callable[[Terminated], None] | None = None,
    ) -> None:
        self.config = config
        self.substream = substream
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.topic = config.acker.control_topic(substream)
        self.dead_letter_topic = config.acker.dead_letter_topic
        self.on_terminated = on_terminated
        self.writer_name = f"aligner.{substream}"
        self.checkpoint_topic = config.acker.aligner_checkpoint_topic(substream)
        self.tracker = ProgressTracker(substream, config.acker.snapshot_every)
        self.late = 0
        self.malformed = 0
        """Undecodable messages dead-lettered by this run."""
        self.checkpoints = 0
        self.recovered_from: AlignerCheckpoint | None = None
        """The checkpoint the last start-up continued from (None: a full replay)."""
        self._announced: set[Time] = set()
        self._dead: dict[DeadKey, int] = {}
        """Records dead-lettered (read back or written since), with their dead letter's
        offset: a restart must read from the lowest of those past the checkpoint's positions."""
        self._dead_end = 0
        """The dead-letter offset after the last one known (read back or delivered)."""
        self._saved_positions: dict[int, int] | None = None
        self._last_heartbeat = time.monotonic()
        self._first_seen: dict[Time, int] = {}  # open times -> when first seen (a gauge)
        self._open_gauges = metrics.OpenTimes(self.writer_name)
        self._gauges_due = metrics.Periodic(1.0)
        self._letters = DeadLetterWriter(config, self.writer_name, bootstrap=self.bootstrap)
        bad = BadRecords(config, self.writer_name, writer=self._letters, write=self._undecodable)
        # the reader validates the substream (exists, punctuations) before anything is written
        self.reader = PunctuatedReader(config, substream, bootstrap=self.bootstrap, bound="soft",
                                       bad=bad)
        self.reader.aligner.track_new_times = True
        ensure_topics(client.admin(self.bootstrap, config),
                      [config.topic_spec(self.checkpoint_topic)])
        self.writer = ControlWriter(
            self.bootstrap, self.writer_name, [self.topic, self.checkpoint_topic], config
        )
        self._recover()

    # -- recovery ------------------------------------------------------------------------

    def _recover(self) -> None:
        began = time.monotonic()
        log.info("aligner '%s' starting: writer '%s' of '%s'", self.substream, self.writer_name,
                 self.topic)
        heads = self.writer.recover_heads()  # both chains, read backwards from the ends
        found = self._latest_checkpoint(heads.get(self.checkpoint_topic))
        head = heads.get(self.topic)
        next_seq = 0 if head is None else head[1].seq + 1
        ckpt = None if found is None else AlignerCheckpoint.from_body(found)
        if ckpt is not None and ckpt.control_seq != next_seq:
            log.warning(
                "aligner '%s': the latest checkpoint was written with control seq %d but the "
                "chain on '%s' is at %d (written by an aligner that did not checkpoint?); "
                "replaying the control topic instead", self.substream, ckpt.control_seq,
                self.topic, next_seq,
            )
            ckpt = None
        if ckpt is not None:
            self._restore(ckpt)
            self._dead = self._read_dead_letters(ckpt.dead_from)
            metrics.RESTARTS.labels("aligner", self.substream).inc()
            log.info(
                "aligner '%s' recovery in %.3f s: checkpoint of '%s' (%d times complete, "
                "%d open), %d dead letters of '%s' from offset %d; reading data topic '%s' "
                "from offsets %s", self.substream, time.monotonic() - began,
                self.checkpoint_topic, self.tracker.completed,
                len(self.reader.aligner.pending_times()),
                len(self._dead), self.dead_letter_topic, ckpt.dead_from, self.reader.stream,
                dict(sorted(ckpt.positions.items())),
            )
            return
        records = read_control(self.bootstrap, self.topic, self.config) if head else []
        self._replay(records)
        self._dead = self._read_dead_letters(0)
        if self._announced:  # resumed where an earlier run of this aligner stopped
            metrics.RESTARTS.labels("aligner", self.substream).inc()
        log.info(
            "aligner '%s' recovery in %.3f s: no checkpoint; read %d control records of '%s' "
            "from offset 0 (%d times announced), %d dead letters of '%s'; re-reading data "
            "topic '%s' from its start (announced times are skipped)", self.substream,
            time.monotonic() - began, len(records), self.topic, len(self._announced),
            len(self._dead), self.dead_letter_topic, self.reader.stream,
        )

    def _latest_checkpoint(self, last: tuple[int, ControlRecord] | None) -> Checkpoint | None:
        """This aligner's last checkpoint: its last record on the checkpoint topic unless
        that is not one (then searched backwards)."""
        def mine(rec: ControlRecord) -> bool:
            return rec.writer == self.writer_name and isinstance(rec.body, Checkpoint)

        if last is None:
            return None
        found = last if mine(last[1]) else find_last(
            self.bootstrap, self.checkpoint_topic, mine, self.config
        )
        body = None if found is None else found[1].body
        return body if isinstance(body, Checkpoint) else None

    def _restore(self, ckpt: AlignerCheckpoint) -> None:
        """Continue from ``ckpt``: its aligner and tracker, the data topic from its
        positions (refused when retention already deleted records it has not read)."""
        sub = self.config.substream(self.substream)
        aligner = Aligner.from_state(ckpt.aligner, self.substream, self.reader.stream,
                                     bound="soft", ordered=sub.ordered)
        self.reader.restore(aligner, ckpt.positions)
        self.tracker = ProgressTracker.from_state(
            self.substream, ckpt.tracker, self.config.acker.snapshot_every
        )
        self._announced = set(ckpt.announced)
        self._saved_positions = dict(ckpt.positions)
        self.recovered_from = ckpt

    def _replay(self, records: list[tuple[int, ControlRecord]]) -> None:
        """The full replay: the times the control topic announced, into the tracker."""
        for _, rec in records:
            for body in completions(rec.body):
                if body.substream != self.substream or body.time in self._announced:
                    continue
                self._announced.add(body.time)
                self.tracker.complete(body.time, body.ranges, body.records, body.sealed_at_ms)

    def _read_dead_letters(self, start: int, timeout: float = 10.0) -> dict[DeadKey, int]:
        seen: dict[DeadKey, int] = {}
        self._dead_end = max(self._dead_end, start)
        topic = self.dead_letter_topic
        with Reader(self.bootstrap, self.config, [TopicPartition(topic, 0, start)],
                    name=f"dead-letter topic '{topic}'") as reader:
            try:
                for msg in reader.iter_to_end(timeout):
                    self._dead_end = max(self._dead_end, msg.offset() + 1)
                    try:
                        letter = DeadLetter.from_json(msg.value() or b"")
                    except ProtocolError as exc:  # not ours to judge: only ours are used
                        log.warning("aligner '%s': %s offset %d: %s", self.substream, topic,
                                    msg.offset(), exc)
                        continue
                    if letter.service == self.writer_name:
                        key = (letter.topic, letter.partition, letter.offset)
                        seen.setdefault(key, msg.offset())
            except BrokerError as exc:
                if reader.last_transient_code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise SubstreamsError(
                        f"dead-letter topic '{topic}' does not exist; create the topics "
                        "first (`substreams topics create`)"
                    ) from exc
                raise
        return seen

    # -- running -------------------------------------------------------------------------

    def step(self, timeout: float = 0.2) -> list[Terminated]:
        """Read what is there, write what terminated; returns the newly announced times."""
        events = self.reader.poll(timeout)
        now = now_ms()
        for t in self.reader.aligner.take_new_times():
            if t not in self._announced:
                self.tracker.activate(t)
                self._first_seen.setdefault(t, now)
        items: list[tuple[str, ControlBody]] = []
        done: list[Terminated] = []
        for i, ev in enumerate(events):
            if isinstance(ev, Terminated):
                if ev.time in self._announced:  # announced before a restart
                    self._announced.discard(ev.time)
                    continue
                sealed_at = ev.sealed_at_ms or now_ms()
                bodies = self.tracker.complete(ev.time, ev.ranges, ev.records, sealed_at)
                items += [(self.topic, self._with_open_starts(b, events[i + 1 :])) for b in bodies]
                done.append(ev)
                self._first_seen.pop(ev.time, None)
                metrics.observe_notification(self.writer_name, self.substream, ev.sealed_at_ms, now)
            elif isinstance(ev, Late):
                self._late(ev)
        self._letters.flush()  # before a checkpoint moves past them (raises if it cannot)
        heartbeat = False
        if time.monotonic() - self._last_heartbeat >= self.config.acker.heartbeat_ms / 1000:
            self._last_heartbeat = time.monotonic()
            heartbeat = True
            update = self.tracker.pending_update()
            if update is not None:
                items.append((self.topic, update))
        positions = self.reader.positions
        if items or (heartbeat and positions != self._saved_positions):
            # With every control write (so the latest checkpoint accounts for the whole
            # control topic), and on the heartbeat once the aligner read on (so a restart
            # re-reads at most a heartbeat's worth of the data topic).
            written = sum(1 for topic, _ in items if topic == self.topic)
            ckpt = self._checkpoint(positions, self.writer.heads[self.topic].next_seq + written)
            self.writer.write([*items, (self.checkpoint_topic, ckpt.to_body())])
            self._saved_positions = positions
            self.checkpoints += 1
            if items:
                TRAFFIC.add(CONTROL_WRITTEN, self.substream, len(items))
        if self.on_terminated is not None:
            for ev in done:
                self.on_terminated(ev)
        if self._gauges_due.due():
            self._export_gauges()
        return done

    def _checkpoint(self, positions: dict[int, int], control_seq: int) -> AlignerCheckpoint:
        """Where the aligner stands after what it read up to ``positions``.  The dead
        letters of records before the positions are forgotten (never read again); a restart
        reads the dead-letter topic from the first of the others (one a previous run wrote
        for a record this run has not reached yet may lie below this run's own)."""
        self._dead = {k: o for k, o in self._dead.items() if k[2] >= positions.get(k[1], 0)}
        dead_from = min(self._dead.values(), default=self._dead_end)
        return AlignerCheckpoint(
            dict(positions),
            self.reader.aligner.to_state(),
            self.tracker.to_state(),
            control_seq,
            dead_from,
            sorted(self._announced, key=sort_key),
        )

    def _delivered(self, key: DeadKey) -> Callable[[object, Message], None]:
        def done(err: object, msg: Message) -> None:
            offset = msg.offset()
            if err is not None or offset is None or offset < 0:
                self._dead.pop(key, None)  # not written: a restart writes it again
                return
            self._dead[key] = offset
            self._dead_end = max(self._dead_end, offset + 1)

        return done

    def _export_gauges(self) -> None:
        oldest = metrics.first_seen_min(self._first_seen.values())
        self._open_gauges.update(self.substream, len(self._first_seen), oldest)
        metrics.record_lag("aligner", self.substream, self.reader.lag())

    def _with_open_starts(self, body: ControlBody, later: list[Event]) -> ControlBody:
        """A snapshot's ``data_from`` must also cover the records of times still open: those
        the aligner holds, and those terminated later in this batch (the aligner is ahead of
        the event being written)."""
        if not isinstance(body, FrontierSnapshot):
            return body
        starts = {(self.reader.stream, q): o for q, o in self.reader.aligner.open_starts().items()}
        for ev in later:
            if isinstance(ev, Terminated):
                for r in ev.ranges:
                    key = (r.stream, r.partition)
                    starts[key] = min(r.start, starts.get(key, r.start))
        return self.tracker.snapshot(starts)

    def _late(self, ev: Late) -> None:
        e = ev.entry
        self.late += 1
        self._write_dead(late_letter(self.writer_name, e.stream, e.partition, e.index,
                                     e.source, e.payload, ev.reason))

    def _undecodable(self, letter: DeadLetter) -> None:
        """An undecodable message's letter (from :class:`BadRecords`, which logs runs of
        them): written once across restarts, as a late record's."""
        if self._write_dead(letter, quiet=True):
            self.malformed += 1

    def _write_dead(self, letter: DeadLetter, *, quiet: bool = False) -> bool:
        """Write ``letter`` unless a run before this one did (False)."""
        key = (letter.topic, letter.partition, letter.offset)
        if key in self._dead:  # written before a restart
            return False
        self._dead[key] = self._dead_end  # a lower bound until its delivery says where
        self._letters.write(letter, on_delivery=self._delivered(key), quiet=quiet)
        return True

    def run(self, stop: threading.Event) -> None:
        """Align until ``stop`` is set."""
        while not stop.is_set():
            self.step()

    def close(self) -> None:
        self.reader.close()
        self.writer.close()
        self._letters.close()

    def __enter__(self) -> PunctuationAligner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
