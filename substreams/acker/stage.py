"""A configured Python stage: consume a stream, transform, publish, and report to the acker.

Why the stage reports RCV(input) XOR SND(outputs) as one unit: the acker must never see the
input received before its outputs were sent, or the XOR of the time could reach zero while
outputs are still in flight.  Its output publisher's :class:`~substreams.acker.tracker.
Tracker` (role STAGE) aggregates both -- the outputs' SNDs as they are published, the
input's RCV after its transform (:meth:`~substreams.acker.tracker.Tracker.received`) -- and
writes them inside the outputs' transaction (one acks message per step), so they become
visible exactly with the outputs.  Outputs keep the input record's times (the substream a
record belongs to does not change along the pipeline), so the acker's table for that time
covers the whole segment.  When the output stream is terminal in a segment (no stage reads
it) the stage is the sink's writer: the outputs' delivery reports their SND and RCV at once,
with the record count and the offsets.

The stage registers with role STAGE: it never seals, and the acker does not wait for it to.
A cycle (``input == output``) needs nothing special: the transform must stop emitting at
some point (e.g. a counter in the payload), then the XOR reaches zero.

Exactly once across restarts: the stage's input positions are committed *in its output
transaction* (``send_offsets_to_transaction``, consumer group ``substreams.stage.<name>``,
never joined: the partitions are assigned), together with the outputs and the reports.  A
restarted stage (a new incarnation, which fences the old one) resumes from the committed
positions: an input whose outputs committed is never processed again, one whose outputs were
aborted is processed again, and its reports went with the outputs either way.
Stage outputs carry the input's order keys as they come; the publisher's per-source
order-key check is not applied to them (inputs of several partitions interleave).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import TopicPartition

from substreams import metrics
from substreams.acker.table import acker_segments
from substreams.acker.tracker import stage_writer
from substreams.config import Config, StageConfig
from substreams.errors import DecodeError, SubstreamsError
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.kafka.read import Reader
from substreams.streams.badrecords import BadRecords
from substreams.streams.deadletter import DeadLetterWriter
from substreams.streams.listener import StreamDecoder
from substreams.streams.records import Entry

log = logging.getLogger(__name__)

Transform = Callable[[Entry], Iterable[Mapping[str, Any]]]


def stage_config(config: Config, name: str) -> StageConfig:
    for st in config.stages:
        if st.name == name:
            return st
    known = ", ".join(s.name for s in config.stages) or "(none)"
    raise SubstreamsError(f"no stage named '{name}' in {config.path}; known: {known}")


class Stage:
    """Runs the configured stage ``name`` with the user function ``transform``."""

    def __init__(
        self,
        config: Config,
        name: str,
        transform: Transform,
        *,
        bootstrap: str | None = None,
        start_offsets: Mapping[int, int] | None = None,
        max_batch: int = 500,
    ) -> None:
        self.config = config
        self.stage = stage_config(config, name)
        self.transform = transform
        self.max_batch = max_batch
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.source_id = f"stage.{name}"
        segments = [s for s in acker_segments(config).values() if self.stage.input in s.streams]
        self.substreams = [s.substream for s in segments]
        # The stage commits its outputs itself, once per input batch.
        self.output, self.tracker = stage_writer(
            config, self.stage.output, self.source_id, self.substreams,
            bootstrap=self.bootstrap, inherited_times=True,
        )
        self.out_partitions = self.output.partitions
        self.decoder = StreamDecoder(config, self.stage.input)
        self.group = f"substreams.stage.{name}"
        self.reader = Reader(
            self.bootstrap, config, name=f"stage '{name}': input '{self.stage.input}'",
            **{"group.id": self.group},
        )
        self.consumer = self.reader.consumer  # the group's committed offsets and metadata
        parts = config.stream(self.stage.input).partitions
        starts = dict(start_offsets or {})
        committed = self.reader.committed(
            [TopicPartition(self.stage.input, p) for p in range(parts)]
        )
        for tp in committed:
            if tp.offset >= 0 and tp.partition not in starts:
                starts[tp.partition] = tp.offset
        self.reader.assign(
            [TopicPartition(self.stage.input, p, int(starts.get(p, 0))) for p in range(parts)]
        )
        log.info(
            "stage '%s' started (incarnation %s): input '%s' from offsets %s (committed by "
            "group '%s'; a record after them whose outputs were not committed is processed "
            "again), output '%s'", name, self.output.incarnation, self.stage.input,
            {p: int(starts.get(p, 0)) for p in range(parts)}, self.group, self.stage.output,
        )
        self._positions: dict[int, int] = {}
        self._gauges_due = metrics.Periodic(1.0)
        self._records_in = metrics.RECORDS.labels("stage", name, "in")
        self._records_out = metrics.RECORDS.labels("stage", name, "out")
        self.processed = 0
        self.emitted = 0
        self.dead_letters = 0
        # in the output's transaction: committed exactly with the input offsets past them
        # (so a stage dead-letters a bad record exactly once, across restarts too)
        self.bad = BadRecords(config, self.source_id, writer=DeadLetterWriter(
            config, self.source_id, publisher=self.output))
        self._closed = False

    def step(self, timeout: float = 0.1) -> int:
        """Process one batch of input records; returns how many were consumed."""
        msgs = self.reader.poll_batch(timeout, self.max_batch)
        n = 0
        subs = self.substreams
        for msg in msgs:
            self._positions[msg.partition()] = msg.offset() + 1
            try:
                entry = self.decoder.decode(msg)
            except DecodeError as exc:  # on_bad_record: dead-lettered, or BadRecordError
                self.bad.message(msg, exc)
                self.dead_letters += 1
                continue
            self.bad.good()
            if not isinstance(entry, Entry):
                continue
            n += 1
            partition = entry.partition % self.out_partitions
            for payload in self.transform(entry):
                # its SND (or, to a terminal output, SND+RCV on delivery): the tracker's
                self.output.publish(
                    payload, partition=partition, times=entry.times, check_order=False
                )
                self.emitted += 1
                self._records_out.inc()
            # Written with the outputs' commit: RCV(input) then means "done with, outputs
            # durable", and it travels in the same report as the outputs' SNDs.
            if self.tracker is not None:
                self.tracker.received(
                    (s, entry.times[s], entry.tracking_id) for s in subs if s in entry.times
                )
        if msgs:  # also a batch of only dead letters / punctuations: not read again
            self.output.send_offsets(
                [TopicPartition(self.stage.input, p, o) for p, o in self._positions.items()],
                self.consumer.consumer_group_metadata(),
            )
            self.output.commit()
        if n:
            self.processed += n
            self._records_in.inc(n)
        if self._gauges_due.due():
            metrics.record_lag("stage", self.stage.name, self.reader.lag())
        return n

    def run(self, stop: threading.Event) -> None:
        """Process until ``stop`` is set, then close."""
        try:
            while not stop.is_set():
                self.step(0.1)
        finally:
            self.close()

    def run_until_idle(self, seconds: float = 1.0, timeout: float = 60.0) -> int:
        """Process until no input arrived for ``seconds``; returns records processed."""
        start = self.processed
        deadline, idle = Deadline(timeout), Deadline(seconds)
        while True:  # one step at least: a zero ``seconds`` still processes what is there
            if self.step(0.1):
                idle.restart()
            if deadline.passed or idle.passed:
                return self.processed - start

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        log.info("stage '%s' stopped after %d records in, %d out, %d dead letters",
                 self.stage.name, self.processed, self.emitted, self.dead_letters)
        try:
            self.output.close()  # the tracker's Unregister goes with the final commit
        finally:
            self.reader.close()

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
