"""The rules of :class:`~substreams.streams.badrecords.BadRecords` without a broker: which
reason each decoder error gets, one letter per position, a run logged once, ``fail``
naming topic/partition/offset, and the count of bad records inside a note's ranges."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.config import Config, StreamConfig
from substreams.config.model import AckerConfig, KafkaConfig
from substreams.errors import BadRecordError, SchemaMismatchError
from substreams.streams.badrecords import BadRecords
from substreams.streams.deadletter import DeadLetter, DeadLetterWriter
from substreams.streams.listener import StreamDecoder
from substreams.streams.schemas import SINGLE_OBJECT_MARKER
from tests.conftest import CLICK_SCHEMA


class Collecting(DeadLetterWriter):
    """Keeps the letters instead of producing them."""

    def __init__(self, config: Config) -> None:
        super().__init__(config, "test")
        self.letters: list[DeadLetter] = []

    def write(self, letter: DeadLetter, key: bytes | None = None, on_delivery: Any = None,
              *, quiet: bool = False) -> DeadLetter:
        self.letters.append(letter)
        return letter


def config(rule: str = "dead_letter") -> Config:
    stream = StreamConfig(name="clicks", schema_path=Path("click.avsc"), schema=CLICK_SCHEMA,
                          partitions=2, order_key="ts", on_bad_record=rule)  # type: ignore[arg-type]
    return Config(path=Path("substreams.yaml"), kafka=KafkaConfig(bootstrap="127.0.0.1:1"),
                  streams=(stream,), substreams=(), stages=(), acker=AckerConfig())


def decode_error(value: bytes) -> SchemaMismatchError:
    decoder = StreamDecoder(config(), "clicks")
    decoder.codec._writers = None  # no schema topic to ask: an unknown fingerprint stays one
    with pytest.raises(SchemaMismatchError) as err:
        decoder.codec.decode_single(value)
    return err.value


def test_each_kind_of_bad_bytes_gets_its_reason() -> None:
    own = StreamDecoder(config(), "clicks").codec.prefix
    cases = {
        b'{"order_id": 1}': "foreign_bytes",
        b"": "foreign_bytes",
        SINGLE_OBJECT_MARKER + b"\x01" * 8 + b"\x02": "unknown_schema",
        own + b"\x02": "undecodable",  # the stream's own fingerprint, a body cut short
    }
    cfg = config()
    for value, reason in cases.items():
        bad = BadRecords(cfg, "r", writer=Collecting(cfg))
        bad.bad("clicks", 0, 7, value, decode_error(value))
        [letter] = bad.writer.letters  # type: ignore[attr-defined]
        assert (letter.reason, letter.topic, letter.partition, letter.offset, letter.raw) == (
            reason, "clicks", 0, 7, value)


def test_a_position_is_dead_lettered_once_and_a_run_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="substreams.streams.badrecords")
    cfg = config()
    bad = BadRecords(cfg, "r", writer=Collecting(cfg))
    exc = decode_error(b"{}")
    for offset in (3, 4, 5, 4):  # one run; 4 read again
        bad.bad("clicks", 1, offset, b"{}", exc)
    bad.good()
    bad.bad("clicks", 1, 9, b"{}", exc)  # a second run
    bad.close()
    assert [x.offset for x in bad.writer.letters] == [3, 4, 5, 9]  # type: ignore[attr-defined]
    assert bad.dead_lettered == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "clicks[1]@3 (foreign_bytes" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["r: run of 3 undecodable records dead-lettered (foreign_bytes: 3), "
                     "clicks[1]@3 .. clicks[1]@5"]


def test_fail_names_topic_partition_offset_and_reason_and_writes_nothing() -> None:
    cfg = config("fail")
    bad = BadRecords(cfg, "r", writer=Collecting(cfg))
    with pytest.raises(BadRecordError) as err:
        bad.bad("clicks", 1, 2016, b"{}", decode_error(b"{}"))
    assert str(err.value).startswith("undecodable record at clicks[1]@2016 (foreign_bytes): ")
    assert (err.value.topic, err.value.partition, err.value.offset, err.value.reason) == (
        "clicks", 1, 2016, "foreign_bytes")
    assert bad.writer.letters == []  # type: ignore[attr-defined]
    import pickle

    again = pickle.loads(pickle.dumps(err.value))  # crosses from a Spark worker intact
    assert str(again) == str(err.value)


@given(bad_offsets=st.sets(st.integers(0, 50), max_size=20),
       ranges=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 50), st.integers(0, 20)),
                       max_size=4))
def test_within_counts_the_bad_records_inside_ranges(
    bad_offsets: set[int], ranges: list[tuple[int, int, int]]
) -> None:
    cfg = config()
    bad = BadRecords(cfg, "r", writer=Collecting(cfg))
    exc = decode_error(b"{}")
    for o in sorted(bad_offsets):
        bad.bad("clicks", 0, o, b"{}", exc)
    spans = [("clicks", p, start, start + n) for p, start, n in ranges]
    want = sum(1 for o in bad_offsets
               if any(p == 0 and s <= o < e for _, p, s, e in spans))
    assert bad.within(spans) == want
