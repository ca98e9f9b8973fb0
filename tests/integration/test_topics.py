"""`substreams topics create` and `ensure_topics` on a real broker: each kind of topic gets the
replication factor, min.insync.replicas and retention the config asks for (read back with
describe_configs), and an existing topic that differs is reported, never changed."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from substreams.cli.main import cli
from substreams.config import Config, load_config
from substreams.errors import BrokerError
from substreams.kafka import client
from substreams.kafka.topics import ensure_topics, show
from tests.conftest import CLICK_SCHEMA

DAY_MS = 24 * 3_600_000
SETTINGS = ("cleanup.policy", "retention.ms", "retention.bytes", "min.insync.replicas")


def write_config(tmp_path: Path, bootstrap: str, suffix: str, **sections: Any) -> Config:
    """A config whose topics are all named with ``suffix``; ``sections`` are merged into
    ``kafka`` / ``acker`` or replace ``streams``' extra keys (``stream={...}``)."""
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
    doc: dict[str, Any] = {
        "kafka": {"bootstrap": bootstrap, **sections.get("kafka", {})},
        "streams": [
            {
                "name": f"clicks-{suffix}",
                "schema": "click.avsc",
                "order_key": "ts",
                "partitions": 2,
                **sections.get("stream", {}),
            }
        ],
        "substreams": [
            {
                "name": f"w-{suffix}",
                "stream": f"clicks-{suffix}",
                "kind": "tumbling",
                "size_ms": 1000,
            }
        ],
        "acker": {
            "name": f"acker-{suffix}",
            "acks_topic": f"_acks-{suffix}",
            "control_topic_prefix": f"_control-{suffix}.",
            "command_topic": f"_commands-{suffix}",
            "response_topic": f"_responses-{suffix}",
            "dead_letter_topic": f"_dlq-{suffix}",
            **sections.get("acker", {}),
        },
    }
    path = tmp_path / f"substreams-{suffix}-{uuid.uuid4().hex[:4]}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_config(path)


