"""Who may write which control topic (:class:`~substreams.control.writers.WriterCheck`)."""

from __future__ import annotations

from pathlib import Path

from substreams.config import AckerConfig, Config, KafkaConfig, StreamConfig, SubstreamConfig
from substreams.control.messages import ChainResume, ControlRecord, EpochComplete
from substreams.control.writers import WriterCheck


def config(**acker: object) -> Config:
    stream = StreamConfig("clicks", Path("c.avsc"), {}, 1, "ts")
    subs = (SubstreamConfig("w", "clicks", "tumbling", size_ms=10),
            SubstreamConfig("p", "clicks", "epoch", field="ts", mechanism="punctuations"))
    return Config(Path("s.yaml"), KafkaConfig(), (stream,), subs,
                  acker=AckerConfig(name="ack", **acker))  # type: ignore[arg-type]


def rec(writer: str, body: object = None) -> ControlRecord:
    return ControlRecord(writer, 0, bytes(32), b"", 0,
                         body or EpochComplete("w", 1, (), 0, 0))  # type: ignore[arg-type]


def test_each_topic_trusts_its_own_writers_only() -> None:
    cfg = config()
    check = WriterCheck.of(cfg)
    a = cfg.acker
    w, p = a.control_topic("w"), a.control_topic("p")
    assert check.admits(w, rec("ack"))
    assert check.admits(w, rec("ack.shard1of2"))
    assert not check.admits(w, rec("ack-evil"))
    assert not check.admits(w, rec("aligner.w"))
    assert not check.admits(w, rec("direct.clicks.src"))
    assert check.admits(p, rec("aligner.p")) and not check.admits(p, rec("ack"))
    assert check.admits(a.aligner_checkpoint_topic("p"), rec("aligner.p"))
    assert check.admits(a.checkpoint_topic("ack.shard0of2"), rec("ack.shard0of2"))
    assert not check.admits(a.checkpoint_topic("ack"), rec("mallory"))
    assert check.admits("someone-elses-topic", rec("anyone"))
    resume = ChainResume("ack", 4, 4, b"", "ops", "checked")
    assert check.admits(w, rec("operator.ops", resume))
    assert not check.admits(w, rec("operator.ops"))  # a notification is not a decision
    assert "ack.shard*" in check.trusted(w)


def test_trusted_writers_and_also_add_patterns() -> None:
    check = WriterCheck.of(config(trusted_writers=("direct.*",)), also=("other",))
    topic = config().acker.control_topic("w")
    assert check.admits(topic, rec("direct.clicks.src"))
    assert check.admits(topic, rec("other"))
    assert not check.admits(topic, rec("mallory"))
