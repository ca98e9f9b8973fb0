"""The one tracker, without a broker: what each role hands its publisher for each commit.

A ``Tracker`` returns the acks messages as writes; these tests decode them with the
protocol's one decoder and check the rules the kill tests rest on: Register in the first
commit, the reports and seals with the records' commit, Unregister in the last, nothing
after an abort, and a pipeline's reports cancelling exactly when every record was done with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from substreams.acker.protocol import (
    SOURCE,
    STAGE,
    AckBody,
    AckEntry,
    AckReport,
    Register,
    SealEntry,
    Unregister,
    decode_ack,
    segment_partition,
)
from substreams.acker.tracker import Tracker
from substreams.config import Config
from substreams.config.loader import load_config_text
from substreams.errors import SubstreamsError
from substreams.streams.publisher import Write
from substreams.streams.records import SentRecord

ROOT = Path(__file__).resolve().parents[2]
CONFIG_TEXT = """\
streams:
  - {name: clicks, schema: avro/click.avsc, order_key: ts, partitions: 2}
  - {name: enriched, schema: avro/click.avsc, order_key: ts, partitions: 2}
substreams:
  - {name: w, stream: clicks, kind: tumbling, field: ts, size_ms: 10}
stages:
  - {name: enrich, input: clicks, output: enriched}
acker:
  acks_partitions: 3
"""


@pytest.fixture(scope="module")
def config() -> Config:
    return load_config_text(CONFIG_TEXT, ROOT / "substreams.yaml")


def bodies(writes: list[Write], config: Config) -> list[AckBody]:
    """The messages of one commit, checked to go where the protocol says."""
    out = []
    for w in writes:
        assert w.topic == config.acker.acks_topic
        msg = decode_ack(w.value, w.headers)
        assert msg.body is not None
        out.append(msg.body)
        subs = msg.substreams()
        assert all(segment_partition(s, config.acker.acks_partitions) == w.partition
                   for s in subs)
    return out


def record(stream: str, tracking_id: int, t: int, partition: int = 0) -> SentRecord:
    return SentRecord(stream, partition, t, tracking_id, {"w": t})


def source(config: Config) -> Tracker:
    return Tracker(config, "clicks", "web-1", "inc-1", ["w"], SOURCE, writer="tx-web-1")


def test_a_source_registers_first_reports_with_its_records_and_unregisters_last(
    config: Config,
) -> None:
    tracker = source(config)
    released: list[bool] = []
    tracker.on_release = lambda: released.append(True)
    assert tracker.wants_send and not tracker.wants_delivery  # a stage reads clicks
    assert bodies(tracker.before_commit(False), config) == [
        Register(("w",), SOURCE, "tx-web-1", True)
    ]
    tracker.sent([record("clicks", 5, 3), record("clicks", 6, 3)])
    assert tracker.seal("w", 0, False) == ()  # nothing to write now: it rides the report
    [report] = bodies(tracker.before_commit(False), config)
    assert isinstance(report, AckReport)
    assert report.entries == (AckEntry("w", 3, 5 ^ 6, 0, 2, ()),)
    assert [(s.substream, s.time) for s in report.seals] == [("w", 0)]
    assert not released
    tracker.ended("committed")
    assert bodies(tracker.before_commit(True), config) == [Unregister(("w",))]
    assert released == [True]  # the heartbeat stops before the Unregister is written


def test_an_abort_forgets_the_transaction_and_releases(config: Config) -> None:
    tracker = source(config)
    released: list[bool] = []
    tracker.on_release = lambda: released.append(True)
    tracker.before_commit(False)
    tracker.sent([record("clicks", 5, 3)])
    tracker.seal("w", 3, False)
    tracker.ended("aborted")
    assert released == [True]
    assert tracker.before_commit(False) == []  # no report, no seal: they never happened


def test_the_reports_of_a_pipeline_cancel_once_every_record_is_done_with(
    config: Config,
) -> None:
    """Source SND(x); the stage RCV(x) and writes y to the terminal stream, whose delivery
    is SND(y)+RCV(y): the XOR over both writers' reports of the time is 0, with y's offset."""
    src = source(config)
    stage = Tracker(config, "enriched", "stage.enrich", "inc-2", ["w"], STAGE,
                    inherited_times=True)
    assert not stage.wants_send and stage.wants_delivery  # enriched is terminal
    assert bodies(stage.before_commit(False), config) == [Register(("w",), STAGE, "", True)]
    src.before_commit(False)
    src.sent([record("clicks", 0x1234, 3)])
    [sent] = bodies(src.before_commit(False), config)
    y = record("enriched", 0x777, 3, partition=1)
    stage.sent([y])
    stage.delivered([y], [1], [41], {})
    stage.received([("w", 3, 0x1234)])
    [done] = bodies(stage.before_commit(False), config)
    assert isinstance(sent, AckReport) and isinstance(done, AckReport)
    entries = [*sent.all_entries(), *done.all_entries()]
    xor = 0
    for e in entries:
        xor ^= e.xor
    assert xor == 0
    assert sum(e.reports for e in entries) == 4  # SND(x), RCV(x), SND(y), RCV(y)
    assert sum(e.records for e in entries) == 1
    ranges = [(r.stream, r.partition, r.start, r.end) for e in entries for r in e.ranges]
    assert ranges == [("enriched", 1, 41, 42)]


def test_a_stage_never_seals(config: Config) -> None:
    stage = Tracker(config, "enriched", "stage.enrich", "inc", ["w"], STAGE)
    with pytest.raises(SubstreamsError, match="does not seal"):
        stage.seal("w", 3, False)


def test_a_stage_skips_an_output_without_the_inherited_time(config: Config) -> None:
    """A stage's output carries its input's times; one that lacks ``w`` is reported
    nowhere in ``w`` (no KeyError, no report at a made-up time)."""
    stage = Tracker(config, "enriched", "stage.enrich", "inc", ["w"], STAGE,
                    inherited_times=True)
    stage.before_commit(False)
    bare = SentRecord("enriched", 0, 1, 9, {})
    stage.delivered([bare, record("enriched", 8, 4)], [0, 0], [10, 11], {})
    [report] = bodies(stage.before_commit(False), config)
    assert isinstance(report, AckReport)
    assert [(e.time, e.records) for e in report.all_entries()] == [(4, 1)]


def test_a_keyed_seal_travels_as_one(config: Config) -> None:
    tracker = source(config)
    tracker.before_commit(False)
    tracker.seal("w", 10, True)
    tracker.seal("w", 12, True)
    [report] = bodies(tracker.before_commit(False), config)
    assert isinstance(report, AckReport)
    assert [(s.time, s.all_keys) for s in report.seals] == [(12, True)]
    assert all(isinstance(s, SealEntry) for s in report.seals)
