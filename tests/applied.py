"""Wait until the acker has provably applied every ack committed so far.

Why: a test that asserts an *absence* (no notification, no eviction) after a fixed sleep
passes vacuously when the acker is slow.  The event to wait on: a marker written to every
acks partition now -- after every ack already committed there, so a ``read_committed``
reader reaches it only past them -- appears in the acker's committed checkpoint.  The
checkpoint is written in the same transaction as the notifications and evictions its state
accounts for, so once it covers the marker, whatever those acks caused is on the control
topics."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, Message

from substreams.acker.protocol import AckMessage, SourceHeartbeat, ack_headers, encode_ack
from substreams.acker.service import latest_checkpoint
from substreams.config import Config
from substreams.control.messages import Checkpoint
from substreams.kafka import client

MARKER_SOURCE = "tests.applied-marker"
"""The marker's source: a heartbeat of a source the acker holds no session of, counted as
stale and dropped (acker rule 4) -- it changes nothing but the acker's position."""


def write_markers(config: Config, timeout: float = 30.0) -> dict[int, int]:
    """One marker per acks partition; the offset each was written at."""
    server = client.resolve_bootstrap(config)
    topic = config.acker.acks_topic
    producer = client.producer(server, config)
    at: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"{topic}[{msg.partition()}]: {err}")
        else:
            at[msg.partition()] = msg.offset()

    value = encode_ack(AckMessage(MARKER_SOURCE, -1, int(time.time() * 1000),
                                  SourceHeartbeat(), "marker"))
    for p in range(config.acker.acks_partitions):
        producer.produce(topic, value, partition=p, headers=ack_headers(), on_delivery=delivered)
    left = producer.flush(timeout)
    assert not errors and not left, f"acks markers not written: {errors or left}"
    return at


def acks_applied(config: Config, timeout: float = 30.0, name: str | None = None) -> None:
    """Block until acker ``name`` (default: the config's) committed a checkpoint whose acks
    offsets are past a marker written to each acks partition now; AssertionError naming the
    partitions behind after ``timeout``."""
    marks = write_markers(config, timeout)
    server = client.resolve_bootstrap(config)
    name = name or config.acker.name
    deadline = time.monotonic() + timeout
    behind: dict[int, tuple[int, int]] = {}
    while True:
        found = latest_checkpoint(server, config, name)
        if found is not None:
            body = found[1].body
            assert isinstance(body, Checkpoint)
            offsets = dict(body.acks_offsets)
            behind = {p: (offsets.get(p, 0), at) for p, at in marks.items()
                      if offsets.get(p, 0) <= at}
            if not behind:
                return
        assert time.monotonic() < deadline, (
            f"acker '{name}' did not apply the acks within {timeout} s: (checkpointed offset, "
            f"marker offset) per partition behind: {behind or 'no checkpoint yet'}"
        )
        time.sleep(0.05)  # polling a condition, not waiting for time to pass
