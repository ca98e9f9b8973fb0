"""The acker's publisher hook: a publisher becomes a registered SOURCE of its substreams.

Registered as ``HOOK_FACTORIES["acker"]``.  Per record it reports SND at the record's time in
each acker substream of the stream; when the stream is terminal in that substream's segment
(no stage reads it: the topic is the sink) the record is sent and received at once, and the
delivery callback reports both, with the record's count and offset (its SND and RCV cancel
in the XOR, so the id is not even carried).  Everything aggregated since the last commit is
written to the acks topic *inside* the publisher's transaction, right before it commits
(:meth:`AckerHook.before_commit`): records, their reports and the seals made after them
become visible together or not at all.  A seal of ``t`` (this source writes no more records
at times ``<= t``, downward closed) goes out with the commit that follows it.
"""

from __future__ import annotations

from substreams.acker.agent import TrackingAgent, encode_ack
from substreams.acker.table import SOURCE, Segment
from substreams.frontier import Time
from substreams.streams.publisher import HOOK_FACTORIES, Publisher
from substreams.streams.records import SentRecord


def write_agent(publisher: Publisher, agent: TrackingAgent) -> None:
    """Write what ``agent`` aggregated into ``publisher``'s open transaction."""
    for msg in agent.take():
        publisher.produce_aside(
            agent.topic, encode_ack(msg), partition=agent.partition, headers=agent.headers
        )


class AckerHook:
    """Tracking for one publisher (one source incarnation) over its stream's acker
    substreams."""

    def __init__(self, publisher: Publisher, substreams: list[str]) -> None:
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
        self.agent = TrackingAgent(publisher.config, publisher.source_id, publisher.incarnation)
        # Written by the publisher's first commit (at the end of its constructor).
        self.agent.register(self.substreams, SOURCE)

    def on_send(self, record: SentRecord) -> None:
        if self.sent:
            times = record.times
            self.agent.report_many((s, times[s], record.tracking_id) for s in self.sent)

    def on_delivered(self, record: SentRecord, offset: int) -> None:
        for s in self.terminal:
            self.agent.sent_and_delivered(
                s, record.times[s], record.stream, record.partition, offset
            )

    def seal(self, publisher: Publisher, substream: str, time: Time) -> None:
        self.agent.seal(substream, time)

    def before_commit(self, publisher: Publisher) -> None:
        write_agent(publisher, self.agent)

    def on_commit(self, publisher: Publisher) -> None:
        """Nothing: the reports were committed with the records."""

    def close(self, publisher: Publisher) -> None:
        """Leave with the publisher's final commit (after its last reports)."""
        self.agent.unregister(self.substreams)

    def abort(self, publisher: Publisher) -> None:
        """The reports and seals belong to the dropped transaction: discarded.  Still
        registered, so the acker keeps this source's times open until a publisher of the
        same source seals them (or the source is evicted for silence)."""
        self.agent.discard()


def _factory(publisher: Publisher, substreams: list[str]) -> AckerHook:
    return AckerHook(publisher, substreams)


HOOK_FACTORIES["acker"] = _factory
