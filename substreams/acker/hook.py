"""The acker's publisher hook: a publisher becomes a registered SOURCE of its substreams.

Registered as ``HOOK_FACTORIES["acker"]``.  Per record it reports SND at the record's time in
each acker substream of the stream; when the stream is terminal in that substream's segment
(no stage reads it: the topic is the sink) the record is sent and received at once, and the
delivery callback reports both, with the record's count and offset (its SND and RCV cancel
in the XOR, so the id is not even carried).  Everything is held until the transaction
commits (``on_commit``): uncommitted records are invisible, so there is nothing to announce
before -- a source's whole contribution to a time travels in one message, with its seal.
A seal of ``t`` (this source writes no more records at times ``<= t``, downward closed) goes
out with the commit that follows it.
"""

from __future__ import annotations

from substreams.acker.agent import TrackingAgent
from substreams.acker.table import SOURCE, Segment
from substreams.frontier import Time
from substreams.streams.publisher import HOOK_FACTORIES, Publisher
from substreams.streams.records import SentRecord


class AckerHook:
    """Tracking for one publisher (one source) over its stream's acker substreams."""

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
        self.agent = TrackingAgent(
            publisher.config, publisher.source_id, bootstrap=publisher.bootstrap
        )
        self.agent.register(self.substreams, SOURCE)
        self._closed = False

    def on_send(self, record: SentRecord) -> None:
        if self.sent:
            times = record.times
            self.agent.report_many(
                ((s, times[s], record.tracking_id) for s in self.sent), held=True
            )

    def on_delivered(self, record: SentRecord, offset: int) -> None:
        for s in self.terminal:
            self.agent.sent_and_delivered(
                s, record.times[s], record.stream, record.partition, offset
            )

    def seal(self, publisher: Publisher, substream: str, time: Time) -> None:
        self.agent.seal_on_release(substream, time)

    def on_commit(self, publisher: Publisher) -> None:
        if not self._closed:
            self.agent.release_held()

    def close(self, publisher: Publisher) -> None:
        self._closed = True
        self.agent.release_held()
        self.agent.unregister(self.substreams)
        self.agent.close()

    def abort(self, publisher: Publisher) -> None:
        """The held reports and seals belong to the dropped transaction: discarded.  Still
        registered, so the acker keeps this source's times open until a publisher of the
        same source seals them."""
        self._closed = True
        self.agent.discard_held()
        self.agent.close()


def _factory(publisher: Publisher, substreams: list[str]) -> AckerHook:
    return AckerHook(publisher, substreams)


HOOK_FACTORIES["acker"] = _factory