def describe(admin: AdminClient, topic: str) -> dict[str, str]:
    """The topic's settings (retried for a moment: a broker learns of a topic it did not
    create through the metadata log, a little after CreateTopics returned)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + 15
    while True:
        try:
            entries = admin.describe_configs([resource])[resource].result(30)
            return {k: e.value for k, e in entries.items()}
        except KafkaException as exc:
            err = exc.args[0]
            unknown = err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def replication(admin: AdminClient, topic: str) -> int:
    meta = admin.list_topics(topic=topic, timeout=10).topics[topic]
    return min(len(p.replicas) for p in meta.partitions.values())


def create(config: Config) -> str:
    result = CliRunner().invoke(cli, ["topics", "create", "-c", str(config.path)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def suffix() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def admin(bootstrap: str) -> AdminClient:
    return client.admin(bootstrap)


def test_topics_create_gives_each_kind_its_settings(
    tmp_path: Path, bootstrap: str, suffix: str, admin: AdminClient
) -> None:
    config = write_config(tmp_path, bootstrap, suffix, stream={"retention_ms": 3_600_000})
    out = create(config)
    assert f"{len(config.topics())} created, 0 already existed on {bootstrap}" in out
    assert "differs" not in out
    brokers = len(admin.list_topics(timeout=10).brokers)
    rf = min(3, brokers)
    isr = "2" if rf >= 3 else "1"
    week, forever = str(7 * DAY_MS), "-1"
    wanted = {
        f"clicks-{suffix}": ("delete", "3600000", forever),
        f"_control-{suffix}.w-{suffix}": ("delete", forever, forever),
        f"_control-{suffix}.__acker.acker-{suffix}": ("delete", forever, str(64 << 20)),
        f"_acks-{suffix}": ("delete", week, forever),
        f"_commands-{suffix}": ("delete", forever, forever),
        f"_responses-{suffix}": ("delete", str(DAY_MS), forever),
        f"_dlq-{suffix}": ("delete", str(30 * DAY_MS), forever),
    }
    assert set(wanted) == {t.name for t in config.topics()}
    for topic, (cleanup, retention_ms, retention_bytes) in wanted.items():
        got = describe(admin, topic)
        assert tuple(got[k] for k in SETTINGS) == (cleanup, retention_ms, retention_bytes, isr)
        assert replication(admin, topic) == rf, topic
        assert f"created  {topic}" in out
    checkpoint = describe(admin, f"_control-{suffix}.__acker.acker-{suffix}")
    assert checkpoint["segment.bytes"] == str(16 << 20)
    assert len(admin.list_topics(timeout=10).topics[f"clicks-{suffix}"].partitions) == 2
    lines = out.splitlines()
    assert any(f"clicks-{suffix}" in ln and "data, deleted after 1 h" in ln for ln in lines)
    assert any(f"_commands-{suffix}" in ln and "command, kept forever" in ln for ln in lines)
    assert f"RF {rf} (auto), min.insync.replicas {isr}" in out
    again = create(config)
    assert f"0 created, {len(wanted)} already existed on {bootstrap}" in again
    assert "differs" not in again


def test_existing_topics_that_differ_are_reported_and_left_alone(
    tmp_path: Path, bootstrap: str, suffix: str, admin: AdminClient
) -> None:
    first = write_config(tmp_path, bootstrap, suffix)
    # The dead-letter topic was made by hand, compacted: `topics create` finds it existing.
    dlq = f"_dlq-{suffix}"
    auto = min(3, len(admin.list_topics(timeout=10).brokers))
    settings = {"cleanup.policy": "compact", "min.insync.replicas": "2" if auto >= 3 else "1"}
    admin.create_topics([NewTopic(dlq, 1, auto, config=settings)])[dlq].result(30)
    out = create(first)
    assert f"{len(first.topics()) - 1} created, 1 already existed on {bootstrap}" in out
    assert f"differs  {dlq}: cleanup.policy is compact, the config wants delete" in out
    rf = replication(admin, f"clicks-{suffix}")
    isr = describe(admin, f"clicks-{suffix}")["min.insync.replicas"]

    second = write_config(
        tmp_path,
        bootstrap,
        suffix,
        kafka={"replication_factor": rf + 1, "min_insync_replicas": 2, "data_retention_ms": -1},
        acker={"acks_retention_ms": DAY_MS, "checkpoint_retention_bytes": 32 << 20},
    )
    out = create(second)
    lines = [ln for ln in out.splitlines() if ln.startswith("differs  ")]
    clicks, acks = f"clicks-{suffix}", f"_acks-{suffix}"
    checkpoint = f"_control-{suffix}.__acker.acker-{suffix}"
    expected = {
        f"differs  {clicks}: retention.ms is {7 * DAY_MS} (7 d), the config wants -1 (forever)",
        f"differs  {acks}: retention.ms is {7 * DAY_MS} (7 d), the config wants {DAY_MS} (1 d)",
        f"differs  {checkpoint}: retention.bytes is {64 << 20} (64 MiB), the config wants"
        f" {32 << 20} (32 MiB)",
        f"differs  {checkpoint}: segment.bytes is {16 << 20} (16 MiB), the config wants"
        f" {8 << 20} (8 MiB)",
        f"differs  {dlq}: cleanup.policy is compact, the config wants delete",
    }
    broker_default = describe(admin, dlq)["retention.ms"]  # made by hand: not the config's
    if broker_default != str(30 * DAY_MS):
        expected.add(
            f"differs  {dlq}: retention.ms is {show('retention.ms', broker_default)},"
            f" the config wants {30 * DAY_MS} (30 d)"
        )
    for topic in (t.name for t in second.topics()):
        expected.add(f"differs  {topic}: replication factor is {rf}, the config wants {rf + 1}")
        if isr != "2":
            expected.add(f"differs  {topic}: min.insync.replicas is {isr}, the config wants 2")
    assert set(lines) == expected
    assert len(lines) == len(expected)
    assert f"{len(expected)} settings differ from the config, left unchanged" in out
    assert f"0 created, {len(second.topics())} already existed on {bootstrap}" in out
    # Nothing was changed.
    assert describe(admin, clicks)["retention.ms"] == str(7 * DAY_MS)
    assert describe(admin, acks)["retention.ms"] == str(7 * DAY_MS)
    assert describe(admin, dlq)["cleanup.policy"] == "compact"
    assert describe(admin, clicks)["min.insync.replicas"] == isr
    assert replication(admin, clicks) == rf


def test_ensure_topics_from_code(
    tmp_path: Path,
    bootstrap: str,
    suffix: str,
    admin: AdminClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What components do at start-up: specs get their settings and differences are logged;
    a plain (name, partitions) pair, whose use is unknown, is kept forever and not judged."""
    config = write_config(tmp_path, bootstrap, suffix)
    plain = f"plain-{suffix}"
    report = ensure_topics(admin, [*config.topics(), (plain, 3)])
    assert sorted(report.created) == sorted([*(t.name for t in config.topics()), plain])
    got = describe(admin, plain)
    assert (got["cleanup.policy"], got["retention.ms"], got["retention.bytes"]) == (
        "delete",
        "-1",
        "-1",
    )
    assert report.wanted[plain].kind == "other"
    assert report.brokers >= 1

    shorter = write_config(tmp_path, bootstrap, suffix, acker={"response_retention_ms": 60_000})
    with caplog.at_level(logging.WARNING, logger="substreams.kafka.topics"):
        report = ensure_topics(admin, [*shorter.topics(), (plain, 1)])
    assert report.created == []
    responses = f"_responses-{suffix}"
    assert [(d.topic, d.setting, d.actual, d.wanted) for d in report.differences] == [
        (responses, "retention.ms", str(DAY_MS), "60000")
    ]
    assert f"{responses}: retention.ms is {DAY_MS} (1 d), the config wants 60000 (1 min)" in (
        caplog.text
    )

    with pytest.raises(BrokerError, match=f"topic '{plain}' exists with 3 partitions"):
        ensure_topics(admin, [(plain, 4)])
    with pytest.raises(BrokerError, match=r"kafka\.min_insync_replicas is 4 but topic"):
        ensure_topics(admin, [(f"never-{suffix}", 1)], 3, min_insync_replicas=4)
