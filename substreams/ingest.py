"""``substreams ingest``: follow an existing topic into a tracked stream, exactly once.

Why an ingest and not tracking in place: a stream's readers (Spark firm reads,
``notifications()``, ``tail``, stages, the dashboard) read *data topics*, whose records carry
the envelope with each record's time in every substream and its tracking id.  Copying the
foreign topic into such a stream lets all of them work unchanged; tracking in place would
need a second reader path for every one of them (docs/design.md, "Any producer: a stream
over an existing topic", has the measured costs of both).

The unit is the **input partition**.  Input partition ``p`` is one source of the stream,
``ingest.<p>``, with a publisher of its own (its transactional id fences any earlier process
following ``p``) writing into stream partition ``p % partitions``.  Each of its transactions
holds, atomically:

* the records read from ``p`` since the last commit (bad ones as dead letters naming
  ``topic[p]@offset``, late ones as dead letters naming the substreams they missed),
* the acker's reports of them and the seals of ``p``'s seal policy,
* ``p``'s next input offset, committed to the group ``substreams.ingest.<stream>`` through
  ``send_offsets_to_transaction`` -- with, in the offset's *metadata*, the policy's state
  (watermark and seals per substream).

So a SIGKILL at any point loses the open transaction whole and a restart resumes at the
committed offset with the seals it had promised: no record twice, none lost, no record
written into a time it sealed, the same windows notified once.  Why one source per input
partition: a seal policy promises "no more below W" from one ordered sequence; Kafka orders
within a partition only, so the watermark of a topic is per partition, and a quiet
partition is idle on its own (``idle_ms``) without holding the others.

Scale-out: ``--instances N --instance I`` follows the partitions ``p % N == I`` (static
assignment, not a consumer group).  Why static: a source's identity (its transactional id,
its registration with the acker, its seals) is the partition's, whoever follows it, so
moving a partition needs nothing handed over; a group rebalance would move partitions under
a live transaction and save nothing -- a dead instance's partitions wait for its restart
(or its eviction) either way.  Two instances given the same partition fence each other.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message, TopicPartition

from substreams.app import Application
from substreams.config import Config, StreamConfig
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.kafka.read import Reader
from substreams.streams.badrecords import BadRecords
from substreams.streams.deadletter import DeadLetterWriter, late_letter
from substreams.streams.foreign import (
    REASON_MISFIT,
    ForeignDecoder,
    ForeignPayloadError,
    SchemaLookup,
)
from substreams.streams.policy import PolicySeal, SealClock
from substreams.streams.publisher import Publisher
from substreams.streams.times import TimeAssigner
from substreams.streams.validate import payload_mismatch

log = logging.getLogger(__name__)

NEVER = 1 << 40
"""The publishers' ``batch_size``: they never commit on their own (every commit carries the
input offsets)."""

STATE_VERSION = 1

COMMIT_MS = 250
"""How long read records may wait in a partition's open transaction when no seal moved (a
seal commits at once, with every record before it): a commit per poll would cost a
transaction, an offset commit and their markers per partition per few milliseconds."""
MAX_PENDING = 5_000
"""A partition's open transaction commits once it holds this many records, whatever else."""
LINGER_MS = 10
"""How long a step gathers records after the first one came: on a live topic records come a
few at a time, and a step per record or two costs more than the records (a poll, a run, the
commit checks).  At most this much latency."""
FETCH_WAIT_MS = 100
"""How long the broker holds a fetch of the foreign topic that finds nothing new.  Not a
latency: a fetch returns as soon as a record is there (``fetch.min.bytes`` 1); the
readers' default here (10 ms) has a caught-up ingest fetch 100 times a second: at 2,000
records/s, 233 -> 183 µs of the ingest's CPU per record (profiled, load ~8)."""


def source_id(partition: int) -> str:
    """The source that follows input partition ``partition`` (whatever instance runs it)."""
    return f"ingest.{partition}"


def group_id(stream: str) -> str:
    """The consumer group whose committed offsets are the ingest's input positions."""
    return f"substreams.ingest.{stream}"


def owned(partitions: int, instance: int, instances: int) -> list[int]:
    """The input partitions instance ``instance`` of ``instances`` follows."""
    if instances < 1 or not 0 <= instance < instances:
        raise SubstreamsError(
            f"instance {instance} of {instances}: an instance is 0..instances-1"
        )
    return [p for p in range(partitions) if p % instances == instance]


