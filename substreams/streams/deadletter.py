"""Dead letters: messages a service cannot use, kept for inspection instead of crashing on them.

Why not crash: one malformed or late message (a foreign producer on the acks topic, a
source that reports after its time terminated) must not stop progress for every other
substream.  Every service writes them through :class:`DeadLetterWriter`, in one format: a
JSON value ``{"service", "reason", "detail", "topic", "partition", "offset", "source",
"raw", "substreams"}`` -- who wrote it, why, where the message was read (``offset`` -1: a
record that never got one), the source that sent it when known, the message's bytes
base64-encoded in ``raw``, and the substreams it is about when known (a late record's).
One self-describing JSON document, readable with any consumer.

Durability follows the service's own commit.  A writer on a publisher's open transaction
(late records, a stage) makes its letters visible exactly with that transaction.  A plain
writer (the acker, its command handler, the punctuation aligner) is at least once: the
service calls :meth:`DeadLetterWriter.flush` before it commits a position past the message,
and a flush that cannot deliver raises, so that nothing is committed as handled before its
dead letter is durable.  A restart that re-reads a message dead-letters it again (same
topic/partition/offset: easy to de-duplicate).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from substreams import metrics
from substreams.config import Config
from substreams.errors import BrokerError, ProtocolError
from substreams.kafka import client
from substreams.kafka.write import produce
from substreams.streams.publisher import LateRecord, Publisher

log = logging.getLogger(__name__)

REASON_MALFORMED = "malformed"
REASON_UNKNOWN_SUBSTREAM = "unknown_substream"
REASON_UNREGISTERED = "unregistered_source"
REASON_TERMINATED = "terminated_time"
REASON_STALE = "stale_incarnation"
REASON_LATE = "late_record"
"""A record a publisher refused under its seal policy's ``late: dead_letter`` rule."""
REASON_FOREIGN = "foreign_bytes"
"""A data-topic record that is not single-object encoded Avro (JSON, empty, anything)."""
REASON_UNKNOWN_SCHEMA = "unknown_schema"
"""A data-topic record whose writer fingerprint no registered schema of its stream has."""
REASON_REPLAYED = "replayed"
"""Not a dead letter: the marker a ``dead-letters replay`` writes with each record it
republishes (same transaction), naming the record.  It lives in the dead-letter topic
because that is the replay's log (:mod:`substreams.streams.letters`); every reader of
the topic skips it as a letter (:attr:`DeadLetter.is_replay_marker`)."""
REASON_UNDECODABLE = "undecodable"
"""A data-topic record of a known fingerprint whose body does not decode (truncated,
garbled, written with another schema under that fingerprint)."""

Delivered = Callable[[KafkaError | None, Message], None]

_NO_LINGER: dict[str, Any] = {"linger.ms": 0}
"""A dead letter goes out at once: there is nothing to batch it with."""


class UndeliveredError(BrokerError):
    """Dead letters that could not be delivered: the position past their messages must not
    be committed (the service replays them, or stops)."""


@dataclass(frozen=True)
class DeadLetter:
    service: str
    reason: str
    topic: str
    partition: int
    offset: int
    raw: bytes
    detail: str = ""
    source: str | None = None
    substreams: tuple[str, ...] = ()
    """The substreams it is about, when known: a late record's letter names each
    substream it was kept out of (late is per substream)."""

    @property
    def is_replay_marker(self) -> bool:
        """A replay's marker (:data:`REASON_REPLAYED`), not a letter: not listed, counted
        or replayed as one."""
        return self.reason == REASON_REPLAYED

    def to_json(self) -> bytes:
        return json.dumps({
            **asdict(self), "raw": base64.b64encode(self.raw).decode(),
            "substreams": list(self.substreams),
        }).encode()

    @staticmethod
    def from_json(value: bytes) -> DeadLetter:
        try:
            d = json.loads(value)
            return DeadLetter(
                str(d.get("service", "")), d["reason"], d["topic"], int(d["partition"]),
                int(d["offset"]), base64.b64decode(d.get("raw", "")), d.get("detail", ""),
                d.get("source"), tuple(str(s) for s in d.get("substreams") or ()),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"not a dead letter: {exc!r}") from exc


