"""The one tracker: what a tracked writer tells the acker, for every role that writes.

A publisher's source, a Python stage's output and a Spark write unit all do the same thing
for the acker: report SND and RCV of the records they write, XOR-aggregated per
(substream, time) (:class:`~substreams.acker.agent.TrackingAgent`), and hand the resulting
acks messages (:mod:`~substreams.acker.protocol`) to their publisher to write *inside the
transaction* that holds the records -- so a crash loses a record with its report or
neither.  :class:`Tracker` is that, for a role:

* ``SOURCE`` (a publisher; a Spark query's driver with ``evict_when_silent=False``): seals,
  registers its transactional id (fenced when it is evicted), heartbeats when idle
  (:class:`Heartbeat`, attached by :func:`source_tracker`).
* ``STAGE`` (a Python stage's output, a Spark write unit): never seals, is never waited for;
  a stage also reports RCV of what it consumed (:meth:`Tracker.received`).

Per record, in each tracked substream: when the stream is *terminal* in the substream's
segment (no stage reads it), the writer both sends and delivers the record, and the
delivery reports both with the record's count and offset (the ids cancel, so none is
carried; the columnar path packs a block straight from the publisher's columns); otherwise
the record is sent (SND) and its reader will RCV it.  What the three roles wrote before --
the same reports, the same messages in the same transactions -- is unchanged: Register in
the writer's first commit, reports and seals in the commit of the records they are about,
Unregister in the last.

The tracker calls no broker (it is pure but for the clock its seals are stamped with):
:meth:`before_commit` returns the encoded messages as :class:`~substreams.streams.
publisher.Write` values for the publisher to produce.  The heartbeat is the one piece of
I/O, outside any transaction, and lives beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from substreams.acker.agent import TrackingAgent
from substreams.acker.protocol import SOURCE, STAGE, encode_ack
from substreams.acker.table import Segment
from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.write import produce
from substreams.streams.publisher import Ending, Publisher, Write, transactional_id
from substreams.streams.records import SentRecord

__all__ = ["SOURCE", "STAGE", "Heartbeat", "Tracker", "source_tracker", "stage_writer"]


class Tracker:
    """The acker's :class:`~substreams.streams.publisher.PublishHook` for one writer (one
    incarnation of a source id) over ``substreams`` of its ``stream``, in ``role``."""

    def __init__(
        self,
        config: Config,
        stream: str,
        source: str,
        incarnation: str,
        substreams: Iterable[str],
        role: str = SOURCE,
        *,
        writer: str = "",
        evict_when_silent: bool = True,
        inherited_times: bool = False,
    ) -> None:
        """``writer``: the transactional id the acker fences when it evicts this source;
        ``evict_when_silent=False``: only an operator evicts it (see
        :func:`substreams.app.never_evicted`); ``inherited_times``: the records carry their
        input's times (a stage), which a record written upstream by another kind of writer
        may lack in a substream: such a record is not reported there.  The Register goes
        out with the writer's next commit, which must come before any record (the
        publisher's first)."""
        if role not in (SOURCE, STAGE):
            raise SubstreamsError(f"a tracker's role is SOURCE or STAGE, not {role!r}")
        self.role = role
        self.stream = stream
        self.substreams = list(substreams)
        self.terminal = [s for s in self.substreams if stream in Segment.of(config, s).terminal]
        self.sent_in = [s for s in self.substreams if s not in self.terminal]
        self.wants_send = bool(self.sent_in)
        """All terminal (the common publisher): nothing to report when a record is sent."""
        self.wants_delivery = bool(self.terminal)
        self.exact = not inherited_times
        """Every record carries a time in every tracked substream (its writer's own) but
        one late for a substream under ``late: dead_letter``, which has none there (found
        when a column is built: the common batch pays no check per record)."""
        self.agent = TrackingAgent(config, source, incarnation)
        self.agent.register(self.substreams, role, writer, evict_when_silent)
        self.on_release: Callable[[], None] | None = None
        """Called once when the writer lets go (before its final commit, or on an abort):
        the source's heartbeat stops there."""

    # -- reports -------------------------------------------------------------------------

    def sent(self, records: Sequence[SentRecord]) -> None:
        """SND of each record in the substreams where a stage reads it."""
        agent = self.agent
        for s in self.sent_in:
            if self.exact:
                agent.report_sent(s, records)
            else:
                agent.report_many(
                    (s, r.times[s], r.tracking_id) for r in records if s in r.times
                )

    def delivered(
        self,
        records: Sequence[SentRecord],
        partitions: Sequence[int],
        offsets: Sequence[int],
        times: Mapping[str, Sequence[Time]],
    ) -> None:
        """SND+RCV of each record in the substreams where its stream is terminal, with
        its offset, as columns (a block is packed from them at one record per time: no
        object per time).  A substream without a time column from the publisher gets one
        here."""
        stream = self.stream
        for s in self.terminal:
            column = times.get(s)
            parts, offs = partitions, offsets
            if column is None:
                keep = None if self.exact else [i for i, r in enumerate(records) if s in r.times]
                if keep is None:
                    try:
                        column = [r.times[s] for r in records]
                    except KeyError:  # a record late for s (kept out of it): not reported
                        keep = [i for i, r in enumerate(records) if s in r.times]
                if keep is not None and len(keep) < len(records):
                    parts = [partitions[i] for i in keep]
                    offs = [offsets[i] for i in keep]
                    column = [records[i].times[s] for i in keep]
                elif column is None:
                    column = [r.times[s] for r in records]
            self.agent.sent_and_delivered_columns(s, stream, column, parts, offs)

    def received(self, items: Iterable[tuple[str, Time, int]]) -> None:
        """RCV of records this writer consumed, as (substream, time, tracking id): a
        stage's input, done with once its outputs commit in the same transaction."""
        self.agent.report_many(items)

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]:
        """Kept for the next commit's report (after that commit's records): nothing to
        write now.  A STAGE never seals: its outputs keep their inputs' times."""
        if self.role != SOURCE:
            raise SubstreamsError(
                f"'{self.agent.source}' writes as a stage: it does not seal (its source does)"
            )
        if every_key:
            assert type(time) is int
            self.agent.seal_keys(substream, time)
        else:
            self.agent.seal(substream, time)
        return ()

    # -- the writer's transactions ---------------------------------------------------------

    def before_commit(self, last: bool) -> list[Write]:
        """Everything aggregated since the writer's previous commit, as acks messages for
        this commit; with ``last``, the Unregister after them (the heartbeat stopped first,
        so that none follows the Unregister)."""
        if last:
            self._release()
            self.agent.unregister(self.substreams)
        agent = self.agent
        topic, headers = agent.topic, agent.headers
        return [Write(topic, value, p, headers) for p, _, value in agent.take_encoded()]

    def ended(self, how: Ending) -> None:
        """After a commit: nothing (its reports were in it).  Aborted: what the dropped
        transaction would have carried never happened.  The source stays registered, so
        the acker keeps its times open until a publisher of the same source seals them
        (or it is evicted for silence)."""
        if how == "aborted":
            self._release()
            self.agent.discard()

    def _release(self) -> None:
        release, self.on_release = self.on_release, None
        if release is not None:
            release()


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
        self._clock = publisher.clock
        self._producer = publisher.producers(publisher.bootstrap, publisher.config, **no_linger)
        self._closed = False
        self._cancel = publisher.ticker.every(self.interval / 4, self._beat)

    def _beat(self) -> None:
        due = self.agent.heartbeat_due(self._clock.monotonic(), self.interval)
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
        # Called inside the publisher's final commit: a lost heartbeat is harmless there
        # (the Unregister follows), an exception would fail that commit.
        client.flush_at_close(self._producer, "source heartbeat", 2)