@dataclass
class Counts:
    """What one input partition's follower did (progress lines, tests, the benchmark)."""

    records: int = 0
    """Records read from the topic."""
    written: int = 0
    """Records written to the stream (on time in at least one substream)."""
    bad: int = 0
    """Dead-lettered: not a payload of the stream's schema."""
    late: dict[str, int] = field(default_factory=dict)
    """Per substream: records kept out of it because it was sealed (dead-lettered)."""
    commits: int = 0


class PartitionFollower:
    """Input partition ``partition``: its publisher, seal clocks and position."""

    def __init__(self, ingest: Ingest, partition: int) -> None:
        self.ingest = ingest
        self.partition = partition
        self.out_partition = partition % ingest.stream.partitions
        self.source = source_id(partition)
        policies = {s.name: None for s in ingest.config.substreams_of(ingest.stream.name)}
        # Manual seals: the follower seals from its own clocks, inside its own commits.
        self.publisher: Publisher = ingest.app.publisher(
            ingest.stream.name, self.source, batch_size=NEVER, seal_policies=policies
        )
        now = ingest.app.clock.now_ms()
        self.clocks: dict[str, SealClock] = {
            s.name: SealClock(s, s.seal, now)
            for s in ingest.config.substreams_of(ingest.stream.name)
            if s.seal is not None and s.kind != "per_key"
        }
        self.assigners: list[tuple[str, TimeAssigner]] = list(self.publisher.assigners.items())
        self.fields = {
            name: a.substream.field or ingest.stream.order_key or "" for name, a in self.assigners
        }
        self.letters = DeadLetterWriter(
            ingest.config, f"ingest:{ingest.stream.name}/{partition}", publisher=self.publisher
        )
        self.bad = BadRecords(ingest.config, self.letters.service, writer=self.letters)
        self.position = 0
        self.pending = 0
        """Records read into the open transaction."""
        self.opened_at: float | None = None
        """When the open transaction got its first record (monotonic s)."""
        self.dirty = True
        """Something waits for a commit though no record came: at first, the partition's
        offset (so that every instance sees it is followed: :meth:`Ingest.all_followed`)."""
        self.held: dict[str, tuple[int, int]] = {}
        """The first and the highest event time per substream seen before sealing was
        allowed (the first: the policy sends no seal below its window)."""
        self.counts = Counts()
        log.info("%s: registered (incarnation %s)", self.source, self.publisher.incarnation)

    # -- state in the committed offset's metadata ----------------------------------------

    def state(self) -> str:
        return json.dumps(
            {"v": STATE_VERSION, "clocks": {n: c.state() for n, c in self.clocks.items()}},
            separators=(",", ":"),
        )

    def restore(self, metadata: str | None) -> None:
        """Continue what the previous process following this partition promised."""
        if not metadata:
            return
        try:
            data = json.loads(metadata)
            clocks = data["clocks"]
        except (ValueError, KeyError, TypeError):
            log.warning("%s: committed metadata %r is not an ingest state; starting without "
                        "its seals", self.source, metadata[:80])
            return
        now = self.ingest.app.clock.now_ms()
        for name, raw in clocks.items():
            clock = self.clocks.get(name)
            if clock is None:
                continue
            watermark, sealed, first = raw
            clock.restore((watermark, sealed, first), now)
            if sealed is not None:
                assigner = self.publisher.assigners[name]
                if clock.substream.kind == "session":
                    assigner.seal_keys(int(sealed))
                else:
                    assigner.seal(int(sealed))

    # -- records -------------------------------------------------------------------------

    def take(self, msgs: Sequence[Message]) -> None:
        """This partition's records of one poll, into the open transaction, in order.

        The seal policy moves record by record, as the publisher's does: a record whose
        event time moves a seal first has the records before it written (a seal rides after
        the records it covers), so a later record of a window it sealed is late, in one
        poll as across polls."""
        topic = self.ingest.topic
        run: list[dict[str, Any]] = []
        keys: list[bytes | None] = []
        offsets: list[int] = []
        sealing = self.ingest.sealing
        clocks = [(name, clock, self.fields[name]) for name, clock in self.clocks.items()]
        now = self.ingest.app.clock.now_ms()
        for msg in msgs:
            offset = msg.offset() or 0
            self.counts.records += 1
            try:
                payload = self.ingest.decoder.decode(msg.value())
                times = {name: a.raw_time_of(payload) for name, a in self.assigners}
                events = [int(payload[f]) for _, _, f in clocks]
            except ForeignPayloadError as exc:
                self._bad(msg, exc.reason, str(exc))
                continue
            except (KeyError, TypeError, ValueError) as exc:
                self._bad(msg, REASON_MISFIT,
                          f"topic '{topic}': no time for the stream's substreams: {exc!r}")
                continue
            missed = []
            for name, a in self.assigners:
                why = a.sealed_below(times[name])
                if why is not None:
                    missed.append((name, times[name], why))
            if missed:
                self._publish(run, keys, offsets)
                run, keys, offsets = [], [], []
                self._late(msg, payload, missed)
            else:
                run.append(payload)
                keys.append(msg.key())
                offsets.append(offset)
            for (name, clock, _), ts in zip(clocks, events, strict=True):
                if not sealing:
                    first, high = self.held.get(name, (ts, ts))
                    self.held[name] = (first, max(high, ts))
                    continue
                sealed = clock.published(ts, now)
                if sealed is not None:
                    self._publish(run, keys, offsets)
                    run, keys, offsets = [], [], []
                    self._seal(name, sealed)
        self._publish(run, keys, offsets)
        if msgs:
            self.position = (msgs[-1].offset() or 0) + 1
            self.pending += len(msgs)
            if self.opened_at is None:
                self.opened_at = time.monotonic()

    def release(self) -> None:
        """Sealing is allowed from now on: the event times seen before it count."""
        held, self.held = self.held, {}
        now = self.ingest.app.clock.now_ms()
        for name, (first, high) in held.items():
            clock = self.clocks[name]
            for ts in (first, high):
                sealed = clock.published(ts, now)
                if sealed is not None:
                    self._seal(name, sealed)

    def _publish(
        self, payloads: list[dict[str, Any]], keys: list[bytes | None], offsets: list[int]
    ) -> None:
        """A run of on-time records; a batch that does not encode is sorted record by
        record (the misfits dead-lettered, the rest written)."""
        if not payloads:
            return
        parts = [self.out_partition] * len(payloads)
        try:
            self.publisher.publish_many(payloads, keys=keys, partitions=parts)
        except SubstreamsError:
            fit = []
            for payload, key, offset in zip(payloads, keys, offsets, strict=True):
                why = payload_mismatch(self.ingest.stream.schema, payload)
                if why is None:
                    fit.append((payload, key))
                else:
                    raw = json.dumps(payload, default=str).encode()
                    self._bad_at(offset, raw, REASON_MISFIT,
                                 f"topic '{self.ingest.topic}': payload does not match schema "
                                 f"{self.ingest.stream.schema.get('name')}: {why}")
            if not fit:
                return
            self.publisher.publish_many(
                [p for p, _ in fit], keys=[k for _, k in fit], partitions=parts[: len(fit)]
            )
            payloads = [p for p, _ in fit]
        self.counts.written += len(payloads)
        self.ingest.bad_run_over(self)

    def _bad(self, msg: Message, reason: str, detail: str) -> None:
        self._bad_at(msg.offset() or 0, msg.value() or b"", reason, detail)

    def _bad_at(self, offset: int, raw: bytes, reason: str, detail: str) -> None:
        self.bad.bad(self.ingest.topic, self.partition, offset, raw, detail, reason=reason)
        self.counts.bad += 1

    def _late(
        self, msg: Message, payload: dict[str, Any], missed: list[tuple[str, Any, str]]
    ) -> None:
        """A record at a time this partition already sealed in some substreams: kept out
        of those, written for the others, and dead-lettered with its input offset naming
        each substream it missed (late is per substream)."""
        names = tuple(name for name, _, _ in missed)
        on_time = [name for name, _ in self.assigners if name not in names]
        detail = "; ".join(why for _, _, why in missed)
        if on_time:
            self.publisher.publish(payload, key=msg.key(), partition=self.out_partition,
                                   substreams=on_time)
            self.counts.written += 1
            detail += (f" (kept out of {', '.join(map(repr, names))} only: written to the "
                       "stream, on time in the others)")
        self.letters.write(
            late_letter(self.letters.service, self.ingest.topic, self.partition,
                        msg.offset() or 0, self.source, payload, detail, names),
            key=msg.key(),
        )
        for name in names:
            self.counts.late[name] = self.counts.late.get(name, 0) + 1

    def _seal(self, name: str, sealed: PolicySeal) -> None:
        if sealed.kind == "keys":
            self.publisher.seal_keys(name, sealed.upto, commit=False)
        else:
            done = self.publisher.assigners[name].sealed
            if done is None or sealed.upto > done:
                self.publisher.seal(name, sealed.upto, commit=False)
        self.dirty = True

    def idle(self, now_ms: int) -> None:
        """Seal what ``idle_ms`` of quiet allows (committed by :meth:`commit`) -- only while
        the partition is read to its end: a partition the ingest lags behind is not quiet,
        and an idle seal then would make the records still to be read late."""
        if not self.ingest.sealing or not self.ingest.at_end(self.partition):
            return
        for name, clock in self.clocks.items():
            sealed = clock.idle(now_ms)
            if sealed is not None:
                self._seal(name, sealed)

    def due(self, now: float) -> bool:
        """Whether the open transaction commits now: a seal (or the first offset) waits, or
        its records waited ``COMMIT_MS``, or there are ``MAX_PENDING`` of them."""
        if self.dirty:
            return True
        opened = self.opened_at
        return opened is not None and (now - opened >= COMMIT_MS / 1000
                                       or self.pending >= MAX_PENDING)

    def commit(self, group_metadata: Any) -> None:
        """The open transaction with this partition's next offset and seal state."""
        tp = TopicPartition(self.ingest.topic, self.partition, self.position,
                            metadata=self.state())
        self.publisher.send_offsets([tp], group_metadata)
        self.publisher.commit()
        self.dirty = False
        self.pending = 0
        self.opened_at = None
        self.counts.commits += 1

    def close(self) -> None:
        """Let go without an Unregister: stopping an ingest is a pause, its sources stay
        registered and their open times wait for the next process (or an eviction), as
        after a crash.  :meth:`Ingest.run` committed what it read first (a stop by an
        error drops the open transaction, whose records are read again after a restart)."""
        self.publisher.abort()


