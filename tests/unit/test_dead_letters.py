"""The one dead-letter writer, without a broker: the format every service writes (and reads
back), and a flush that cannot deliver raises and keeps the letters for the next one, so
that a service never commits a position past a message whose dead letter is not on the
topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Producer

from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.errors import ProtocolError
from substreams.streams.deadletter import (
    REASON_MALFORMED,
    DeadLetter,
    DeadLetterWriter,
    UndeliveredError,
)


def config(tmp_path: Path) -> Config:
    (tmp_path / "c.avsc").write_text(
        '{"type":"record","name":"C","fields":[{"name":"ts","type":"long"}]}'
    )
    text = (
        "kafka: {bootstrap: 'localhost:1'}\n"
        "streams: [{name: c, schema: c.avsc, order_key: ts}]\n"
        "substreams: [{name: s, stream: c, kind: epoch, field: ts}]\n"
        "acker: {dead_letter_topic: dlq}\n"
    )
    return load_config_text(text, tmp_path / "substreams.yaml")


class Delivery:
    """Where a fake producer's message went (what a delivery callback receives)."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class FlakyProducer:
    """Queues what is produced; ``flush`` delivers it, failing the first ``failures``."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.queued: list[tuple[str, bytes, Any]] = []
        self.delivered: list[tuple[str, bytes]] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.queued.append((topic, kwargs["value"], kwargs["on_delivery"]))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        queued, self.queued = self.queued, []
        for topic, value, callback in queued:
            if self.failures > 0:
                self.failures -= 1
                callback(KafkaError(KafkaError._MSG_TIMED_OUT), Delivery(-1))
            else:
                self.delivered.append((topic, value))
                callback(None, Delivery(len(self.delivered) - 1))
        return 0


def test_every_field_round_trips_through_the_one_json_format() -> None:
    letter = DeadLetter("aligner.s", REASON_MALFORMED, "c", 2, 41, b"\x00\xff", "bad", "src")
    assert DeadLetter.from_json(letter.to_json()) == letter
    with pytest.raises(ProtocolError, match="not a dead letter"):
        DeadLetter.from_json(b'{"reason": "x"}')


def test_a_failed_delivery_is_sent_again_and_a_flush_that_cannot_deliver_raises(
    tmp_path: Path,
) -> None:
    producer = FlakyProducer(failures=3)
    writer = DeadLetterWriter(config(tmp_path), "acker-x", producer=cast(Producer, producer))
    offsets: list[int] = []
    writer.write(DeadLetter("acker-x", REASON_MALFORMED, "acks", 0, 7, b"?", "bad"),
                 on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
    # delivered with an error, sent again, failed again: the caller must not commit
    with pytest.raises(UndeliveredError, match="acker-x: dead letters to 'dlq'"):
        writer.flush(patience=1.0)
    assert writer.pending == 1 and producer.delivered == []
    writer.flush(patience=1.0)  # kept, and delivered by the next flush
    assert writer.pending == 0 and offsets == [-1, -1, -1, 0]
    [(topic, value)] = producer.delivered
    assert topic == "dlq"
    assert DeadLetter.from_json(value) == DeadLetter(
        "acker-x", REASON_MALFORMED, "acks", 0, 7, b"?", "bad"
    )


def test_a_transactional_writer_writes_into_the_publisher_s_transaction(
    tmp_path: Path,
) -> None:
    aside: list[tuple[str, bytes, bytes | None]] = []

    class Txn:
        def produce_aside(self, topic: str, value: bytes, *, key: bytes | None = None) -> None:
            aside.append((topic, value, key))

    writer = DeadLetterWriter(config(tmp_path), "stage.x", publisher=cast(Any, Txn()))
    writer.write(DeadLetter("stage.x", REASON_MALFORMED, "in", 1, 3, b"raw"), key=b"k")
    writer.flush()  # nothing to wait for: the transaction's commit makes it durable
    assert writer.pending == 0 and writer.written == 1
    [(topic, value, key)] = aside
    assert (topic, key, DeadLetter.from_json(value).offset) == ("dlq", b"k", 3)