def source_tracker(
    publisher: Publisher, substreams: list[str], *, evict_when_silent: bool = True
) -> Tracker:
    """The ``acker`` mechanism of the composition root (:mod:`substreams.app`): the
    publisher becomes a registered SOURCE of ``substreams``, heartbeating while idle."""
    tracker = Tracker(
        publisher.config, publisher.stream, publisher.source_id, publisher.incarnation,
        substreams, SOURCE, writer=transactional_id(publisher.stream, publisher.source_id),
        evict_when_silent=evict_when_silent,
    )
    tracker.on_release = Heartbeat(publisher, tracker.agent).close
    return tracker


def stage_writer(
    config: Config,
    stream: str,
    source_id: str,
    substreams: Iterable[str],
    *,
    bootstrap: str | None = None,
    inherited_times: bool = False,
    batch_size: int = 1 << 62,
) -> tuple[Publisher, Tracker | None]:
    """A writer the acker tracks as a STAGE (a Python stage's output, a Spark write unit):
    its publisher, whose start fences every earlier incarnation of ``source_id``, and its
    tracker over ``substreams`` (None when there are none), with the Register committed
    before any record.  The one place such a writer is put together, so a stage and a
    Spark unit cannot drift apart in what they register or when.  ``batch_size``: the
    caller commits itself (once per input batch, once per unit)."""
    names = list(substreams)
    publisher = Publisher(
        config, stream, source_id, bootstrap=bootstrap, mechanisms={}, batch_size=batch_size
    )
    try:
        if not names:
            return publisher, None
        tracker = Tracker(
            config, stream, source_id, publisher.incarnation, names, STAGE,
            inherited_times=inherited_times,
        )
        publisher.add_hook(tracker)
        publisher.commit()  # the Register, before any report
        return publisher, tracker
    except BaseException:
        publisher.abort()
        raise