class Ingest:
    """Follows ``stream``'s source topic, partitions ``p % instances == instance``."""

    def __init__(
        self,
        config: Config,
        stream: str,
        *,
        instance: int = 0,
        instances: int = 1,
        bootstrap: str | None = None,
        app: Application | None = None,
        lookup: SchemaLookup | None = None,
        max_batch: int = 5000,
    ) -> None:
        self.config = config
        self.stream: StreamConfig = config.stream(stream)
        source = self.stream.source
        if source is None:
            raise SubstreamsError(
                f"stream '{stream}' has no source topic to follow: give it one in "
                f"{config.path} (streams[].source: {{topic: ..., format: json}})"
            )
        self.topic = source.topic
        self.app = app or Application(config, bootstrap)
        self.bootstrap = client.resolve_bootstrap(config, bootstrap or self.app.bootstrap)
        self.decoder = ForeignDecoder(self.stream, lookup)
        self.max_batch = max_batch
        self.group = group_id(stream)
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=f"ingest-{stream}")
        self.sealing = False
        """Whether this instance seals: only once every partition of the topic has been
        followed (has a committed offset), or an instance started alone would let windows
        close without the partitions of an instance not started yet (a source counts from
        its registration)."""
        self._others: list[int] = []
        self._checked = 0.0
        settings: dict[str, Any] = {"group.id": self.group, "fetch.wait.max.ms": FETCH_WAIT_MS}
        self.reader = Reader(self.bootstrap, config,
                             name=f"ingest '{stream}': topic '{self.topic}'", **settings)
        try:
            count = self._partitions()
            self.partitions = owned(count, instance, instances)
            self._others = [p for p in range(count) if p not in self.partitions]
            # The publishers first: their start fences (and aborts the open transaction of)
            # every earlier process of these partitions, so the offsets read next are final.
            # In parallel: each start waits on the broker (init_transactions aborts what a
            # killed process left open; the registration commits).
            self.followers: dict[int, PartitionFollower] = {}
            with ThreadPoolExecutor(max(1, min(8, len(self.partitions)))) as pool:
                started = {p: pool.submit(PartitionFollower, self, p) for p in self.partitions}
            failed: BaseException | None = None
            for p, future in started.items():
                try:
                    self.followers[p] = future.result()
                except BaseException as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed
            self._assign(source.start)
        except BaseException:
            self.close()
            raise
        self._closed = False

    def _partitions(self) -> int:
        meta = self.reader.consumer.list_topics(self.topic, timeout=30)
        found = meta.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise SubstreamsError(
                f"stream '{self.stream.name}': source topic '{self.topic}' does not exist on "
                f"{self.bootstrap}"
            )
        return len(found.partitions)

    def _assign(self, start: str) -> None:
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        committed = {tp.partition: tp for tp in self.reader.committed(tps)}
        assignment = []
        for p, follower in self.followers.items():
            tp = committed.get(p)
            if tp is not None and tp.offset >= 0:
                follower.position = tp.offset
                follower.restore(tp.metadata)
            else:
                low, high = self.reader.watermarks(self.topic, p)
                follower.position = max(0, high if start == "latest" else low)
            assignment.append(TopicPartition(self.topic, p, follower.position))
        self.reader.assign(assignment)
        log.info("ingest '%s': following '%s' partitions %s from offsets %s (group '%s')",
                 self.stream.name, self.topic, self.partitions,
                 {p: f.position for p, f in self.followers.items()}, self.group)

    def all_followed(self) -> bool:
        """Whether every partition this instance does not follow has a committed offset
        (asked at most once a second, until it is so)."""
        if not self._others:
            return True
        now = time.monotonic()
        if now - self._checked < 1.0:
            return False
        self._checked = now
        tps = [TopicPartition(self.topic, p) for p in self._others]
        missing = [tp.partition for tp in self.reader.committed(tps) if tp.offset < 0]
        if missing:
            log.info("ingest '%s': partitions %s are not followed yet: no seals until they "
                     "are", self.stream.name, missing)
            self._others = missing
            return False
        self._others = []
        return True

    def bad_run_over(self, follower: PartitionFollower) -> None:
        follower.bad.good()

    def step(self, timeout: float = 0.05) -> int:
        """Read one batch, write it per partition, commit each partition that moved."""
        if not self.sealing and self.all_followed():
            self.sealing = True
            for follower in self.followers.values():
                follower.release()
        msgs = self.reader.poll_batch(timeout, self.max_batch)
        if msgs and len(msgs) < self.max_batch:
            # Linger: a live topic's records arrive a few at a time, and a step per record
            # or two cost more than the records (polls, runs, commit checks).
            # Slept, then taken whole: a poll with a timeout wakes per record.
            time.sleep(LINGER_MS / 1000)
            msgs += self.reader.poll(0, self.max_batch - len(msgs))
        by_partition: dict[int, list[Message]] = {}
        for msg in msgs:
            p = msg.partition()
            if p is not None:
                by_partition.setdefault(p, []).append(msg)
        for p, batch in by_partition.items():
            self.followers[p].take(batch)
        now = self.app.clock.now_ms()
        for follower in self.followers.values():
            follower.idle(now)
        mono = time.monotonic()
        due = [f for f in self.followers.values() if f.due(mono)]
        if due:
            meta = self.reader.consumer.consumer_group_metadata()
            if len(due) == 1:
                due[0].commit(meta)
            else:  # the commits wait on the broker: side by side, not one after the other
                for future in [self._pool.submit(f.commit, meta) for f in due]:
                    future.result()
        return len(msgs)

    def at_end(self, partition: int) -> bool:
        """Whether the input partition is read to its end (nothing fetched after its EOF)."""
        return (self.topic, partition) in self.reader.at_end

    def flush(self) -> None:
        """Commit every partition's open transaction now (tests, a clean stop)."""
        meta = self.reader.consumer.consumer_group_metadata()
        for follower in self.followers.values():
            if follower.dirty or follower.opened_at is not None:
                follower.commit(meta)

    def counts(self) -> Counts:
        """The sums over this instance's partitions."""
        out = Counts()
        for f in self.followers.values():
            c = f.counts
            out.records += c.records
            out.written += c.written
            out.bad += c.bad
            out.commits += c.commits
            for name, n in c.late.items():
                out.late[name] = out.late.get(name, 0) + n
        return out

    def run(self, stop: threading.Event, on_progress: Callable[[Counts], None] | None = None,
            every_s: float = 5.0) -> None:
        """Follow until ``stop`` is set, then close (a commit of what was read)."""
        due = time.monotonic() + every_s
        try:
            while not stop.is_set():
                self.step()
                if on_progress is not None and time.monotonic() >= due:
                    due = time.monotonic() + every_s
                    on_progress(self.counts())
            self.flush()
        finally:
            self.close()

    def positions(self) -> dict[int, int]:
        """The next input offset per followed partition."""
        return {p: f.position for p, f in self.followers.items()}

    def lag(self) -> Mapping[int, int]:
        return {p: n for (_, p), n in self.reader.lag().items()}

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        for follower in getattr(self, "followers", {}).values():
            follower.close()  # never raises
        self._pool.shutdown(wait=False)
        self.reader.close()

    def __enter__(self) -> Ingest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Counts", "Ingest", "PartitionFollower", "group_id", "owned", "source_id"]
