"""The generated ACLs keep the roles apart (the broker's enforcement of them:
tests/spark/test_secured.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from substreams.config import AckerConfig, Config, KafkaConfig, StreamConfig, SubstreamConfig
from substreams.errors import ConfigError, SubstreamsError
from substreams.kafka.acls import (
    ROLES,
    Acl,
    check_principal,
    commit_topic,
    role_acls,
    schema_topic,
)
from substreams.streams import evolution


def config() -> Config:
    streams = (StreamConfig("clicks", Path("c.avsc"), {}, 1, "ts"),
               StreamConfig("counts", Path("c.avsc"), {}, 1, "ts"))
    subs = (SubstreamConfig("w", "clicks", "tumbling", size_ms=10),)
    return Config(Path("s.yaml"), KafkaConfig(), streams, subs, acker=AckerConfig(name="ack"))


def writes(acls: list[Acl]) -> set[tuple[str, str]]:
    return {(a.name, a.pattern) for a in acls if a.kind == "TOPIC" and a.operation == "WRITE"}


def test_only_the_acker_writes_control_and_checkpoint_topics() -> None:
    cfg = config()
    control = cfg.acker.control_topic("w")
    for role in ROLES:
        written = {name for name, _ in writes(role_acls(cfg, role))}
        touches_control = any(
            n == control or (n.startswith(cfg.acker.control_topic_prefix)
                             and n != schema_topic(cfg)) for n in written)
        assert touches_control == (role == "acker"), (role, written)
    acker = role_acls(cfg, "acker")
    assert Acl("TRANSACTIONAL_ID", "PREFIXED", "substreams.acker.ack", "WRITE") in acker
    assert (cfg.acker.checkpoint_topic("ack"), "PREFIXED") in writes(acker)


def test_a_reader_writes_nothing_and_a_publisher_only_its_streams() -> None:
    cfg = config()
    assert not [a for a in role_acls(cfg, "reader")
                if a.operation == "WRITE" or a.kind == "TRANSACTIONAL_ID"]
    pub = role_acls(cfg, "publisher", ["clicks"])
    assert {n for n, _ in writes(pub)} == {
        "clicks", cfg.acker.acks_topic, cfg.acker.dead_letter_topic, schema_topic(cfg)}
    assert {a.name for a in pub if a.kind == "TRANSACTIONAL_ID"} == {"substreams.pub.clicks."}
    assert len(pub) == len(set(pub)) and pub == sorted(pub)


def test_names_are_the_codes() -> None:
    cfg = config()
    assert schema_topic(cfg) == evolution.schema_topic(cfg)
    from substreams.spark.executor import commit_topic as sink_topic

    assert commit_topic("counts") == sink_topic("counts")
    from substreams.acker.service import transactional_id as acker_txn
    from substreams.streams.publisher import transactional_id as pub_txn

    assert acker_txn(cfg.acker.shard_name(1, 2)).startswith("substreams.acker.ack")
    assert pub_txn("clicks", "src").startswith("substreams.pub.clicks.")
    assert Acl("TOPIC", "PREFIXED", "x", "READ").line("User:u") == (
        "ALLOW User:u READ TOPIC x (prefixed)")


def test_bad_input_is_named() -> None:
    with pytest.raises(ConfigError, match="no stream named 'nope'"):
        role_acls(config(), "publisher", ["nope"])
    with pytest.raises(SubstreamsError, match="unknown role"):
        role_acls(config(), "admin")
    with pytest.raises(SubstreamsError, match="User:<name>"):
        check_principal("pub")
