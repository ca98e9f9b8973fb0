"""Reading a partition to its end, in one place, with one rule: never a partial answer.

Why: the first version had a read-to-end loop per caller, and some returned what they had
when their deadline passed (``read_commits`` in the Spark sink did, and the sink's
exactly-once decision rested on it: a slow broker could make a committed batch look
uncommitted and have it written twice).  Here reaching the end of the partition (librdkafka's
partition EOF; the last stable offset under ``read_committed``) is the only way to return,
and a timeout or any other error raises :class:`~substreams.errors.BrokerError` naming the
topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from substreams.config import Config
from substreams.errors import BrokerError
from substreams.kafka import client

__all__ = ["drain", "read_to_end"]


def read_to_end(consumer: Consumer, topic: str, timeout: float = 30.0) -> list[Message]:
    """Every message of ``consumer``'s one assigned partition from its position up to the
    partition's end, in order (the consumer needs ``enable.partition.eof``)."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise BrokerError(f"topic '{topic}': no end of partition within {timeout:g} s")
        at_end = False
        for msg in consumer.consume(1000, 0.2):
            err = msg.error()
            if err is None:
                out.append(msg)
                at_end = False
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end = True
            else:
                raise BrokerError(f"topic '{topic}': {err}")
        if at_end:
            return out


def drain(
    bootstrap: str,
    config: Config | None,
    topic: str,
    partition: int = 0,
    start: int = 0,
    timeout: float = 30.0,
) -> Iterator[Message]:
    """Every message of ``topic[partition]`` from offset ``start`` to its end, with a consumer
    of its own (closed afterwards)."""
    consumer = client.consumer(bootstrap, config, **{"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        yield from read_to_end(consumer, topic, timeout)
    finally:
        consumer.close()
