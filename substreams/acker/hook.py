"""The acker's publisher hook: a publisher becomes a registered SOURCE of its substreams.

The ``acker`` entry of the composition root's mechanisms (:mod:`substreams.app`). Per record it
reports SND at the record's time in each acker substream of the stream; when the stream is
terminal in that substream's segment (no stage reads it: the topic is the sink) the record is
sent and received at once, and the delivery callback reports both, with the record's count and
offset (its SND and RCV cancel in the XOR, so the id is not even carried). Everything
aggregated since the last commit is written to the acks topic *inside* the publisher's
transaction, right before it commits (:meth:`AckerHook.before_commit`): records, their reports
and the seals made after them become visible together or not at all. A seal of ``t`` (this
source writes no more records at times ``<= t``, downward closed) goes out with the commit that
follows it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from substreams.acker.agent import TrackingAgent, encode_ack
from substreams.acker.table import SOURCE, Segment
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.write import produce
from substreams.streams.publisher import Publisher, PublishHook, transactional_id
from substreams.streams.records import SentRecord


def write_agent(publisher: Publisher, agent: TrackingAgent) -> None:
    """Write what ``agent`` aggregated into ``publisher``'s open transaction."""
    for partition, msg in agent.take():
        publisher.produce_aside(
            agent.topic, encode_ack(msg), partition=partition, headers=agent.headers
        )


class Heartbeat:
    """Says "alive" for an idle source: a SourceHeartbeat of its incarnation to every acks
    partition it committed nothing to for ``source_heartbeat_ms`` (per partition: a source
    that commits only about the segments of one partition is idle on the others, and the
    acker shard owning those must hear it too).  Outside the publisher's transactions (an
    idle publisher has none; another thread must not write into the caller's), with a small
    producer of its own.  A stopped process (SIGSTOP, a long GC pause) stops heartbeating
    too, which is the point: the acker evicts what it cannot hear.  It runs on the
    publisher's ticker (the thread that also seals for an idle publisher with a seal
    policy), never taking the publisher's lock."""

    def __init__(self, publisher: Publisher, agent: TrackingAgent) -> None:
        self.agent = agent
        self.interval = publisher.config.acker.source_heartbeat_ms / 1000.0
        no_linger: dict[str, Any] = {"linger.ms": 0}
        self._producer = client.producer(publisher.bootstrap, publisher.config, **no_linger)
        self._closed = False
        self._cancel = publisher.ticker.every(self.interval / 4, self._beat)

    def touch(self) -> None:
        """A commit just proved the source alive (on the partitions it wrote: the agent
        keeps when it last handed messages for each)."""

    def _beat(self) -> None:
        due = self.agent.heartbeat_due(time.monotonic(), self.interval)
        if not due or self._closed:
            return
        value = encode_ack(self.agent.heartbeat_message())
        for partition in due:
            produce(
                self._producer, self.agent.topic, value,
                partition=partition, headers=self.agent.headers,
            )
        self._producer.poll(0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel()
        self._producer.flush(2)


class AckerHook(PublishHook):
    """Tracking for one publisher (one source incarnation) over its stream's acker
    substreams."""

    def __init__(
        self, publisher: Publisher, substreams: list[str], *, evict_when_silent: bool = True
    ) -> None:
        """``evict_when_silent=False``: the acker never evicts this source for silence (see
        :func:`substreams.app.never_evicted`)."""
        self.substreams = list(substreams)
        self.stream = publisher.stream
        self.terminal = [
            s
            for s in self.substreams
            if publisher.stream in Segment.of(publisher.config, s).terminal
        ]
        # A terminal record's SND+RCV (and offset) comes from its delivery callback; only
        # the other substreams' SNDs are reported when it is sent.
        self.sent = [s for s in self.substreams if s not in self.terminal]
        self.wants_delivery = bool(self.terminal)
        # All terminal (the common publisher): nothing to report when a record is sent,
        # so the publisher need not call on_send per record.
        self.wants_send = bool(self.sent)
        self.agent = TrackingAgent(publisher.config, publisher.source_id, publisher.incarnation)
        # Written by the publisher's first commit (at the end of its constructor).
        self.agent.register(
            self.substreams, SOURCE, transactional_id(publisher.stream, publisher.source_id),
            evict_when_silent,
        )
        self.heartbeat = Heartbeat(publisher, self.agent)

    def on_send(self, record: SentRecord) -> None:
        if self.sent:
            times = record.times
            self.agent.report_many((s, times[s], record.tracking_id) for s in self.sent)

    def on_delivered(self, record: SentRecord, offset: int) -> None:
        for s in self.terminal:
            self.agent.sent_and_delivered(
                s, record.times[s], record.stream, record.partition, offset
            )

    def on_send_many(self, records: Sequence[SentRecord]) -> None:
        """A batch's SNDs, aggregated per run of equal times."""
        for s in self.sent:
            self.agent.report_sent(s, records)

    def on_delivered_many(self, records: Sequence[SentRecord], offsets: Sequence[int]) -> None:
        """A batch's terminal SND+RCVs (counts and offset hulls), per run of equal times."""
        for s in self.terminal:
            self.agent.sent_and_delivered_many(s, records, offsets)

    def on_delivered_columns(
        self,
        records: Sequence[SentRecord],
        partitions: Sequence[int],
        offsets: Sequence[int],
        times: Mapping[str, Sequence[Time]],
    ) -> None:
        """The same SND+RCVs handed to the agent as columns (its block is packed from
        them at one record per time: no object per time).  A substream without a time
        column from the publisher (``publish``, or several substreams) gets one here."""
        stream = self.stream
        for s in self.terminal:
            column = times.get(s)
            if column is None:
                column = [r.times[s] for r in records]
            self.agent.sent_and_delivered_columns(s, stream, column, partitions, offsets)

    def seal(self, publisher: Publisher, substream: str, time: Time) -> None:
        self.agent.seal(substream, time)

    def seal_keys(self, publisher: Publisher, substream: str, upto: int) -> None:
        self.agent.seal_keys(substream, upto)

    def before_commit(self, publisher: Publisher) -> None:
        write_agent(publisher, self.agent)

    def on_commit(self, publisher: Publisher) -> None:
        """The reports were committed with the records; the commit proves liveness."""
        self.heartbeat.touch()

    def close(self, publisher: Publisher) -> None:
        """Leave with the publisher's final commit (after its last reports)."""
        self.heartbeat.close()
        self.agent.unregister(self.substreams)

    def abort(self, publisher: Publisher) -> None:
        """The reports and seals belong to the dropped transaction: discarded.  Still
        registered, so the acker keeps this source's times open until a publisher of the
        same source seals them (or the source is evicted for silence)."""
        self.heartbeat.close()
        self.agent.discard()
