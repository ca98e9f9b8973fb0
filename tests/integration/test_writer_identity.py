"""Readers refuse what the acker did not write: a forged ``EpochComplete`` and a forged
snapshot, written to a control topic by another writer (ACLs off: anyone may write), are
refused -- logged, counted, never obeyed -- by every reader: ``notifications()`` (the
subscriber), the Spark source's control scanner, the dashboard and a dead-letter replay's
check of which times are closed."""

from __future__ import annotations

import logging

import pytest

from substreams import metrics
from substreams.app import Application
from substreams.config import Config
from substreams.control.io import ControlWriter
from substreams.control.messages import EpochComplete, FrontierSnapshot
from substreams.dead_letters import closed_times
from substreams.frontier import Antichain, UpperAntichain
from substreams.kafka.clock import Deadline
from substreams.spark.offsets import ControlScanner
from substreams.ui.model import DashboardModel
from tests.conftest import ConfigFactory


def forged_topic(make_config: ConfigFactory) -> tuple[Config, str, str]:
    """A control topic holding: the acker's EpochComplete 1, mallory's EpochComplete 5 and
    a snapshot saying everything below 100 is complete, the acker's EpochComplete 3."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "views", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker={"trusted_writers": []},  # the acker only
    )
    sub = config.substreams[0].name
    topic = config.acker.control_topic(sub)
    acker = ControlWriter(config.kafka.bootstrap, config.acker.name, [topic], config)
    mallory = ControlWriter(config.kafka.bootstrap, "mallory", [topic], config,
                            transactional_id="mallory")
    acker.write([(topic, EpochComplete(sub, 1, (), 0, 0))])
    mallory.write([(topic, EpochComplete(sub, 5, (), 0, 0))])
    mallory.write([(topic, FrontierSnapshot(sub, Antichain([100]), UpperAntichain([100])))])
    acker.write([(topic, EpochComplete(sub, 3, (), 0, 0))])
    acker.close()
    mallory.close()
    return config, sub, topic


def foreign(reader: str, topic: str) -> float:
    return metrics.counter_value(
        metrics.CONTROL_BAD_RECORDS, reader=reader, topic=topic, kind="foreign_writer")


def test_every_reader_refuses_a_forged_notification(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    config, sub, topic = forged_topic(make_config)
    caplog.set_level(logging.WARNING, logger="substreams.control.follower")

    # notifications(): from the latest snapshot -- the forged one is no starting point
    with Application(config).notifications(sub, idle_timeout=2) as notes:
        assert [n.time for n in notes] == [1, 3]
    refusals = [r.getMessage() for r in caplog.records if "mallory" in r.getMessage()]
    # (the offset depends on the writers' transaction markers: named, not fixed here)
    assert any(f"control topic '{topic}' offset " in m and "EpochComplete" in m
               and f"only {config.acker.name}" in m for m in refusals), refusals

    assert foreign("subscriber: control", topic) == 2  # the notification and the snapshot

    # the Spark source's driver-side scanner
    scanner = ControlScanner(config.kafka.bootstrap, topic, sub, config)
    try:
        end = scanner.latest(0)
        assert [n.time for n in scanner.between(0, end)] == [1, 3]
    finally:
        scanner.close()
    assert foreign(f"control topic '{topic}'", topic) == 2

    # the dashboard: shows the acker's two, counts the refusals
    model = DashboardModel(config)
    model.start()
    try:
        deadline = Deadline(30)
        times: list[str] = []
        while len(times) < 2 and not deadline.passed:
            found = model.wait(model.version, 1.0)
            snap = model.snapshot() if found is None else found[1]
            [card] = [s for s in snap["substreams"] if s["name"] == sub]
            times = [n["time"] for n in card["notifications"]]
        assert times == ["3", "1"]
        assert model.snapshot()["refused_records"] >= 1
    finally:
        model.close()
    assert foreign("dashboard", topic) >= 1

    # a dead-letter replay: a forged notification closes no time
    closed = closed_times(config, [sub])
    assert closed(sub, 3) and not closed(sub, 4)
