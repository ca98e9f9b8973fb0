"""Dead letters: acks the acker cannot apply, kept for inspection instead of crashing on them.

Why not crash: one malformed or late message (a foreign producer on the acks topic, a
source that reports after its time terminated) must not stop progress for every other
substream.  Each dead letter is a JSON value ``{"reason", "topic", "partition", "offset",
"source", "detail", "raw"}``: the raw message is kept base64-encoded in ``raw``, so each
dead letter is one self-describing JSON document.

Delivery is at least once: dead letters are written outside the acker's control
transaction, so a restarted acker that replays acks since its last checkpoint may write one
twice (same topic/partition/offset: easy to de-duplicate).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message, Producer

from substreams import metrics
from substreams.config import Config
from substreams.kafka import client
from substreams.kafka.read import drain
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

# Service messages go out at once: latency matters more than batching here.
_NO_LINGER: dict[str, Any] = {"linger.ms": 0}


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    topic: str
    partition: int
    offset: int
    source: str | None
    raw: bytes
    detail: str = ""

    @classmethod
    def of(cls, msg: Message, reason: str, detail: str, source: str | None = None) -> DeadLetter:
        """The dead letter of the Kafka message ``msg`` (its raw value kept)."""
        return cls(
            reason, msg.topic() or "", msg.partition() or 0, msg.offset() or 0, source,
            msg.value() or b"", detail,
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "reason": self.reason,
                "detail": self.detail,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "source": self.source,
                "raw": base64.b64encode(self.raw).decode(),
            }
        ).encode()

    @staticmethod
    def from_json(value: bytes) -> DeadLetter:
        d = json.loads(value)
        return DeadLetter(
            d["reason"],
            d["topic"],
            int(d["partition"]),
            int(d["offset"]),
            d.get("source"),
            base64.b64decode(d.get("raw", "")),
            d.get("detail", ""),
        )


class PlainWriter:
    """A service's plain (non-transactional) writer: its dead letters (:meth:`write`) and
    the command responses it sends (:meth:`produce`)."""

    def __init__(self, config: Config, bootstrap: str) -> None:
        self.topic = config.acker.dead_letter_topic
        self.producer: Producer = client.producer(bootstrap, config, **_NO_LINGER)
        self.written = 0

    def write(self, letter: DeadLetter) -> None:
        log.warning(
            "dead letter: %s at %s[%d]@%d%s: %s", letter.reason, letter.topic, letter.partition,
            letter.offset, "" if letter.source is None else f" (source '{letter.source}')",
            letter.detail,
        )
        self.produce(self.topic, letter.to_json())
        self.written += 1

    def produce(self, topic: str, value: bytes) -> None:
        produce(self.producer, topic, value)
        self.producer.poll(0)

    def close(self) -> None:
        self.producer.flush(10)


def write_late_record(publisher: Publisher, late: LateRecord) -> None:
    """A late record's dead letter, in the publisher's open transaction: it becomes visible
    exactly when the records written around it do (never for an aborted batch, never
    twice).  ``topic``/``partition`` say where the record would have gone (``offset`` -1:
    it never got one), ``raw`` holds its payload as JSON, ``detail`` each substream time it
    missed and why."""
    raw = json.dumps(dict(late.payload), default=str, sort_keys=True).encode()
    detail = "; ".join(why for _, _, why in late.missed)
    letter = DeadLetter(
        REASON_LATE, late.stream, late.partition, -1, late.source, raw, detail
    )
    key = late.key.encode() if isinstance(late.key, str) else late.key
    publisher.produce_aside(
        publisher.config.acker.dead_letter_topic, letter.to_json(), key=key
    )
    metrics.DEAD_LETTERS.labels(f"publisher:{late.stream}/{late.source}", REASON_LATE).inc()


def read_dead_letters(
    config: Config, bootstrap: str | None = None, timeout: float = 30.0
) -> Iterator[DeadLetter]:
    """Every dead letter so far (for tests and ``acker status``); the whole topic or an error."""
    server = client.resolve_bootstrap(config, bootstrap)
    for msg in drain(server, config, config.acker.dead_letter_topic, timeout=timeout):
        yield DeadLetter.from_json(msg.value())