class DeadLetterWriter:
    """Writes one service's dead letters: a log line, ``substreams_dead_letters_total``
    (labelled with ``service``) and the letter.

    ``publisher``: into its open transaction (see the module).  Else through ``producer``
    (one the service already has) or one of its own, created on the first letter (most
    services never write one); :meth:`flush` then makes them durable."""

    def __init__(
        self,
        config: Config,
        service: str,
        *,
        bootstrap: str | None = None,
        publisher: Publisher | None = None,
        producer: Producer | None = None,
    ) -> None:
        self.config = config
        self.service = service
        self.topic = config.acker.dead_letter_topic
        self.written = 0
        self._bootstrap = bootstrap
        self._publisher = publisher
        self._producer = producer
        self._own = producer is None and publisher is None
        self._pending: dict[int, tuple[DeadLetter, Delivered | None]] = {}
        """Letters written and not yet delivered, by sequence."""
        self._failed: list[int] = []
        """Those whose delivery failed: sent again by the next flush."""
        self._seq = 0

    def write_message(
        self, msg: Message, reason: str, detail: str, source: str | None = None
    ) -> DeadLetter:
        """The dead letter of the Kafka message ``msg`` (its raw value kept)."""
        return self.write(DeadLetter(
            self.service, reason, msg.topic() or "", msg.partition() or 0, msg.offset() or 0,
            msg.value() or b"", detail, source,
        ))

    def write(
        self, letter: DeadLetter, key: bytes | None = None, on_delivery: Delivered | None = None,
        *, quiet: bool = False,
    ) -> DeadLetter:
        """Write ``letter`` (``key``: a transactional writer's message key; ``on_delivery``:
        a plain writer's delivery callback; ``quiet``: no log line, the caller logs runs of
        letters itself)."""
        if not quiet:
            log.warning(
                "dead letter: %s at %s[%d]@%d%s: %s", letter.reason, letter.topic,
                letter.partition, letter.offset,
                "" if letter.source is None else f" (source '{letter.source}')", letter.detail,
            )
        metrics.DEAD_LETTERS.labels(self.service, letter.reason).inc()
        self.written += 1
        if self._publisher is not None:
            self._publisher.produce_aside(self.topic, letter.to_json(), key=key)
        else:
            self._seq += 1
            self._pending[self._seq] = (letter, on_delivery)
            self._send(self._seq)
        return letter

    def _send(self, seq: int) -> None:
        if self._producer is None:
            self._producer = client.producer(
                client.resolve_bootstrap(self.config, self._bootstrap), self.config, **_NO_LINGER
            )
        letter, callback = self._pending[seq]

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self._pending.pop(seq, None)
            else:
                self._failed.append(seq)
            if callback is not None:
                callback(err, msg)

        produce(self._producer, self.topic, letter.to_json(), partition=0, on_delivery=delivered)
        self._producer.poll(0)

    @property
    def pending(self) -> int:
        """Letters written and not yet known delivered (0 for a transactional writer)."""
        return len(self._pending)

    def flush(self, patience: float = client.COMMIT_PATIENCE_S) -> None:
        """Wait until every letter written is on the topic, sending a failed one again
        (waiting out a broker outage of up to ``patience`` seconds); an
        :class:`UndeliveredError` after that, the letters kept for the next flush.  Call it
        before committing a position past the messages dead-lettered."""
        if not self._pending:
            return
        what = f"{self.service}: dead letters to '{self.topic}'"
        for _ in range(2):  # a failed delivery is sent once more, then it must be there
            failed, self._failed = self._failed, []
            for seq in failed:
                self._send(seq)
            try:
                assert self._producer is not None  # created by the first letter
                client.flush_producer(self._producer, what, patience)
            except BrokerError as exc:
                raise UndeliveredError(str(exc)) from exc
            if not self._pending:
                return
        raise UndeliveredError(f"{what}: {len(self._pending)} not delivered")

    def close(self) -> None:
        """Deliver what is pending if the broker lets us, briefly: a letter lost here is one
        whose position was not committed, so it is written again after a restart."""
        if self._producer is not None and self._own:
            self._producer.flush(10)
            self._producer = None


def write_late_record(publisher: Publisher, late: LateRecord) -> None:
    """A late record's dead letter, in the publisher's open transaction: it becomes visible
    exactly when the records written around it do (never for an aborted batch, never
    twice).  One letter per late record, naming in ``substreams`` every substream it was
    kept out of; ``topic``/``partition`` say where the record went or would have gone
    (``offset`` -1: the letter is written before the record gets one), ``raw`` holds its
    payload as JSON (UTF-8, base64-encoded like every letter's ``raw``), ``detail`` each
    substream time it missed and why, and whether the record was written for the others."""
    writer = DeadLetterWriter(
        publisher.config, f"publisher:{late.stream}/{late.source}", publisher=publisher
    )
    detail = "; ".join(why for _, _, why in late.missed)
    if late.written:
        names = ", ".join(f"'{name}'" for name, _, _ in late.missed)
        detail += f" (kept out of {names} only: written to the stream, on time in the others)"
    writer.write(late_letter(writer.service, late.stream, late.partition, -1, late.source,
                             late.payload, detail, tuple(name for name, _, _ in late.missed)),
                 key=late.key.encode() if isinstance(late.key, str) else late.key)


def late_letter(
    service: str, topic: str, partition: int, offset: int, source: str,
    payload: Any, detail: str, substreams: tuple[str, ...] = (),
) -> DeadLetter:
    """A record refused for lateness: its payload, as JSON, is the letter's ``raw``."""
    raw = json.dumps(dict(payload), default=str, sort_keys=True).encode()
    return DeadLetter(service, REASON_LATE, topic, partition, offset, raw, detail, source,
                      substreams)
