"""The progress writer of punctuation substreams: aligned punctuations -> control topic.

Why a service at all: subscribers (Python or Spark) follow one protocol, the control topic,
whichever mechanism tracks a substream.  This service is the punctuation baseline's
counterpart of the acker: it reads every data partition, aligns the punctuations and, for
each terminated time, writes the ``EpochComplete`` (with the offset ranges holding exactly
that time's records, and a snapshot every ``snapshot_every`` completions) produced by the
shared :class:`~substreams.control.progress.ProgressTracker`.

Restart (the simplest correct approach): the service keeps no state of its own.  It
``recover()``\\ s its control writer (continuing its hash chain, fencing a zombie), replays
the ``EpochComplete`` records already on the control topic into a fresh tracker, then
re-reads the data topic *from the start* and skips every time already announced.  Alignment
is a function of what was read, so the replay re-derives the open times; the cost is a full
re-read of the data topic on start-up, which retention bounds.  Late records (see
:mod:`substreams.punctuation.aligner`) go to the dead-letter topic as JSON
``{"reason", "stream", "partition", "offset", "substream"}``, and so do undecodable
messages (reason ``malformed``, with ``detail`` and the base64 ``raw`` bytes); the ones already
there are read back on start so that a restart does not report them twice.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, TopicPartition

from substreams import metrics
from substreams.config import Config
from substreams.control.io import ControlWriter, now_ms
from substreams.control.messages import ControlBody, FrontierSnapshot, completions
from substreams.control.progress import ProgressTracker
from substreams.control.traffic import CONTROL_WRITTEN, TRAFFIC
from substreams.errors import BrokerError, SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.punctuation.aligner import Event, Late, Terminated
from substreams.punctuation.reader import Malformed, PunctuatedReader

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
        self.tracker = ProgressTracker(substream, config.acker.snapshot_every)
        self.late = 0
        self.malformed = 0
        self._announced: set[Time] = set()
        self._dead: set[DeadKey] = set()
        self._last_heartbeat = time.monotonic()
        self._first_seen: dict[Time, int] = {}  # open times -> when first seen (a gauge)
        self._open_gauges = metrics.OpenTimes(self.writer_name)
        self._gauges_due = metrics.Periodic(1.0)
        # the reader validates the substream (exists, punctuations) before anything is written
        self.reader = PunctuatedReader(config, substream, bootstrap=self.bootstrap)
        self.reader.aligner.track_new_times = True
        self.writer = ControlWriter(self.bootstrap, self.writer_name, [self.topic], config)
        self._dlq = client.producer(self.bootstrap, config)
        self._recover()

    # -- recovery ------------------------------------------------------------------------

    def _recover(self) -> None:
        began = time.monotonic()
        log.info("aligner '%s' starting: writer '%s' of '%s'", self.substream, self.writer_name,
                 self.topic)
        records = self.writer.recover()[self.topic]
        for _, rec in records:
            for body in completions(rec.body):
                if body.substream != self.substream or body.time in self._announced:
                    continue
                self._announced.add(body.time)
                self.tracker.complete(body.time, body.ranges, body.records, body.sealed_at_ms)
        self._dead = self._read_dead_letters()
        if self._announced:  # resumed where an earlier run of this aligner stopped
            metrics.RESTARTS.labels("aligner", self.substream).inc()
        log.info(
            "aligner '%s' recovery in %.3f s: read %d control records of '%s' from offset 0 "
            "(%d times announced), %d dead letters of '%s'; re-reading data topic '%s' from "
            "its start (announced times are skipped)", self.substream,
            time.monotonic() - began, len(records), self.topic, len(self._announced),
            len(self._dead), self.dead_letter_topic, self.reader.stream,
        )

    def _read_dead_letters(self, timeout: float = 10.0) -> set[DeadKey]:
        seen: set[DeadKey] = set()
        topic = self.dead_letter_topic
        with Reader(self.bootstrap, self.config, [TopicPartition(topic, 0, 0)],
                    name=f"dead-letter topic '{topic}'") as reader:
            try:
                for msg in reader.iter_to_end(timeout):
                    try:
                        d = json.loads(msg.value() or b"")
                        if d.get("substream") == self.substream:
                            seen.add((str(d["stream"]), int(d["partition"]), int(d["offset"])))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # someone else's dead letter
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
        late = False
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
                late = self._dead_letter(ev) or late
        for bad in self.reader.malformed:
            late = self._malformed(bad) or late
        self.reader.malformed.clear()
        if late:
            self._dlq.flush(10)
        if time.monotonic() - self._last_heartbeat >= self.config.acker.heartbeat_ms / 1000:
            self._last_heartbeat = time.monotonic()
            update = self.tracker.pending_update()
            if update is not None:
                items.append((self.topic, update))
        if items:
            self.writer.write(items)
            TRAFFIC.add(CONTROL_WRITTEN, self.substream, len(items))
        if self.on_terminated is not None:
            for ev in done:
                self.on_terminated(ev)
        if self._gauges_due.due():
            self._export_gauges()
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

    def _dead_letter(self, ev: Late) -> bool:
        e = ev.entry
        self.late += 1
        return self._write_dead(ev.reason, e.partition, e.index, {})

    def _malformed(self, bad: Malformed) -> bool:
        """An undecodable data-topic message: dead-lettered with the reason and the raw
        bytes (base64), like the acker's ``malformed`` dead letters."""
        self.malformed += 1
        extra = {"detail": bad.reason, "raw": base64.b64encode(bad.raw).decode()}
        return self._write_dead("malformed", bad.partition, bad.offset, extra)

    def _write_dead(self, reason: str, partition: int, offset: int, extra: dict[str, str]) -> bool:
        key = (self.reader.stream, partition, offset)
        if key in self._dead:  # written before a restart
            return False
        self._dead.add(key)
        value = {
            "reason": reason,
            "stream": self.reader.stream,
            "partition": partition,
            "offset": offset,
            "substream": self.substream,
            **extra,
        }
        log.warning("dead letter: %s at %s[%d]@%d%s", reason, self.reader.stream, partition,
                    offset, f": {extra['detail']}" if "detail" in extra else "")
        self._dlq.produce(self.dead_letter_topic, json.dumps(value).encode(), partition=0)
        metrics.DEAD_LETTERS.labels(self.writer_name, reason).inc()
        return True

    def run(self, stop: threading.Event) -> None:
        """Align until ``stop`` is set."""
        while not stop.is_set():
            self.step()

    def close(self) -> None:
        self.reader.close()
        self.writer.close()
        self._dlq.flush(10)

    def __enter__(self) -> PunctuationAligner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
