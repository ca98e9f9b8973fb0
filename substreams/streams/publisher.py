"""The single publisher of a (stream, source id): typed, ordered, transactional.

Why transactions: Kafka fences an older producer with the same ``transactional.id`` the
moment a newer one initialises, which is exactly Sherlock's "one publisher per stream"
across processes, and it makes a restarted publisher's half-written batch invisible to
``read_committed`` readers.  Within one process a second acquisition is refused at once.
Why order keys are checked before writing: a regression would silently break every
order-key based reader (listeners from an order key, window assignment); it is a bug in the
caller and must surface as one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Literal, NamedTuple, ParamSpec, Protocol, TypeVar, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from substreams.config import Config, SealPolicy, StreamConfig
from substreams.errors import (
    OrderKeyRegressionError,
    PublisherAlreadyAcquiredError,
    PublisherFencedError,
    SealedTimeError,
    SubstreamsError,
)
from substreams.frontier import Time
from substreams.kafka import client
from substreams.kafka.clock import SYSTEM, Clock
from substreams.kafka.write import is_fenced, produce, produce_batch, raise_fatal
from substreams.streams.evolution import register_stream
from substreams.streams.framing import EnvelopeEncoder
from substreams.streams.policy import PolicySeal, SealClock
from substreams.streams.records import SentRecord, sent_record, sent_records
from substreams.streams.schemas import Codec, envelope_schema
from substreams.streams.ticker import Ticker
from substreams.streams.times import TimeAssigner
from substreams.streams.validate import payload_mismatch

log = logging.getLogger(__name__)

REGISTER_PATIENCE_S = 30.0
"""How long a starting publisher waits for its registration to commit before it fails."""

# Process-wide: a second Publisher of one (cluster, stream, source) in this process would fence
# the first through their shared transactional id; refused at once here, with a clear error.
_ACQUIRED: set[tuple[str, str, str]] = set()
_ACQUIRED_LOCK = threading.Lock()


_ENCODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)
"""What fastavro / the compiled writers raise for a payload that does not fit the schema
(OverflowError: fastavro's answer to an int time outside a long)."""

_INT_KINDS = frozenset({"epoch", "tumbling"})
"""Substream kinds whose times are ints (``TimeAssigner.times_of`` returns an int column)."""

POLICY_TICK_S = 0.02
"""How often a publisher with a seal policy looks at its clock (idleness) and commits the
seals its records moved when its caller has not committed them: the delay a policy seal
may add to a notification."""

FULL_WAIT_S = 0.02
"""How long a full transaction of a publisher that seals waits for its caller to write or
seal again before the ticker commits it (:meth:`Publisher._batch_full`)."""

SETTLE_S = 0.01
"""How long after a commit a transaction of the hooks' messages alone waits before its first
write (:meth:`Publisher._settle`): half librdkafka's fixed 20 ms retry after
CONCURRENT_TRANSACTIONS, enough for most commits' markers (docs/design.md)."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(
    method: Callable[Concatenate[Publisher, _P], _R],
) -> Callable[Concatenate[Publisher, _P], _R]:
    """Run ``method`` holding the publisher's lock (its ticker may commit between two calls
    of the caller, never inside one); an error the ticker met is raised here first."""

    def call(self: Publisher, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            error = self._tick_error
            if error is not None:
                self._tick_error = None
                raise error
            return method(self, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


@dataclass(frozen=True)
class LateRecord:
    """A record at a time its publisher already sealed, under a ``late: dead_letter`` rule:
    where it would have gone, and every substream time it missed with the reason (late is
    per substream: it is kept out of those only)."""

    stream: str
    source: str
    partition: int
    key: str | bytes | None
    payload: Mapping[str, Any]
    missed: tuple[tuple[str, Time, str], ...]
    """(substream, the record's time there, why it is late)."""
    written: bool = False
    """Whether the record itself went to the stream, on time (with its time) in the
    stream's other substreams; False: late for every one of them, written nowhere else."""


LateWriter = Callable[["Publisher", "LateRecord"], None]
"""Writes a late record aside (into the publisher's open transaction); chosen by the
composition root, which knows the dead-letter format."""


@functools.lru_cache(maxsize=256)
def _envelope_codec(stream: str, payload_schema: str) -> Codec:
    """The envelope codec of a stream's schema (given as canonical JSON), built once per
    process: a publisher is built per source incarnation, stage restart and Spark task
    attempt, and parsing and fingerprinting the schema cost more than a short-lived writer's
    work.  Shared read-only (its one cache, of writer schemas by fingerprint, fills the same
    for every user)."""
    return Codec(envelope_schema(json.loads(payload_schema)), label=f"stream '{stream}'")


def transactional_id(stream: str, source_id: str) -> str:
    return f"substreams.pub.{stream}.{source_id}"


class Write(NamedTuple):
    """A record a hook hands its publisher to write into the open transaction (the hook
    itself calls no broker: what it returns is written with the records it is about)."""

    topic: str
    value: bytes
    partition: int
    headers: list[tuple[str, bytes]] | None = None


class ProducerFactory(Protocol):
    """Builds a publisher's producer, called as :func:`substreams.kafka.client.producer`
    (the default): the real client, or :class:`substreams.kafka.memproducer.MemoryProducers`
    over the in-memory log.  What is asked of the producer is what a confluent-kafka
    ``Producer`` answers (transactions, ``produce`` with delivery callbacks, ``poll``,
    ``flush``)."""

    def __call__(
        self, bootstrap: str, config: Config | None = None, *,
        transactional_id: str | None = None, **overrides: Any,
    ) -> Any: ...


SchemaRegistrar = Callable[[Config, str, "str | None"], object]
"""Registers a stream's schema before its first record (:func:`register_stream`, the
default; refuses an incompatible change)."""


Ending = Literal["committed", "closed", "aborted"]
"""How a transaction of the publisher ended: committed; committed as the last one (the
publisher closed); or dropped, the publisher released (an abort, or a close that failed)."""


class PublishHook(Protocol):
    """A substream mechanism riding along a publisher: the acker's tracker, punctuations,
    direct progress.  Five methods, each needed by some mechanism (docs/design.md, "The
    tracker and the ack protocol"):

    * ``sent(records)`` -- before the records are produced, in the open transaction (one
      call per ``publish_many`` batch, a 1-tuple per ``publish``): the acker's SND of a
      record some stage reads; direct progress counts records per time.
    * ``delivered(records, partitions, offsets, times)`` -- in the commit, after every
      delivery callback of the transaction's records and before ``before_commit``: each
      record with its partition and offset, and for the substreams in ``times`` each
      record's time as a column (a hook that tracks per time can skip the records).  The
      sequences are the hook's to keep, not to change.  The acker's SND+RCV of a record of
      a terminal stream with its offset range; direct progress's ranges.
    * ``seal(substream, time, every_key)`` -- inside the open transaction, after the records
      written so far, before the commit that makes the seal effective; ``every_key``: the
      keyed seal (``time`` is an event time, every key up to it).  Returns what to write
      there at once (punctuations: a SEAL into every partition); the acker keeps the seal
      for its next report, direct progress announces it after the commit.
    * ``before_commit(last)`` -- last inside every transaction, after every delivery
      callback: returns what to write into it (the acker's Register, reports, seals and,
      when ``last`` -- the publisher's final commit --, Unregister; punctuations'
      REGISTER and UNREGISTER).  So nothing a hook says is visible before, or without, the
      records it covers.
    * ``ended(how)`` -- after every transaction (:data:`Ending`): out-of-band mechanisms
      announce what just became visible (direct progress); on ``closed``/``aborted`` the
      hook lets go of its resources, and an abort forgets what the dropped transaction held,
      announcing nothing (a source that aborted has not sealed; its times stay open, as
      after a crash).

    ``wants_send`` / ``wants_delivery``: whether ``sent`` / ``delivered`` do anything (false:
    the publisher skips them, and installs no delivery callback for a hook that needs no
    offsets).
    """

    wants_send: bool
    wants_delivery: bool

    def sent(self, records: Sequence[SentRecord]) -> None: ...

    def delivered(
        self,
        records: Sequence[SentRecord],
        partitions: Sequence[int],
        offsets: Sequence[int],
        times: Mapping[str, Sequence[Time]],
    ) -> None: ...

    def seal(self, substream: str, time: Time, every_key: bool) -> Sequence[Write]: ...

    def before_commit(self, last: bool) -> Sequence[Write]: ...

    def ended(self, how: Ending) -> None: ...


DeliveredColumns = Callable[
    [Sequence[SentRecord], Sequence[int], Sequence[int], Mapping[str, Sequence[Time]]], None
]


HookFactory = Callable[["Publisher", list[str]], PublishHook]
"""Builds the hook of one mechanism for a publisher and the substream names it tracks."""

Mechanisms = Mapping[str, HookFactory]
"""Mechanism name (``acker``, ``punctuations``) -> hook factory.  Chosen by the composition
root (:class:`substreams.app.Application`), never looked up here: this layer does not know
the mechanisms' packages, which sit above it."""


class Publisher:
    """Appends typed entries to one stream, as one source.

    ``publish`` adds to an open transaction, committed every ``batch_size`` records, on
    ``flush()``, ``seal()`` and ``close()``; a seal commits the records written before it in
    its own transaction (see :meth:`seal`).  Use it as a context manager.

    The transaction rule of the seal path: a seal rides in the transaction of the records
    written before it (pending ones; a full batch waits ``FULL_WAIT_S`` for it); a seal
    with nothing pending, like any transaction of the hooks' messages alone, commits alone,
    no sooner than ``SETTLE_S`` after the previous commit (:meth:`_settle`).  A seal is
    never committed before the records it closes; ``flush()`` makes everything durable.
    """

    def __init__(
        self,
        config: Config,
        stream: str,
        source_id: str,
        *,
        bootstrap: str | None = None,
        batch_size: int = 500,
        mechanisms: Mechanisms | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
        seal_policies: Mapping[str, SealPolicy | None] | None = None,
        late_writer: LateWriter | None = None,
        producers: ProducerFactory = client.producer,
        schemas: SchemaRegistrar = register_stream,
        clock: Clock = SYSTEM,
        rng: random.Random | None = None,
        max_open_ms: int | None = None,
    ) -> None:
        """``seal_policies``: per substream of the stream, a seal policy replacing the
        configured one (None: ``manual``); ``late_writer``: where records a ``late:
        dead_letter`` policy refuses go (:class:`substreams.app.Application` gives one).
        ``max_open_ms``: commit an open transaction whose first record waited that long
        (on the ticker, between the caller's calls), as ``batch_size`` commits a full one:
        records below ``batch_size`` of a caller that neither flushes nor seals then
        become visible to readers and to the acker within it.  None (the default): only
        ``batch_size``, ``flush()``, ``seal()``, ``close()`` and a seal policy commit --
        a caller whose unit of work must be one transaction (``send_offsets``,
        ``produce_aside`` markers) keeps that control (docs/design.md, "Time-bounded
        commits").

        Where its I/O goes, chosen by the composition root (defaults: the real broker and
        the machine's clock): ``producers`` builds its producers (the transactional one and
        its hooks' heartbeats), ``schemas`` registers the stream's schema, ``clock`` is read
        for every wait and timestamp, ``rng`` draws the incarnation id, tracking ids and the
        round robin's start (None: fresh from the OS) -- so that a simulation on the
        in-memory log and a simulated clock replays exactly."""
        tracked = sorted({s.mechanism for s in config.substreams_of(stream)})
        if mechanisms is None and tracked:
            raise SubstreamsError(
                f"stream '{stream}' has substreams tracked by {', '.join(tracked)}: build its "
                "publishers with substreams.app.Application(config).publisher(...), which "
                "attaches the mechanisms' hooks (or pass mechanisms={} for an untracked one)"
            )
        self.config = config
        self.stream_config: StreamConfig = config.stream(stream)
        self.stream = stream
        self.source_id = source_id
        self.bootstrap = client.resolve_bootstrap(config, bootstrap)
        self.batch_size = batch_size
        if max_open_ms is not None and (isinstance(max_open_ms, bool)
                                        or not isinstance(max_open_ms, int) or max_open_ms < 1):
            raise SubstreamsError(
                f"stream '{stream}', source '{source_id}': max_open_ms must be a positive "
                f"number of milliseconds (or None), not {max_open_ms!r}"
            )
        self._max_open_s = None if max_open_ms is None else max_open_ms / 1000
        self.codec = _envelope_codec(stream, json.dumps(self.stream_config.schema, sort_keys=True))
        # single-object encoded values carry the writer fingerprint: data records have no
        # headers (see substreams.streams.schemas)
        self._encoder = EnvelopeEncoder(self.stream_config.schema, source_id)
        self.producers = producers
        self.clock = clock
        self._rand = rng if rng is not None else random.Random()
        schemas(config, stream, self.bootstrap)  # refuses an incompatible schema change
        self.partitions = self.stream_config.partitions
        self.incarnation = f"{self._rand.getrandbits(64):016x}"
        """This start of the source id: fences every earlier one (see the acker's agent)."""
        self._key = (self.bootstrap, stream, source_id)
        self._acquire()
        self._closed = False
        self._lock = threading.RLock()
        self._tick_error: BaseException | None = None
        self.ticker = Ticker(f"publisher-{stream}-{source_id}")
        """Runs what must happen while the caller is quiet (heartbeats, idle seals)."""
        self._ticking = False
        try:
            self._producer = producers(
                self.bootstrap,
                config,
                transactional_id=transactional_id(stream, source_id),
                **dict(producer_overrides or {}),
            )
            self._producer.init_transactions(30)
        except BaseException:
            self._release()
            raise
        self._init_writing()
        self._init_hooks(late_writer)
        self._register(mechanisms or {}, seal_policies or {})

    def _acquire(self) -> None:
        """Refuse a second publisher of this (cluster, stream, source) in this process."""
        with _ACQUIRED_LOCK:
            if self._key in _ACQUIRED:
                raise PublisherAlreadyAcquiredError(
                    f"the publisher of stream '{self.stream}' for source '{self.source_id}' "
                    "is already acquired in this process; close it first"
                )
            _ACQUIRED.add(self._key)

    def _init_writing(self) -> None:
        """The state of the open transaction and of the records' order, partitions, times."""
        self._in_txn = False
        self._pending = 0
        self._written = False
        """Something other than the stream's records (a hook's, ``produce_aside``,
        ``send_offsets``) was written into the open transaction."""
        self._full_at: float | None = None
        """When the open transaction reached ``batch_size`` records, if its commit waits
        (:meth:`_batch_full`); None otherwise."""
        self._opened_at: float | None = None
        """When the open transaction got its first record, with ``max_open_ms`` (None:
        none yet, or no ``max_open_ms``)."""
        self._rr = self._rand.randrange(self.partitions)
        self._last_order_key: int | None = None
        subs = self.config.substreams_of(self.stream)
        self.assigners = {s.name: TimeAssigner(s, self.stream_config.order_key) for s in subs}
        self._assigner_items = list(self.assigners.items())

    def _init_hooks(self, late_writer: LateWriter | None) -> None:
        """Empty hook lists, the batches the delivery hooks are handed, the seal policies'
        state (filled by :meth:`_register`)."""
        self._hooks: dict[str, PublishHook] = {}
        self._hook_list: list[PublishHook] = []
        self._delivery_hooks: list[PublishHook] = []
        self._sent: list[Callable[[Sequence[SentRecord]], None]] = []
        """The ``sent`` of the hooks that want it (``wants_send``)."""
        self._delivered: list[DeliveredColumns] = []
        self._closing = False
        """The final commit is under way (the hooks' ``before_commit(last=True)``)."""
        self._failed: BaseException | None = None
        """The error of the last commit, if it raised (cleared by one that succeeds): then
        ``close()`` drops the transaction instead of committing (:meth:`_close_failed`)."""
        self._batches: list[
            tuple[list[SentRecord], list[int], dict[int, list[int]], dict[str, list[Time]]]
        ] = []
        """``publish_many`` batches of the open transaction (records, their partitions, per
        partition the offsets its delivery callback collects, and the time columns at hand
        -- one int-time substream's, see ``_times_of``; only with delivery hooks); handed to
        the hooks in ``flush``.  Single ``publish`` calls in a row share one such batch
        (:attr:`_singles`)."""
        self._singles: tuple[Callable[[KafkaError | None, Message], None], list[SentRecord],
                             list[int]] | None = None
        """The batch that ``publish`` calls append to (its callback, records, partitions),
        until a ``publish_many`` batch or the commit ends it."""
        self._clocks: dict[str, SealClock] = {}
        self._late_rules: dict[str, str] = {}
        self._late_writer = late_writer
        self._seal_pending = False
        self._committed_at = 0.0
        self._policy_fields: list[tuple[str, SealClock, str]] = []

    def _register(
        self, mechanisms: Mechanisms, seal_policies: Mapping[str, SealPolicy | None]
    ) -> None:
        """Attach the hooks and seal policies, and commit the hooks' registrations before
        any record (a source counts from the moment the acker reads its Register); on any
        failure, abort (release the (stream, source) and let the hooks go)."""
        try:
            self._install_hooks(mechanisms)
            self._install_policies(seal_policies)
            if self._hook_list:
                self.commit(patience=REGISTER_PATIENCE_S)
        except KafkaException as exc:
            self.abort()
            raise SubstreamsError(
                f"the publisher of stream '{self.stream}' for source '{self.source_id}' could "
                f"not register within {REGISTER_PATIENCE_S:.0f} s (is the acks topic "
                f"'{self.config.acker.acks_topic}' there and served?): {exc}"
            ) from exc
        except BaseException:
            # E.g. a broker outage at start: without this the (stream, source) stayed
            # acquired and every later Publisher for it in this process was refused.
            self.abort()
            raise

    # -- set-up --------------------------------------------------------------------------

    def _install_hooks(self, mechanisms: Mechanisms) -> None:
        by_mechanism: dict[str, list[str]] = {}
        for sub in self.config.substreams_of(self.stream):
            by_mechanism.setdefault(sub.mechanism, []).append(sub.name)
        for mechanism, names in by_mechanism.items():
            factory = mechanisms.get(mechanism)
            if factory is None:
                continue
            hook = factory(self, names)
            self._attach(hook)
            for name in names:
                self._hooks[name] = hook

    def _install_policies(self, overrides: Mapping[str, SealPolicy | None]) -> None:
        """The seal clock of every tracked substream with a policy (config, or override)."""
        for name in overrides:
            if name not in self.assigners:
                known = ", ".join(self.assigners) or "none"
                raise SubstreamsError(
                    f"seal_policies: stream '{self.stream}' has no substream '{name}' "
                    f"(known: {known})"
                )
        now = self.clock.now_ms()
        for name, assigner in self._assigner_items:
            sub = assigner.substream
            policy = overrides.get(name, sub.seal)
            if policy is None or name not in self._hooks:
                # Untracked here (a stage's or a Spark task's output publisher reports
                # through its own hook and never seals): nothing for a policy to do.
                continue
            if sub.kind == "per_key":
                raise SubstreamsError(
                    f"substream '{name}' is per_key: a seal policy needs an event time; "
                    "seal it from code (seal, seal_keys)"
                )
            self._clocks[name] = SealClock(sub, policy, now)
            self._late_rules[name] = policy.late
            if policy.late == "dead_letter" and self._late_writer is None:
                raise SubstreamsError(
                    f"substream '{name}': late: dead_letter needs a dead-letter writer; build "
                    "the publisher with substreams.app.Application(config).publisher(...)"
                )
        if self._clocks:
            self._policy_fields = []
            for name, clock in self._clocks.items():
                field = clock.substream.field or self.stream_config.order_key
                assert field is not None  # the loader names one when the stream has no key
                self._policy_fields.append((name, clock, field))
            self._start_ticking()

    def hook_for(self, substream: str) -> PublishHook | None:
        """The mechanism's hook that tracks ``substream`` (None: untracked)."""
        return self._hooks.get(substream)

    def add_hook(self, hook: PublishHook) -> None:
        """Attach a hook that sees every record (sent and delivered), not bound to a substream."""
        self._attach(hook)

    def _attach(self, hook: PublishHook) -> None:
        self._hook_list.append(hook)
        if hook.wants_send:
            self._sent.append(hook.sent)
        if hook.wants_delivery:
            self._delivery_hooks.append(hook)
            self._delivered.append(hook.delivered)

    def _release(self) -> None:
        with _ACQUIRED_LOCK:
            _ACQUIRED.discard(self._key)

    # -- writing -------------------------------------------------------------------------

    def _settle(self) -> None:
        """Wait until ``SETTLE_S`` has passed since the previous commit returned.

        Why: a transaction that writes only the hooks' messages (a seal with no record
        pending, a registration, the last Unregister, an idle seal) is committed at once,
        so its first write's AddPartitionsToTxn is on the path of its commit.  Right behind
        the previous commit the coordinator refuses it (CONCURRENT_TRANSACTIONS: that
        commit's markers are still being written) and librdkafka asks again after a fixed
        20 ms, which the commit then waits for -- on about half such seals here.  A shorter
        wait first is refused far less often and costs the commit about as much on average
        (it bounds the tail: no 20 ms retry).  Records do not wait: the next records'
        transaction registers long before its own commit, so its refusal, if any, delays no
        commit."""
        wait = self._committed_at + SETTLE_S - self.clock.monotonic()
        if wait > 0:
            self.clock.sleep(wait)

    def _begin(self) -> None:
        if not self._in_txn:
            self._guard(self._producer.begin_transaction)
            self._in_txn = True

    def _begin_write(self) -> None:
        """Open the transaction new records go into: a full one still waiting for a seal
        (:meth:`_batch_full`) commits first, so a transaction never outgrows ``batch_size``
        by more than one call."""
        if self._full_at is not None:
            self.flush()
        self._begin()
        if self._max_open_s is not None and self._opened_at is None:
            self._opened_at = self.clock.monotonic()
            self._start_ticking()

    def _batch_full(self) -> None:
        """The open transaction holds ``batch_size`` records: commit it -- later, for a
        publisher that seals.  Its commit then waits for the caller's next write (before
        it), a seal or ``flush()`` (with it), or ``FULL_WAIT_S`` of quiet (the ticker).
        Why: a seal that comes right after a full batch rides in the batch's transaction
        instead of beginning one of its own right behind it, which the broker refuses
        (CONCURRENT_TRANSACTIONS: the previous commit's markers are still being written)
        and librdkafka retries after a fixed 20 ms."""
        if not self._hooks:
            self.flush()
        elif self._full_at is None:
            self._full_at = self.clock.monotonic()
            self._start_ticking()

    def _guard(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call`` with a fencing error raised as :class:`PublisherFencedError` (what
        :func:`~substreams.kafka.write.fenced_as` does, without a context manager's
        generator per call: every write of a hook goes through here)."""
        try:
            return call(*args, **kwargs)
        except KafkaException as exc:
            if is_fenced(exc):
                raise PublisherFencedError(
                    f"the publisher of stream '{self.stream}' for source '{self.source_id}' "
                    "was fenced: another process acquired it"
                ) from exc
            raise

    def _schema_error(
        self, exc: Exception, payloads: Sequence[Mapping[str, Any]] = ()
    ) -> SubstreamsError:
        """The encoding error, naming the field and the value at fault (found by validating
        the payloads -- only now, once encoding failed: the hot path pays nothing)."""
        name = self.stream_config.schema.get("name")
        for i, payload in enumerate(payloads):
            why = payload_mismatch(self.stream_config.schema, payload)
            if why is not None:
                which = f"record {i} of the batch: " if len(payloads) > 1 else ""
                return SubstreamsError(
                    f"stream '{self.stream}': {which}payload does not match schema {name}: {why}"
                )
        return SubstreamsError(
            f"stream '{self.stream}': payload does not match schema {name}: {exc}"
        )

    def partition_for(self, key: str | bytes | None) -> int:
        if key is None:
            self._rr = (self._rr + 1) % self.partitions
            return self._rr
        raw = key.encode() if isinstance(key, str) else key
        return zlib.crc32(raw) % self.partitions

    @_locked
    def publish(
        self,
        payload: Mapping[str, Any],
        *,
        key: str | bytes | None = None,
        partition: int | None = None,
        times: Mapping[str, Time] | None = None,
        check_order: bool = True,
        substreams: Collection[str] | None = None,
    ) -> SentRecord:
        """Append one entry.  Raises before writing anything on an order-key regression, a
        time this source sealed (:class:`SealedTimeError`) or a payload that does not fit
        the stream's schema.

        ``times`` overrides the record's time in the named substreams (a stage's output keeps
        the times of its input); ``check_order=False`` is for such derived records, whose order
        keys follow the input's interleaving rather than one source's clock.

        Late is per substream: a record at a time this source sealed in substream A raises
        :class:`SealedTimeError` naming A when A's rule is ``raise`` (or A is sealed by hand);
        under ``late: dead_letter`` it is kept out of A only -- written with no time in A (so
        A's acker accounting and A's readers never see it) and on time in the others, with a
        copy in the dead-letter topic naming A, in this transaction.  A record late for every
        substream of its stream is not written to it: returned with ``dead_lettered`` set.

        ``substreams`` (None: every one of the stream's) names the substreams the record is
        in: it gets no time in the others, as a record late for them, and their seals are
        not checked.  A replay of a record late for A only publishes it for A
        (:mod:`substreams.dead_letters`): it is already in the others."""
        if self._closed:
            raise SubstreamsError("publish() on a closed publisher")
        items = self._assigner_items if substreams is None else self._items_of(substreams, times)
        order_key = self._order_key_of(payload, check_order)
        if partition is None:
            partition = self.partition_for(key)
        elif not 0 <= partition < self.partitions:
            raise SubstreamsError(
                f"stream '{self.stream}' has partitions 0..{self.partitions - 1}, not {partition}"
            )
        missed: tuple[tuple[str, Time, str], ...] = ()
        try:
            if times:
                assigned = self._times_with(payload, times, items)
            else:
                assigned = {name: a.time_of(payload) for name, a in items}
        except SealedTimeError:
            assigned, missed = self._late_times(payload, times, items)
            if not assigned:  # late for every substream: in none of them, not written
                self._write_late(payload, key, partition, missed, written=False)
                return SentRecord(self.stream, partition, order_key, 0, {}, dead_lettered=True)
        tracking_id = self._rand.getrandbits(64) - (1 << 63)
        try:
            value = self._encoder.encode(order_key, tracking_id, assigned, payload)
        except _ENCODE_ERRORS as exc:
            raise self._schema_error(exc, (payload,)) from exc
        if check_order:
            self._last_order_key = order_key
        record = sent_record(self.stream, partition, order_key, tracking_id, assigned)
        if missed:  # its copy for the substreams it missed, in the record's transaction
            self._begin_write()
            self._write_late(payload, key, partition, missed, written=True)
        self._write_one(record, value, key, payload)
        return record

    def _order_key_of(self, payload: Mapping[str, Any], check_order: bool) -> int:
        """The record's order key, refused below the last one written (with ``check_order``).
        A stream without an ``order_key`` field: the publisher's own (:meth:`_kept_key`)."""
        field = self.stream_config.order_key
        if field is None:
            return self._kept_key()
        try:
            order_key = int(payload[field])
        except (KeyError, TypeError, ValueError) as exc:
            raise SubstreamsError(
                f"stream '{self.stream}': payload has no integer order key '{field}': {payload!r}"
            ) from exc
        last = self._last_order_key
        if check_order and last is not None and order_key < last:
            raise OrderKeyRegressionError(
                f"stream '{self.stream}', source '{self.source_id}': order key {field}={order_key} "
                f"is below the previous {last}; order keys must be non-decreasing"
            )
        return order_key

    def _items_of(
        self, substreams: Collection[str], times: Mapping[str, Time] | None
    ) -> list[tuple[str, TimeAssigner]]:
        """The assigners of ``substreams`` (a record published in those only), or an error
        naming one that is not the stream's (or a time given for one left out)."""
        wanted = set(substreams)
        unknown = sorted(wanted - self.assigners.keys())
        if unknown:
            raise SubstreamsError(
                f"stream '{self.stream}' has no substream {', '.join(map(repr, unknown))} "
                f"(its substreams: {', '.join(map(repr, self.assigners)) or 'none'})"
            )
        outside = sorted(set(times or ()) - wanted)
        if outside:
            raise SubstreamsError(
                f"stream '{self.stream}': a time given for substream "
                f"{', '.join(map(repr, outside))}, which the record is published without"
            )
        return [(name, a) for name, a in self._assigner_items if name in wanted]

    def _times_with(
        self,
        payload: Mapping[str, Any],
        times: Mapping[str, Time],
        items: Sequence[tuple[str, TimeAssigner]] | None = None,
    ) -> dict[str, Time]:
        """The record's times, ``times`` replacing the assigned ones (each checked against
        this source's seals)."""
        assigned = dict(times)
        for name, assigner in self._assigner_items if items is None else items:
            if name not in assigned:
                assigned[name] = assigner.time_of(payload)
            else:
                assigner.check(assigned[name])
        return assigned

    def _write_one(
        self,
        record: SentRecord,
        value: bytes,
        key: str | bytes | None,
        payload: Mapping[str, Any],
    ) -> None:
        """One checked record into the open transaction, with what the hooks and the commit
        cadence make of it."""
        self._begin_write()
        if self._sent:
            one = (record,)
            for sent in self._sent:
                sent(one)
        partition = record.partition
        if self._delivery_hooks:
            # Like a batch (see publish_many): one shared callback, the hooks see the
            # record with its offset in the commit (no closure per record).
            singles = self._singles
            if singles is None:
                singles = self._singles = self._open_batch([], [])
            self._produce(value, partition, key, singles[0])
            # only once produced: a record produce() refused is no hook's (a caller that
            # goes on may still commit the others, which must be reported)
            singles[1].append(record)
            singles[2].append(partition)
        else:
            self._produce(value, partition, key)
        self._pending += 1
        if self._clocks:
            self._published((payload,))
        if self._pending >= self.batch_size and self._in_txn:
            self._batch_full()

    @_locked
    def publish_many(
        self,
        payloads: Sequence[Mapping[str, Any]],
        *,
        keys: Sequence[str | bytes | None] | None = None,
        partitions: Sequence[int] | None = None,
        times: Sequence[Mapping[str, Time] | None] | None = None,
        check_order: bool = True,
    ) -> list[SentRecord]:
        """Append a batch of entries, in order: what ``publish`` of each would do, with the
        per-record costs paid once per batch.

        All or nothing: every check -- order keys (non-decreasing, and not below the last
        one written), partitions, this source's seals (:class:`SealedTimeError`), the payloads'
        schema -- runs on the whole batch before any of it is written, so a batch that
        raises wrote nothing and left the publisher as it was.  A batch never spans two
        transactions (the commit every ``batch_size`` records comes after it: at once, or
        for a publisher that seals with the next write or seal, see ``_batch_full``).  ``keys``,
        ``partitions`` and ``times`` are per record (as ``publish``'s ``key``,
        ``partition`` and ``times``); hooks see the batch once (``sent``,
        ``delivered``).  Late is per substream, as in ``publish``: a record late
        under ``late: dead_letter`` rules is written without a time in the substreams it
        missed and dead-lettered naming them; one late for every substream is only
        dead-lettered (the returned list keeps the input's order; those have
        ``dead_lettered`` set)."""
        if self._closed:
            raise SubstreamsError("publish_many() on a closed publisher")
        n = len(payloads)
        for name, column in (("keys", keys), ("partitions", partitions), ("times", times)):
            if column is not None and len(column) != n:
                raise SubstreamsError(f"publish_many(): {len(column)} {name} for {n} payloads")
        if not n:
            return []
        order_keys = self._order_keys(payloads)
        if check_order:
            self._check_batch_order(order_keys)
        parts, rr = self._partitions_of(n, keys, partitions)
        try:
            assigned, int_times = self._times_of(payloads, times)
        except SealedTimeError:
            if not self._late_rules:
                raise
            return self._publish_late(payloads, order_keys, keys, parts, rr, times, check_order)
        tracking_ids = struct.unpack(f"<{n}q", self._rand.randbytes(8 * n))
        values = self._encode_batch(order_keys, tracking_ids, assigned, int_times, payloads)
        # Nothing below raises for the batch's own sake: it is written from here on.
        if check_order:
            self._last_order_key = order_keys[-1]
        self._rr = rr
        records = sent_records(self.stream, parts, order_keys, tracking_ids, assigned)
        self._write_batch(records, values, parts, keys, int_times)
        if self._clocks:
            self._published(payloads)
        if self._pending >= self.batch_size and self._in_txn:
            self._batch_full()
        return records

    def _encode_batch(
        self,
        order_keys: list[int],
        tracking_ids: Sequence[int],
        assigned: list[Mapping[str, Time]],
        int_times: tuple[str, list[int]] | None,
        payloads: Sequence[Mapping[str, Any]],
    ) -> list[bytes]:
        """The batch's envelopes (framed from the int time column when there is one)."""
        try:
            if int_times is None:
                return self._encoder.encode_many(order_keys, tracking_ids, assigned, payloads)
            return self._encoder.encode_many_int_times(
                order_keys, tracking_ids, int_times[0], int_times[1], payloads
            )
        except _ENCODE_ERRORS as exc:
            raise self._schema_error(exc, payloads) from exc

    def _write_batch(
        self,
        records: list[SentRecord],
        values: Sequence[bytes],
        parts: list[int],
        keys: Sequence[str | bytes | None] | None,
        int_times: tuple[str, list[int]] | None,
    ) -> None:
        """A checked batch into the open transaction, the hooks told of it."""
        self._begin_write()
        for sent in self._sent:
            sent(records)
        if self._delivery_hooks:
            # One callback for the batch, not one object per record: the records' offsets
            # are collected per partition and matched to the records in ``_deliver_batches``
            # (a per-record ``partial`` lived until the commit, and the garbage collector's
            # passes over those objects cost more than making them).
            self._singles = None  # later publish() calls start a batch after this one
            columns: dict[str, list[Time]] = {}
            if int_times is not None:
                columns[int_times[0]] = list(int_times[1])
            delivered, batch_records, batch_parts = self._open_batch(records, parts[:], columns)

            def refused(i: int) -> None:
                # produce() refused record i (not a full queue) and raises: the records
                # before it are written and may still commit; the rest are no hook's.
                del batch_records[i:], batch_parts[i:]
                for column in columns.values():
                    del column[i:]

            self._produce_batch(values, parts, keys, [delivered] * len(values), refused)
        else:
            self._produce_batch(values, parts, keys, None)
        self._pending += len(values)

    def _publish_late(
        self,
        payloads: Sequence[Mapping[str, Any]],
        order_keys: list[int],
        keys: Sequence[str | bytes | None] | None,
        parts: list[int],
        rr: int,
        times: Sequence[Mapping[str, Time] | None] | None,
        check_order: bool,
    ) -> list[SentRecord]:
        """A batch with records late in some substream (see :meth:`publish`): each record
        written with its on-time substreams' times only, those late for every substream
        left out, then every late one's dead letter -- all checks (a ``raise`` rule's
        substream, the schema) before anything is written, so a refused batch wrote nothing."""
        n = len(payloads)
        late = [self._late_times(p, times[i] if times else None) for i, p in enumerate(payloads)]
        kept = [i for i in range(n) if late[i][0]]
        tracking_ids = struct.unpack(f"<{len(kept)}q", self._rand.randbytes(8 * len(kept)))
        k_keys = [order_keys[i] for i in kept]
        k_times: list[Mapping[str, Time]] = [late[i][0] for i in kept]
        k_payloads = [payloads[i] for i in kept]
        k_parts = [parts[i] for i in kept]
        values = self._encode_batch(k_keys, tracking_ids, k_times, None, k_payloads)
        # Nothing below raises for the batch's own sake: it is written from here on.
        written: list[SentRecord] = []
        if kept:
            if check_order:
                self._last_order_key = k_keys[-1]
            self._rr = rr
            written = sent_records(self.stream, k_parts, k_keys, tracking_ids, k_times)
            k_rec_keys = None if keys is None else [keys[i] for i in kept]
            self._write_batch(written, values, k_parts, k_rec_keys, None)
        it = iter(written)
        out: list[SentRecord] = []
        for i, (assigned, missed) in enumerate(late):
            if missed:
                self._write_late(payloads[i], None if keys is None else keys[i], parts[i], missed,
                                 written=bool(assigned))
            if assigned:
                out.append(next(it))
            else:
                out.append(SentRecord(self.stream, parts[i], order_keys[i], 0, {},
                                      dead_lettered=True))
        if kept and self._clocks:
            self._published(k_payloads)
        if self._pending >= self.batch_size and self._in_txn:
            self._batch_full()
        return out

    # -- seal policies ---------------------------------------------------------------------

    def _missed(
        self,
        payload: Mapping[str, Any],
        times: Mapping[str, Time] | None,
        items: Sequence[tuple[str, TimeAssigner]],
    ) -> tuple[tuple[str, Time, str], ...]:
        """Every substream of ``items`` in which the record is at a time this source sealed."""
        out = []
        for name, assigner in items:
            t = times[name] if times and name in times else assigner.raw_time_of(payload)
            why = assigner.sealed_below(t)
            if why is not None:
                out.append((name, t, why))
        return tuple(out)

    def _late_times(
        self,
        payload: Mapping[str, Any],
        times: Mapping[str, Time] | None,
        items: Sequence[tuple[str, TimeAssigner]] | None = None,
    ) -> tuple[dict[str, Time], tuple[tuple[str, Time, str], ...]]:
        """The times of a record found late somewhere, and the substreams it missed: late
        is per substream.  A missed substream whose rule is not ``dead_letter`` (``raise``,
        or sealed by hand) refuses the whole record, naming that substream; the others
        keep the record out of them only (it gets no time there)."""
        items = self._assigner_items if items is None else items
        missed = self._missed(payload, times, items)
        for name, _, why in missed:
            if self._late_rules.get(name) != "dead_letter":
                raise SealedTimeError(why)
        out = self._raw_times(payload, times, items)
        for name, _, _ in missed:
            del out[name]
        return out, missed

    def _raw_times(
        self,
        payload: Mapping[str, Any],
        times: Mapping[str, Time] | None,
        items: Sequence[tuple[str, TimeAssigner]],
    ) -> dict[str, Time]:
        """The record's time in every substream of ``items`` (``times`` overriding), seals
        ignored."""
        out: dict[str, Time] = {name: a.raw_time_of(payload) for name, a in items}
        if times:
            out.update(times)
        return out

    def _write_late(
        self,
        payload: Mapping[str, Any],
        key: str | bytes | None,
        partition: int,
        missed: tuple[tuple[str, Time, str], ...],
        *,
        written: bool,
    ) -> None:
        """``written``: the record itself went to the stream (on time somewhere)."""
        assert self._late_writer is not None  # checked with the policies
        self._begin()
        self._late_writer(
            self,
            LateRecord(self.stream, self.source_id, partition, key, payload, missed, written),
        )

    def _published(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        """The seals the records just written moved, into the open transaction, committed
        with those records at once unless a commit happened less than ``POLICY_TICK_S``
        ago (then the next record or the ticker commits them: a seal per record must not
        mean a commit per record)."""
        now = self.clock.now_ms()
        for name, clock, field in self._policy_fields:
            high = max(int(p[field]) for p in payloads)
            sealed = clock.published(high, now)
            if sealed is not None:
                self._policy_seal(name, sealed)
        # Also a seal left pending earlier: a caller that never pauses may keep the ticker
        # from the lock.
        if self._seal_pending and self.clock.monotonic() - self._committed_at >= POLICY_TICK_S:
            self.flush()

    def _policy_seal(self, name: str, sealed: PolicySeal) -> None:
        if sealed.kind == "keys":
            self.seal_keys(name, sealed.upto, commit=False)
        else:
            done = self.assigners[name].sealed
            if done is None or sealed.upto > done:
                self.seal(name, sealed.upto, commit=False)
        self._seal_pending = True

    def _start_ticking(self) -> None:
        """Run :meth:`_tick` on the ticker from now on (once: policies and full batches
        share it)."""
        if not self._ticking:
            self._ticking = True
            self.ticker.every(POLICY_TICK_S, self._tick)

    def _tick(self) -> None:
        """On the ticker: seal what idleness allows, commit policy seals the caller left
        pending, a full transaction that waited ``FULL_WAIT_S`` for a seal, and one whose
        first record waited ``max_open_ms`` -- only
        between two calls of the caller (its lock is not waited for)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._closed or self._tick_error is not None:
                return
            now = self.clock.now_ms()
            for name, clock in self._clocks.items():
                sealed = clock.idle(now)
                if sealed is not None:
                    self._policy_seal(name, sealed)
            full_at, opened_at = self._full_at, self._opened_at
            now_s = self.clock.monotonic()
            waited = full_at is not None and now_s - full_at >= FULL_WAIT_S
            aged = (opened_at is not None and self._max_open_s is not None
                    and now_s - opened_at >= self._max_open_s)
            if (self._seal_pending or waited or aged) and self._in_txn:
                self.flush()
        except Exception as exc:
            log.warning("stream '%s', source '%s': a commit on the ticker failed: %s",
                        self.stream, self.source_id, exc)
            self._tick_error = exc
        finally:
            self._lock.release()

    def _open_batch(
        self,
        records: list[SentRecord],
        parts: list[int],
        columns: dict[str, list[Time]] | None = None,
    ) -> tuple[Callable[[KafkaError | None, Message], None], list[SentRecord], list[int]]:
        """A batch of the open transaction for ``_deliver_batches`` and its one delivery
        callback, which collects the delivered offsets per partition."""
        got: dict[int, list[int]] = {}
        self._batches.append((records, parts, got, {} if columns is None else columns))

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                # A failed record (its transaction cannot commit).  Nothing of ``msg`` is
                # read, as the per-record callbacks never did: for a fenced producer's
                # record ``msg.offset()`` raised SystemError ("returned a result with an
                # exception set") in test_source_liveness, where the commit must raise
                # PublisherFencedError.
                return
            offset = msg.offset()
            partition = msg.partition()
            if offset is not None and partition is not None:
                offsets = got.get(partition)
                if offsets is None:
                    got[partition] = [offset]
                else:
                    offsets.append(offset)

        return delivered, records, parts

    def _produce_batch(
        self,
        values: Sequence[bytes],
        parts: Sequence[int],
        keys: Sequence[str | bytes | None] | None,
        callbacks: Sequence[Callable[[KafkaError | None, Message], None]] | None,
        refused: Callable[[int], None] | None = None,
    ) -> None:
        """The batch's records into the open transaction (:func:`produce_batch`; a fenced
        producer's refusal raised as :class:`PublisherFencedError`)."""
        self._guard(produce_batch, self._producer, self.stream, values, parts, keys, callbacks,
                    refused)

    def _kept_key(self) -> int:
        """The order key the framework keeps for a stream with no ``order_key`` field: this
        publisher's clock in ms, never below the last key it wrote -- an ingest time, so
        that event times may come in any order without a field added to the schema for it
        (docs/design.md, "The order key the framework keeps")."""
        now = self.clock.now_ms()
        last = self._last_order_key
        return now if last is None or now > last else last

    def _order_keys(self, payloads: Sequence[Mapping[str, Any]]) -> list[int]:
        field = self.stream_config.order_key
        if field is None:
            return [self._kept_key()] * len(payloads)
        try:
            return [int(p[field]) for p in payloads]
        except (KeyError, TypeError, ValueError):
            for p in payloads:  # name the culprit, as publish() does
                try:
                    int(p[field])
                except (KeyError, TypeError, ValueError) as exc:
                    raise SubstreamsError(
                        f"stream '{self.stream}': payload has no integer order key "
                        f"'{field}': {p!r}"
                    ) from exc
            raise

    def _check_batch_order(self, order_keys: list[int]) -> None:
        """Once per batch: sorted input passes with one C-level comparison of lists."""
        last = self._last_order_key
        if (last is None or order_keys[0] >= last) and sorted(order_keys) == order_keys:
            return
        field = self.stream_config.order_key
        prev = last
        for i, k in enumerate(order_keys):
            if prev is not None and k < prev:
                raise OrderKeyRegressionError(
                    f"stream '{self.stream}', source '{self.source_id}': order key "
                    f"{field}={k} (record {i} of the batch) is below the previous {prev}; "
                    "order keys must be non-decreasing (nothing of the batch was written)"
                )
            prev = k

    def _partitions_of(
        self,
        n: int,
        keys: Sequence[str | bytes | None] | None,
        partitions: Sequence[int] | None,
    ) -> tuple[list[int], int]:
        """Every record's partition, as ``partition_for`` would pick them, and where the
        round robin stands afterwards (moved only once the batch is accepted)."""
        count = self.partitions
        rr = self._rr
        if partitions is not None:
            out = list(partitions)
            if min(out) < 0 or max(out) >= count:
                bad = next(p for p in out if not 0 <= p < count)
                raise SubstreamsError(
                    f"stream '{self.stream}' has partitions 0..{count - 1}, not {bad}"
                )
            return out, rr
        if keys is None:
            out = [(rr + 1 + i) % count for i in range(n)]
            return out, out[-1]
        out = []
        for key in keys:
            if key is None:
                rr = (rr + 1) % count
                out.append(rr)
            else:
                raw = key.encode() if isinstance(key, str) else key
                out.append(zlib.crc32(raw) % count)
        return out, rr

    def _times_of(
        self,
        payloads: Sequence[Mapping[str, Any]],
        overrides: Sequence[Mapping[str, Time] | None] | None,
    ) -> tuple[list[Mapping[str, Time]], tuple[str, list[int]] | None]:
        """Every record's times, one column per substream (see ``TimeAssigner.times_of``),
        and, for one epoch or tumbling substream without overrides, its name and int column
        (the envelopes are then framed from the column: ``encode_many_int_times``)."""
        n = len(payloads)
        column: tuple[str, list[int]] | None = None
        if not self._assigner_items:
            out: list[Mapping[str, Time]] = [{} for _ in range(n)]
        elif len(self._assigner_items) == 1:
            name, assigner = self._assigner_items[0]
            col = assigner.times_of(payloads)
            out = [{name: t} for t in col]
            if overrides is None and assigner.substream.kind in _INT_KINDS:
                column = (name, cast(list[int], col))
        else:
            columns = [(name, a.times_of(payloads)) for name, a in self._assigner_items]
            out = [{name: col[i] for name, col in columns} for i in range(n)]
        if overrides is not None:
            for i, extra in enumerate(overrides):
                if extra:
                    for name, t in extra.items():
                        if name in self.assigners:
                            self.assigners[name].check(t)
                    out[i] = {**out[i], **extra}
        return out, column

    def _produce(
        self,
        value: bytes,
        partition: int,
        key: str | bytes | None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        try:  # librdkafka directly (as produce_batch): no kwargs dict, no second layer
            self._producer.produce(self.stream, value, key, partition, on_delivery)
        except BufferError:  # a full queue: produce() waits it out, serving callbacks
            produce(
                self._producer, self.stream, value,
                key=key, partition=partition, on_delivery=on_delivery,
            )
        except KafkaException as exc:  # a fenced producer's refusal: PublisherFencedError
            self._guard(raise_fatal, self._producer, exc)

    def produce_aside(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int = 0,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Write ``value`` to another topic inside the open transaction, so that it becomes
        visible exactly when (and only if) this publisher's records do — e.g. an exactly-once
        sink's batch marker, or the acker's reports."""
        self._begin()
        self._written = True
        self._guard(
            produce, self._producer, topic, value, key=key, partition=partition, headers=headers
        )

    def _write(self, writes: Sequence[Write]) -> None:
        """A hook's writes, into the open transaction (after the records written so far).
        The first write of a transaction without records settles first (:meth:`_settle`)."""
        if writes:
            if not self._written and not self._pending:
                self._settle()
            self._begin()
            self._written = True
            for w in writes:
                self._guard(
                    produce, self._producer, w.topic, w.value,
                    partition=w.partition, headers=w.headers,
                )

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Commit a reader's input positions inside the open transaction (Kafka's
        exactly-once read-process-write): they become the group's committed offsets exactly
        when this publisher's records do."""
        self._begin()
        self._written = True
        self._guard(self._producer.send_offsets_to_transaction, offsets, group_metadata, 30)

    @_locked
    def flush(self, patience: float = client.COMMIT_PATIENCE_S) -> None:
        """Commit the open transaction: its records become visible to readers at once.

        A broker outage is waited out (``client.COMMIT_PATIENCE_S``): a commit that timed out
        is still in progress and is called again, never aborted.  A ``KafkaException``
        that escapes after that is either abortable (abort and write again) or, if still
        ``retriable()``, leaves the outcome unknown (call ``flush()`` again)."""
        if self._in_txn:
            try:
                with client.committing(self._producer):
                    self._commit(patience)
            except BaseException as exc:
                self._failed = exc  # close() drops the transaction instead of committing
                raise
            self._failed = None
            self._in_txn = False
            self._written = False
            self._pending = 0
            self._full_at = None
            self._opened_at = None
            self._seal_pending = False
            self._committed_at = self.clock.monotonic()
            how: Ending = "closed" if self._closing else "committed"
            for hook in self._hook_list:
                hook.ended(how)

    def _commit(self, patience: float) -> None:
        """The open transaction's delivery flush, the hooks' last writes, the commit."""
        what = f"stream '{self.stream}', source '{self.source_id}'"
        call = client.commit_timeout(self.config)
        if self._delivery_hooks:
            # Every delivery callback (offsets) before the hooks' last word.
            self._guard(client.flush_producer, self._producer, what, patience)
            self._deliver_batches()
        try:
            for hook in self._hook_list:
                self._write(hook.before_commit(self._closing))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._STATE:
                # Refused because the transaction already failed (a record's delivery timed
                # out during an outage: "Erroneous state").  The commit names the real
                # error -- abortable or fatal; it cannot succeed in that state.
                self._guard(
                    client.commit_transaction, self._producer, what, patience,
                    call_timeout=call,
                )
                raise
            # Refused for itself (larger than the producer's message.max.bytes, ...) in a
            # sound transaction: committing it would make the records visible without the
            # hooks' reports and seals, and the hooks asked so far no longer hold what they
            # wrote -- so the transaction is aborted and the publisher released, as by
            # abort(), whatever the caller does next (a later close() has nothing to do).
            outcome = self._abort()
            log.error("%s: a hook's write was refused (%s): the transaction %s, its %d "
                      "records are not committed; the publisher is released", what,
                      _describe(exc), outcome, self._pending)
            raise
        self._guard(client.commit_transaction, self._producer, what, patience, call_timeout=call)

    def _deliver_batches(self) -> None:
        """Hand every ``publish_many`` batch of the transaction to the delivery hooks, once
        each, with its records' offsets.

        Why the offsets collected per partition can be matched to the records: a
        transactional producer is idempotent, so a partition appends this producer's records
        in the order they were produced -- the batch's records of partition ``p``, in batch
        order, hold ``p``'s offsets sorted (whatever order the callbacks came in, and
        whoever else wrote between them).  A partition with a record whose delivery failed
        (fewer offsets than records) is left out: its transaction cannot commit."""
        batches, self._batches = self._batches, []
        self._singles = None
        for records, parts, got, columns in batches:
            its = {p: iter(sorted(offs)) for p, offs in got.items()}
            counts = Counter(parts).items()
            if all(len(got.get(p, ())) == c for p, c in counts):
                offsets = list(map(next, map(its.__getitem__, parts)))
            else:
                full = {p for p, c in counts if len(got.get(p, ())) == c}
                kept = [i for i, p in enumerate(parts) if p in full]
                records = [records[i] for i in kept]
                offsets = [next(its[parts[i]]) for i in kept]
                parts = [parts[i] for i in kept]
                columns = {name: [col[i] for i in kept] for name, col in columns.items()}
            for delivered in self._delivered:
                delivered(records, parts, offsets, columns)

    @_locked
    def commit(self, patience: float = client.COMMIT_PATIENCE_S) -> None:
        """Commit now, even with no record pending: the hooks' messages (registrations,
        seals) are written in a transaction of their own."""
        self._begin()
        self.flush(patience)

    def _hook_for(self, substream: str) -> PublishHook:
        hook = self._hooks.get(substream)
        if hook is None:
            known = ", ".join(self.assigners) or "none"
            raise SubstreamsError(
                f"stream '{self.stream}' has no tracked substream '{substream}' (known: {known})"
            )
        return hook

    @_locked
    def seal(self, substream: str, time: Time, *, commit: bool = True) -> None:
        """Promise that this source writes no more records at times <= ``time`` of
        ``substream``; the substream's mechanism makes that known downstream.  From the
        call on, a record at a time ``<= time`` raises :class:`SealedTimeError`.

        The seal takes effect with the commit of the records written before it, in their
        transaction: at once (``commit=True``), or with the next commit (batch boundary,
        ``flush()``, ``close()``) so that many fine-grained seals share one transaction.
        Seal *instead of* calling ``flush()`` first: a seal with nothing pending commits
        alone, and right after a commit it first waits out ``SETTLE_S`` (the broker refuses
        a transaction while the previous one's markers are written, and librdkafka retries
        after a fixed 20 ms)."""
        hook = self._hook_for(substream)
        self._begin()
        self._write(hook.seal(substream, time, False))
        self.assigners[substream].seal(time)  # from now on a record at or below it is refused
        if commit:
            self.flush()

    @_locked
    def seal_keys(self, substream: str, upto: int, *, commit: bool = True) -> None:
        """The keyed seal: this source writes no more records at ``Keyed(k, t)`` with
        ``t <= upto`` of ``substream``, for **every** key ``k`` -- also keys it never wrote.

        Why it exists: a session or per-key substream written by several sources ends only
        when every source promises to add nothing to it, and a source cannot seal one by
        one the keys it does not know.  For a session substream ``upto`` is an event time
        (a session ending at ``e`` closes once every source sealed keys up to ``e +
        gap_ms``); for per_key it closes every key at once.  A lower seal than before is a
        no-op; a later record at a sealed time raises :class:`SealedTimeError`.  Takes
        effect with a commit, as :meth:`seal`."""
        hook = self._hook_for(substream)
        assigner = self.assigners[substream]
        if not assigner.seals_keys_anew(upto):
            return
        self._begin()
        self._write(hook.seal(substream, upto, True))
        assigner.seal_keys(upto)  # only a seal the mechanism took is a promise
        if commit:
            self.flush()

    def watermark(self, event_ms: int, *, commit: bool = False) -> None:
        """Event time has reached ``event_ms`` for this source: every later record of it has
        an event time ``>= event_ms``.  Seals keys up to ``event_ms - 1`` in each session
        substream of the stream (what closes sessions; cheap to call per record: one keyed
        seal per substream travels with the next commit)."""
        for name, assigner in self._assigner_items:
            if assigner.substream.kind == "session" and name in self._hooks:
                self.seal_keys(name, event_ms - 1, commit=commit)

    def close(self) -> None:
        """Commit what is pending and leave: the hooks' last words (an Unregister) go into
        the final transaction, so a fenced publisher's close raises and writes nothing.
        (An error the ticker met is not raised first: the final commit meets it again, and
        the publisher is released either way.)"""
        with self._lock:
            self._tick_error = None
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        if self._failed is not None:
            self._close_failed(self._failed)
            return
        self._closing = True
        told = False
        try:
            if self._hook_list:
                self.commit()  # the hooks' last words: before_commit(last=True)
            else:
                self.flush()
            told = True
            self._producer.flush(10)
        finally:
            self._closed = True
            self.ticker.close()
            try:
                if not told:  # the final commit failed: dropped, the hooks announce nothing
                    outcome = self._drop()
                    log.warning("stream '%s', source '%s': the final commit failed; its "
                                "transaction %s", self.stream, self.source_id, outcome)
            finally:
                if not told:
                    self._end_hooks()
                self._release()

    def _close_failed(self, failed: BaseException) -> None:
        """``close()`` after a commit that raised (and was neither retried with success nor
        aborted): nothing of that transaction can be committed any more, so it is dropped
        and the publisher released as by :meth:`abort` -- logged, not raised (the commit
        raised already; a close that raised again left the caller nothing to do about it).
        The hooks let go announcing nothing: no Unregister, so the acker keeps the source's
        unsealed times open, as after a crash, until the source restarts and seals them
        (or is evicted)."""
        outcome = self._abort()
        log.warning(
            "stream '%s', source '%s': closed after a failed commit (%s): its transaction %s; "
            "its records and the hooks' messages (reports, seals, the Unregister) were not "
            "written, and the source's unsealed times stay open until it restarts",
            self.stream, self.source_id, _describe(failed), outcome,
        )

    def _drop(self) -> str:
        """Abort the open transaction, if any, without raising; what became of it (a fenced
        or otherwise failed producer may refuse the abort: then the broker's transaction
        timeout, or the next incarnation's ``init_transactions``, aborts it)."""
        if not self._in_txn:
            return "was already aborted"
        self._in_txn = False
        self._written = False
        self._full_at = None
        self._opened_at = None
        try:
            self._producer.abort_transaction(10)
        except KafkaException as exc:
            return f"could not be aborted here ({_describe(exc)}): the broker aborts it"
        return "was aborted"

    def abort(self) -> None:
        """Drop the open transaction and release the publisher (used after errors).

        Never raises: it runs while another exception is on its way, which must not be
        replaced by a clean-up failure."""
        if self._closed:
            return
        with self._lock:
            self._abort()

    def _abort(self) -> str:
        """:meth:`abort`; what became of the open transaction (:meth:`_drop`)."""
        if self._closed:
            return "was already closed"
        outcome = "was already aborted"
        try:
            outcome = self._drop()
        finally:
            self.ticker.close()
            self._opened_at = None
            self._closed = True
            self._batches = []
            self._singles = None
            self._end_hooks()
            self._release()
        return outcome

    def _end_hooks(self) -> None:
        """Every hook told its publisher is released with its transaction dropped (never
        raises: it runs while another exception may be on its way)."""
        for hook in self._hook_list:
            with contextlib.suppress(SubstreamsError, KafkaException):
                hook.ended("aborted")

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _describe(exc: BaseException) -> str:
    """An error in a line: a Kafka error's own text, anything else as its type and text."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(err, KafkaError):
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}"
