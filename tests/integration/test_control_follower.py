"""The control follower's rule for a record it cannot use, on a real control topic: under
``raise`` the first one stops the reader naming its offset; under ``log`` it is logged,
counted and passed over, the records after it are read, and the hash chain still catches
the gap an undecodable record of the writer leaves."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer

from substreams import metrics
from substreams.config import Config
from substreams.control.follower import LOG, RAISE, ControlFollower, Followed
from substreams.control.io import ControlWriter, now_ms
from substreams.control.messages import WriterHeartbeat
from substreams.errors import ProtocolError
from substreams.kafka import client
from substreams.kafka.clock import Deadline
from substreams.streams.schemas import HEADER_FINGERPRINT, protocol_codec
from tests.conftest import ConfigFactory

Damaged = tuple[Config, str, int, int, int]


@pytest.fixture
def damaged(make_config: ConfigFactory) -> Damaged:
    """A control topic: 3 good records, foreign garbage bytes, 1 good record, the writer's
    next record with a wrong schema fingerprint (undecodable: its chain has a gap), 2 good
    records.  Returns the config, topic, both bad offsets and the topic's end."""
    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "views", "stream": "clicks", "kind": "epoch", "field": "ts"}],
    )
    sub = config.substreams[0].name
    topic = config.acker.control_topic(sub)
    writer = ControlWriter(config.kafka.bootstrap, config.acker.name, [topic], config)
    plain: Producer = client.producer(config.kafka.bootstrap, config)
    codec = protocol_codec("control")
    offsets: list[int] = []

    def append(value: bytes, headers: list[tuple[str, bytes]]) -> None:
        plain.produce(topic, value=value, partition=0, headers=headers,
                      on_delivery=lambda err, msg: offsets.append(msg.offset()))
        plain.flush(10)

    for _ in range(3):
        writer.write([(topic, WriterHeartbeat(sub))])
    append(b"\xff\xff\xff\xff not avro", codec.headers())
    writer.write([(topic, WriterHeartbeat(sub))])
    _, value = writer.heads[topic].append_encoded(writer.writer, WriterHeartbeat(sub), now_ms())
    append(value, [(HEADER_FINGERPRINT, b"00" * 8)])
    for _ in range(2):
        writer.write([(topic, WriterHeartbeat(sub))])
    writer.close()
    follower = ControlFollower(config.kafka.bootstrap, config, name="probe", on_bad=LOG,
                               verify=False)
    end = follower.reader.watermarks(topic)[1]
    follower.close()
    garbage, wrong_fp = offsets
    return config, topic, garbage, wrong_fp, end


def _read(follower: ControlFollower, topic: str, end: int) -> list[Followed]:
    out: list[Followed] = []
    deadline = Deadline(30)
    while follower.positions.get(topic, 0) < end - 1 and not deadline.passed:
        out += follower.poll(0.2)
    return out


def test_raise_names_the_partition_and_offset_of_the_first_bad_record(damaged: Damaged) -> None:
    config, topic, garbage, _, end = damaged
    with ControlFollower(config.kafka.bootstrap, config, name="t", on_bad=RAISE) as follower:
        follower.assign({topic: 0}, strict=[topic])
        with pytest.raises(ProtocolError) as err:
            _read(follower, topic, end)
    assert f"control topic '{topic}' offset {garbage} (partition 0): undecodable" in str(err.value)


def test_log_passes_over_logs_and_counts_and_the_chain_still_sees_the_gap(
    damaged: Damaged, caplog: pytest.LogCaptureFixture
) -> None:
    config, topic, garbage, wrong_fp, end = damaged
    caplog.set_level(logging.WARNING, logger="substreams.control.follower")
    with ControlFollower(config.kafka.bootstrap, config, name="t", on_bad=LOG) as follower:
        follower.assign({topic: 0}, strict=[topic])
        got = _read(follower, topic, end)
    seqs = [f.record.seq for f in got]
    # the garbage is no record of the chain; the wrong-fingerprint one (seq 4) is lost, so
    # the next (seq 5) breaks the chain and is passed over too; the one after is read again
    assert seqs == [0, 1, 2, 3, 6]
    read_offsets = [f.offset for f in got]
    assert garbage not in read_offsets and wrong_fp not in read_offsets
    assert follower.bad == 3
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"offset {garbage} (partition 0): undecodable record passed over" in m
               for m in warned)
    assert any(f"offset {wrong_fp} (partition 0): undecodable record passed over" in m
               for m in warned)
    assert any("broken hash chain" in m and "seq 5 where 4 was expected" in m for m in warned)
    assert metrics.counter_value(
        metrics.CONTROL_BAD_RECORDS, reader="t", topic=topic, kind="undecodable") == 2
    assert metrics.counter_value(
        metrics.CONTROL_BAD_RECORDS, reader="t", topic=topic, kind="broken_chain") == 1


def test_the_rule_is_explicit(damaged: Damaged) -> None:
    config, *_ = damaged
    with pytest.raises(ValueError, match="on_bad"):
        ControlFollower(config.kafka.bootstrap, config, name="t", on_bad="skip")  # type: ignore[arg-type]


def test_the_dashboard_logs_a_garbage_record_and_keeps_showing_the_rest(
    make_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the follower the dashboard passed an undecodable record over without a word."""
    from substreams.control.messages import EpochComplete
    from substreams.ui.model import DashboardModel

    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "views", "stream": "clicks", "kind": "epoch", "field": "ts"}],
    )
    sub = config.substreams[0].name
    topic = config.acker.control_topic(sub)
    writer = ControlWriter(config.kafka.bootstrap, config.acker.name, [topic], config)
    writer.write([(topic, EpochComplete(sub, 1, (), 0, 0))])
    plain: Producer = client.producer(config.kafka.bootstrap, config)
    at: list[int] = []
    plain.produce(topic, value=b"\x00garbage", partition=0,
                  headers=protocol_codec("control").headers(),
                  on_delivery=lambda err, msg: at.append(msg.offset()))
    plain.flush(10)
    writer.write([(topic, EpochComplete(sub, 2, (), 0, 0))])
    writer.close()
    caplog.set_level(logging.WARNING, logger="substreams.control.follower")
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
    finally:
        model.close()
    assert times == ["2", "1"] and model.error is None
    where = f"control topic '{topic}' offset {at[0]} (partition 0): undecodable"
    assert any(where in r.getMessage() for r in caplog.records)
    assert metrics.counter_value(
        metrics.CONTROL_BAD_RECORDS, reader="dashboard", topic=topic, kind="undecodable") == 1
