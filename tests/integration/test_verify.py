"""`substreams verify` on a real broker: a clean topic passes; a modified record, a dropped
record and undecodable bytes are each caught at the right offset with the right reason."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from substreams.cli.main import cli
from substreams.config import Config
from substreams.control.chain import ChainHead
from substreams.control.io import ControlWriter, now_ms, read_control
from substreams.control.messages import EpochComplete, WriterHeartbeat, record_to_wire
from substreams.control.progress import ProgressTracker
from substreams.control.subscriber import Data, Subscriber
from substreams.control.verify import (
    MODIFIED,
    PREV_MISMATCH,
    SEQ_DUPLICATE,
    SEQ_GAP,
    classify,
    verify_config,
)
from substreams.errors import ProtocolError
from substreams.kafka import client
from substreams.streams.schemas import protocol_codec
from tests.conftest import ConfigFactory

KINDS = ("clean", "tampered", "dropped", "garbage")


@pytest.fixture
def damaged(make_config: ConfigFactory) -> tuple[Config, dict[str, str], dict[str, int]]:
    """Four substreams with 6 good control records each; then one topic gets a modified
    record, one a record after a dropped one, one undecodable bytes (offsets returned)."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": k, "stream": "clicks", "kind": "epoch", "field": "ts"} for k in KINDS],
    )
    names = {k: s.name for k, s in zip(KINDS, config.substreams, strict=True)}
    topics = {k: config.acker.control_topic(n) for k, n in names.items()}
    writer = ControlWriter(config.kafka.bootstrap, config.acker.name, topics.values(), config)
    trackers = {k: ProgressTracker(names[k], snapshot_every=3) for k in KINDS}
    for t in range(4):
        batch = []
        for k in KINDS:
            trackers[k].activate(t + 1)
            batch += [(topics[k], b) for b in trackers[k].complete(t, (), 0, now_ms())]
        writer.write(batch)  # 4 EpochComplete + a snapshot after the 3rd: 5 records each
    writer.write([(topics[k], WriterHeartbeat(names[k])) for k in KINDS])  # 6 each

    codec = protocol_codec("control")
    plain: Producer = client.producer(config.kafka.bootstrap, config)
    bad_offsets: dict[str, int] = {}

    def append(kind: str, value: bytes) -> None:
        def remember(err: object, msg: object) -> None:
            bad_offsets[kind] = msg.offset()  # type: ignore[attr-defined]

        plain.produce(topics[kind], value=value, partition=0, headers=codec.headers(),
                      on_delivery=remember)
        plain.flush(10)

    # (a) the right seq and prev_digest, the original digest, a tampered body
    head = writer.heads[topics["tampered"]].copy()
    honest = head.append(writer.writer, EpochComplete(names["tampered"], 4, (), 0, 1), now_ms())
    forged = replace(honest, body=EpochComplete(names["tampered"], 4, (), 999, 1))
    append("tampered", codec.encode(record_to_wire(forged)))
    # (b) a record whose predecessor never reached the topic
    head = writer.heads[topics["dropped"]].copy()
    head.append(writer.writer, WriterHeartbeat(names["dropped"]), now_ms())  # lost
    after_gap = head.append(writer.writer, WriterHeartbeat(names["dropped"]), now_ms())
    append("dropped", codec.encode(record_to_wire(after_gap)))
    # (c) bytes that are no control record
    append("garbage", b"\xff\xff\xff\xff not avro")
    # the honest writer carries on after the damage in every topic
    writer.write([(topics[k], WriterHeartbeat(names[k])) for k in KINDS])
    writer.close()
    return config, names, bad_offsets


def test_verify_passes_a_clean_topic(damaged: tuple[Config, dict[str, str], dict[str, int]]
                                     ) -> None:
    config, names, _ = damaged
    result = CliRunner().invoke(cli, ["verify", "-c", str(config.path),
                                      "--substream", names["clean"]])
    assert result.exit_code == 0, result.output
    assert "1 of 1 control topics OK" in result.output
    assert "BROKEN" not in result.output
    (report,) = verify_config(config, [names["clean"]])
    assert report.ok and report.records == 7 and report.last_seq == {config.acker.name: 6}


def test_verify_reports_each_first_break_with_offset_and_reason(
    damaged: tuple[Config, dict[str, str], dict[str, int]],
) -> None:
    config, names, bad = damaged
    result = CliRunner().invoke(cli, ["verify", "-c", str(config.path)])
    assert result.exit_code == 1, result.output
    lines = {ln.split()[1]: ln for ln in result.output.splitlines() if ln.startswith("BROKEN ")}
    topic = config.acker.control_topic
    assert set(lines) == {topic(names[k]) for k in ("tampered", "dropped", "garbage")}
    tampered = lines[topic(names["tampered"])]
    assert f"offset {bad['tampered']} writer {config.acker.name}:" in tampered
    assert "digest mismatch (modified)" in tampered
    dropped = lines[topic(names["dropped"])]
    assert f"offset {bad['dropped']} writer {config.acker.name}:" in dropped
    assert "seq gap" in dropped and "seq 7 where 6 was expected" in dropped
    garbage = lines[topic(names["garbage"])]
    assert f"offset {bad['garbage']} writer ?:" in garbage and "undecodable record" in garbage
    assert "1 of 4 control topics OK" in result.output


