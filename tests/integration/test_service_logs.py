"""What the long-running services say through ``logging``: start, recovery (what was read,
from where, how long), take-over, evictions, dead letters and rewinds.

The acker process's and the command handler's lines through ``--log-level`` on a real
``substreams acker run`` are checked in ``test_fuzzed_input.py``; the aligner's there too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from confluent_kafka import Producer

from substreams.acker.protocol import AckMessage, Evict, ack_headers, acks_partition, encode_ack
from substreams.acker.stage import Stage
from substreams.app import Application
from substreams.frontier import Time
from substreams.spark.operator import EpochInfo, EpochOperator, Row
from substreams.spark.runner import EpochBatchHandler
from substreams.streams.records import Entry
from substreams.streams.schemas import Codec, envelope_schema
from tests.conftest import CLICK_SCHEMA, ConfigFactory
from tests.integration.test_acker import acker, wait_notifications


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def has(messages: list[str], *parts: str) -> bool:
    """Some message contains every one of ``parts``."""
    return any(all(p in m for p in parts) for m in messages)


def test_acker_and_standby_log_start_recovery_takeover_eviction_and_dead_letters(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker={"heartbeat_ms": 100, "standby_timeout_ms": 800, "flush_ms": 2,
               "acks_partitions": 1},
    )
    stream, sub = config.streams[0].name, config.substreams[0].name
    name, cp = config.acker.name, config.acker.checkpoint_topic(None)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    with Application(config).publisher(stream, "a") as pub:
        with acker(config):
            pub.publish({"user": "u", "url": "/0", "ts": 0})
            pub.seal(sub, 0)
            wait_notifications(config, sub, 1)
        with acker(config, standby=True) as standby:  # nobody is active: it takes over
            Application(config).publisher(stream, "gone").abort()  # registered, never sealing
            producer.produce(config.acker.acks_topic, b"\x07 not an ack", headers=ack_headers())
            producer.flush(10)
            deadline = time.monotonic() + 30
            while standby.service.dead_letters < 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            evict = encode_ack(AckMessage("operator", 0, 0, Evict("gone", "drill")))
            producer.produce(config.acker.acks_topic, evict, headers=ack_headers(),
                             partition=acks_partition("operator", 1))
            producer.flush(10)
            while standby.service.evictions < 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    said = lines(caplog, "substreams.acker.service")
    assert has(said, f"acker '{name}' starting")
    assert has(said, f"acker '{name}' recovery: no checkpoint, empty state", "genesis")
    assert has(said, f"acker '{name}' started in", "from offsets {0: 0}")
    assert has(said, f"standby acker '{name}': following the heartbeats on '{cp}'")
    assert has(said, f"standby acker '{name}': no heartbeat for", "taking over")
    assert has(said, f"acker '{name}' recovery: checkpoint #", f"of '{cp}'", "1 sources",
               "chain heads:", "seq ")
    assert has(said, "evicting source 'gone' (evicted by hand: drill)")
    assert has(said, "source 'gone' evicted")
    assert has(said, f"acker '{name}' stopped after")
    letters = lines(caplog, "substreams.streams.deadletter")
    assert has(letters, "dead letter: malformed at", config.acker.acks_topic)


def test_stage_logs_start_from_committed_offsets_and_dead_letters(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = make_config(
        [{"name": "clicks", "partitions": 1}, {"name": "out", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        [{"name": "copy", "input": "clicks", "output": "out"}],
    )
    clicks, name = config.streams[0].name, config.stages[0].name

    def same(entry: Entry) -> Iterable[Mapping[str, Any]]:
        return [entry.payload]

    with Application(config).publisher(clicks, "a") as pub:
        pub.publish({"user": "u", "url": "/0", "ts": 0})
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    # the stream's single-object prefix before a body that does not decode; then bytes
    # without a prefix at all: dead-lettered as undecodable and foreign_bytes
    prefix = Codec(envelope_schema(CLICK_SCHEMA)).prefix

    def run_stage(idle_s: float) -> tuple[int, int]:
        with Stage(config, name, same) as stage:
            stage.run_until_idle(idle_s)
            return stage.processed, stage.dead_letters

    producer.produce(clicks, prefix + b"\x01garbage", partition=0)
    producer.flush(10)
    assert run_stage(1.0) == (1, 1)
    # resumes after what was committed (3: record, transaction marker, garbage)
    assert run_stage(0.5) == (0, 0)
    # a batch holding nothing but garbage commits its position too: not dead-lettered twice
    producer.produce(clicks, b"\x02garbage", partition=0)
    producer.flush(10)
    assert run_stage(1.0) == (0, 1)
    assert run_stage(0.5) == (0, 0)
    said = lines(caplog, "substreams.acker.stage")
    assert has(said, f"stage '{name}' started", f"input '{clicks}' from offsets {{0: 0}}")
    assert has(said, f"stage '{name}' started", f"input '{clicks}' from offsets {{0: 3}}")
    assert has(said, f"stage '{name}' started", f"input '{clicks}' from offsets {{0: 4}}")
    assert has(said, f"stage '{name}' stopped after 1 records in, 1 out, 1 dead letters")
    letters = lines(caplog, "substreams.streams.badrecords")
    assert has(letters, f"undecodable record at {clicks}[0]@2 (undecodable", "cannot decode")
    assert has(letters, f"undecodable record at {clicks}[0]@3 (foreign_bytes",
               "not a single-object encoded record")


class Count(EpochOperator):
    def on_epoch(self, epoch: Time, rows: list[Row]) -> Iterable[Row]:
        return [{"user": "n", "url": str(len(rows)), "ts": int(epoch)}]  # type: ignore[call-overload]


def test_spark_runner_logs_sink_recovery_batches_and_replays(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner's ``foreachBatch`` handler as Spark calls it (no Spark needed to drive it)."""
    caplog.set_level(logging.INFO)
    config = make_config(
        [{"name": "clicks", "partitions": 1}, {"name": "out", "partitions": 1}],
        [{"name": "o", "stream": "out", "kind": "epoch", "field": "ts"}],
    )
    out = config.streams[1].name
    handler = EpochBatchHandler(Count(), config, out, "spark.q", config.kafka.bootstrap)
    try:
        handler.handle(0, [EpochInfo(0, 5, 0, 0), EpochInfo(1, 6, 0, 0)])
    finally:
        handler.close()
    again = EpochBatchHandler(Count(), config, out, "spark.q", config.kafka.bootstrap)
    try:
        again.handle(0, [EpochInfo(0, 5, 0, 0), EpochInfo(1, 6, 0, 0)])  # Spark's replay
    finally:
        again.close()
    runner = lines(caplog, "substreams.spark.runner")
    assert runner.count("batch 0: 2 epochs (0 .. 1)") == 2
    sink = lines(caplog, "substreams.spark.sink")
    assert has(sink, "sink 'spark.q'", "last committed batch -1")
    assert has(sink, "sink 'spark.q'", "last committed batch 0")
    assert has(sink, "batch 0 is a replay (batch 0 was committed)")