def test_verify_help_and_unknown_substream(damaged: tuple[Config, dict[str, str], dict[str, int]]
                                          ) -> None:
    config, _, _ = damaged
    runner = CliRunner()
    assert "hash chain" in runner.invoke(cli, ["verify", "--help"]).output
    result = runner.invoke(cli, ["verify", "-c", str(config.path), "--substream", "nope"])
    assert result.exit_code == 2
    assert "no substream named 'nope'" in result.output


def test_subscriber_refuses_a_broken_chain(damaged: tuple[Config, dict[str, str], dict[str, int]]
                                          ) -> None:
    config, names, bad = damaged
    for kind in ("tampered", "dropped", "garbage"):
        with (
            Subscriber(config, [names[kind]], start="beginning", mode="firm") as sub,
            pytest.raises(ProtocolError) as err,
        ):
            for _ in range(20):
                sub.poll(0.3)
        topic = config.acker.control_topic(names[kind])
        assert f"control topic '{topic}' offset {bad[kind]}" in str(err.value)
    # the clean topic reads to its end without complaint
    clean = config.acker.control_topic(names["clean"])
    assert len(read_control(config.kafka.bootstrap, clean, config)) == 7


def test_classify_names_every_kind_of_break() -> None:
    head = ChainHead()
    recs = [head.append("w", WriterHeartbeat(f"s{i}"), 1) for i in range(3)]
    assert classify(ChainHead(), recs[0]) is None
    after_first = ChainHead(1, recs[0].digest)
    assert classify(after_first, recs[1]) is None
    assert classify(after_first, recs[2]) == SEQ_GAP
    assert classify(ChainHead(2, recs[1].digest), recs[1]) == SEQ_DUPLICATE
    assert classify(after_first, replace(recs[1], prev_digest=bytes(32))) == PREV_MISMATCH
    assert classify(after_first, replace(recs[1], written_at_ms=2)) == MODIFIED


def test_operator_resume_lets_readers_continue_past_a_lost_record(
    make_config: ConfigFactory,
) -> None:
    """A record of the writer's chain is lost: readers stop at the next one and name its
    offset; `substreams control resume` records the operator's decision on the topic, and
    readers (and `verify`) then continue past that break -- and only that one."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "s", "stream": "clicks", "kind": "epoch", "field": "ts"}],
    )
    name = config.substreams[0].name
    topic = config.acker.control_topic(name)
    writer = ControlWriter(config.kafka.bootstrap, config.acker.name, [topic], config)
    tracker = ProgressTracker(name, snapshot_every=100)
    for t in range(5):
        tracker.activate(t)
    writer.write([(topic, b) for b in tracker.complete(0, (), 0, now_ms())])
    writer.write([(topic, b) for b in tracker.complete(1, (), 0, now_ms())])
    writer.heads[topic].append(writer.writer, WriterHeartbeat(name), now_ms())  # lost
    writer.write([(topic, b) for b in tracker.complete(2, (), 0, now_ms())])
    writer.write([(topic, b) for b in tracker.complete(3, (), 0, now_ms())])
    writer.close()
    [(gap, _)] = [(o, r) for o, r in read_control(config.kafka.bootstrap, topic, config)
                  if isinstance(r.body, EpochComplete) and r.body.time == 2]

    def read_all() -> list[int]:
        seen = []
        with Subscriber(config, [name], start="beginning", mode="firm") as sub:
            for _ in range(15):
                seen += [e.time for e in sub.poll(0.2) if isinstance(e, Data)]
        return seen

    with pytest.raises(ProtocolError) as err:
        read_all()
    assert f"control topic '{topic}' offset {gap}" in str(err.value)
    assert "substreams control resume" in str(err.value)

    runner = CliRunner()
    assert "ChainResume" in runner.invoke(cli, ["control", "resume", "--help"]).output
    refused = runner.invoke(cli, ["control", "resume", "-c", str(config.path), "--substream",
                                  name, "--offset", "0", "--reason", "no break there"])
    assert refused.exit_code == 2 and "no broken hash chain at offset 0" in refused.output
    assert f"unaccepted breaks at: {gap}" in refused.output
    result = runner.invoke(cli, ["control", "resume", "-c", str(config.path), "--substream", name,
                                 "--offset", str(gap), "--reason", "heartbeat lost in a test",
                                 "--operator", "ops"])
    assert result.exit_code == 0, result.output
    assert f"offset {gap}" in result.output and "accepted by 'ops'" in result.output

    assert read_all() == [0, 1, 2, 3]  # past the break, in order, nothing lost after it
    (report,) = verify_config(config, [name])
    assert report.ok, report.breaks
    [(brk, decision)] = report.resumed
    assert brk.offset == gap and brk.kind == SEQ_GAP
    assert (decision.operator, decision.reason) == ("ops", "heartbeat lost in a test")
    again = runner.invoke(cli, ["control", "resume", "-c", str(config.path), "--substream", name,
                                "--offset", str(gap), "--reason", "twice"])
    assert again.exit_code == 2 and "already resumed" in again.output
    shown = runner.invoke(cli, ["verify", "-c", str(config.path), "--substream", name])
    assert shown.exit_code == 0, shown.output
    line = f"RESUMED {topic} offset {gap} writer {config.acker.name}: seq gap: accepted by 'ops'"
    assert line in shown.output
