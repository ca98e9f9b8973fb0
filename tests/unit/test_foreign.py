"""A stream over an existing topic: its config block, the foreign formats' decoder, the
partition split of ingest instances, the order key the framework keeps."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.config import ForeignSource, StreamConfig
from substreams.errors import SubstreamsError
from substreams.ingest import owned
from substreams.streams.foreign import (
    REASON_MISFIT,
    REASON_NOT_AVRO,
    REASON_NOT_CONFLUENT,
    REASON_NOT_JSON,
    REASON_UNKNOWN_ID,
    ForeignDecoder,
    ForeignPayloadError,
    confluent_frame,
)
from substreams.streams.schemas import Codec
from tests.unit.test_config import EVENT_SCHEMA, fail, line_of, load

FOREIGN = """\
streams:
  - name: orders
    schema: avro/event.avsc
    source:
      topic: legacy.orders
      format: {fmt}
{extra}substreams:
  - name: w
    stream: orders
    kind: tumbling
    field: ts
    size_ms: 1000
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding ``avro/event.avsc`` (test_config's schema)."""
    (tmp_path / "avro").mkdir()
    (tmp_path / "avro" / "event.avsc").write_text(json.dumps(EVENT_SCHEMA))
    return tmp_path


def foreign(fmt: str = "json", extra: str = "") -> str:
    return FOREIGN.format(fmt=fmt, extra=extra)


SCHEMA = {
    "type": "record", "name": "Order", "namespace": "t",
    "fields": [{"name": "user", "type": "string"}, {"name": "ts", "type": "long"}],
}


def stream(fmt: str = "json") -> StreamConfig:
    return StreamConfig(
        "orders", Path("/x.avsc"), SCHEMA, 1,
        source=ForeignSource("legacy.orders", fmt,  # type: ignore[arg-type]
                             "http://registry" if fmt == "confluent-avro" else None),
    )


def avro_body(schema: dict[str, object], record: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


# ------------------------------------------------------------------------------ config


def test_a_stream_over_an_existing_topic_loads(project: Path) -> None:
    config = load(project, foreign())
    s = config.stream("orders")
    assert s.source == ForeignSource("legacy.orders", "json")
    assert s.order_key is None  # the framework keeps it
    assert config.substream("w").field == "ts"
    assert pickle.loads(pickle.dumps(config)) == config


def test_confluent_avro_needs_a_registry_url_named_at_its_line(project: Path) -> None:
    text = foreign("confluent-avro")
    err = fail(project, text)
    assert err.key == "streams[0].source.registry_url"
    assert err.line == line_of(text, "topic: legacy.orders")
    assert "missing required key 'registry_url'" in err.problem


def test_a_registry_url_for_json_is_refused(project: Path) -> None:
    text = foreign("json", "      registry_url: http://127.0.0.1:8081\n")
    err = fail(project, text)
    assert err.key == "streams[0].source.registry_url"
    assert err.line == line_of(text, "registry_url")


def test_an_unknown_format_lists_the_allowed_ones(project: Path) -> None:
    text = foreign("protobuf")
    err = fail(project, text)
    assert err.key == "streams[0].source.format"
    assert err.line == line_of(text, "format:")
    assert err.allowed == "json, avro, confluent-avro"


def test_an_order_key_on_a_foreign_stream_is_refused(project: Path) -> None:
    text = foreign().replace("    source:\n", "    order_key: ts\n    source:\n")
    err = fail(project, text)
    assert err.key == "streams[0].order_key"
    assert "remove order_key" in err.problem


def test_the_source_topic_must_not_be_another_topic_of_the_config(project: Path) -> None:
    text = foreign().replace("topic: legacy.orders", "topic: orders")
    err = fail(project, text)
    assert err.key == "streams[0].source.topic"


def test_without_an_order_key_a_window_names_its_field(project: Path) -> None:
    text = foreign().replace("    field: ts\n", "")
    err = fail(project, text)
    assert err.key == "substreams[0].field"
    assert "no order_key to default to" in err.problem


def test_unknown_keys_of_the_source_block_are_errors(project: Path) -> None:
    text = foreign("json", "      time_feild: ts\n")
    err = fail(project, text)
    assert err.key == "streams[0].source.time_feild"
    assert "allowed: topic, format, registry_url, start" in err.problem


# ----------------------------------------------------------------------------- decoder


def test_json_objects_decode_and_everything_else_is_a_bad_record() -> None:
    d = ForeignDecoder(stream("json"))
    assert d.decode(b'{"user": "a", "ts": 5}') == {"user": "a", "ts": 5}
    for raw in (b"\xff\x00", b"[1, 2]", b"", None):
        with pytest.raises(ForeignPayloadError) as info:
            d.decode(raw)
        assert info.value.reason == REASON_NOT_JSON


def test_avro_single_object_of_the_stream_schema() -> None:
    d = ForeignDecoder(stream("avro"))
    value = Codec(SCHEMA).encode_single({"user": "a", "ts": 5})
    assert d.decode(value) == {"user": "a", "ts": 5}
    with pytest.raises(ForeignPayloadError) as info:
        d.decode(b'{"user": "a"}')
    assert info.value.reason == REASON_NOT_AVRO
    assert "C3 01" in str(info.value)


def test_confluent_wire_resolves_each_id_once_and_evolves_across_ids() -> None:
    """Id 1 is the stream's schema; id 2 a later writer that added a field with a default
    and reordered the rest: both read as the stream's record (Avro resolution)."""
    v2 = {"type": "record", "name": "Order", "namespace": "t", "fields": [
        {"name": "ts", "type": "long"}, {"name": "user", "type": "string"},
        {"name": "coupon", "type": ["null", "string"], "default": None}]}
    asked: list[int] = []
    schemas = {1: json.dumps(SCHEMA), 2: json.dumps(v2)}

    def lookup(schema_id: int) -> str | None:
        asked.append(schema_id)
        return schemas.get(schema_id)

    d = ForeignDecoder(stream("confluent-avro"), lookup)
    one = confluent_frame(1, avro_body(SCHEMA, {"user": "a", "ts": 5}))
    two = confluent_frame(2, avro_body(v2, {"ts": 6, "user": "b", "coupon": "x"}))
    assert d.decode(one) == {"user": "a", "ts": 5}
    assert d.decode(two) == {"user": "b", "ts": 6}
    assert d.decode(one) == {"user": "a", "ts": 5}
    assert asked == [1, 2]
    cases = [
        (b'{"user": "a"}', REASON_NOT_CONFLUENT),
        (confluent_frame(9, b"\x02a\x0a"), REASON_UNKNOWN_ID),
        (confluent_frame(1, b"\x02"), REASON_MISFIT),  # truncated body
    ]
    for raw, reason in cases:
        with pytest.raises(ForeignPayloadError) as info:
            d.decode(raw)
        assert info.value.reason == reason


def test_a_writer_schema_that_does_not_resolve_is_a_misfit() -> None:
    other = {"type": "record", "name": "Order", "namespace": "t",
             "fields": [{"name": "ts", "type": "string"}]}
    d = ForeignDecoder(stream("confluent-avro"), lambda i: json.dumps(other))
    with pytest.raises(ForeignPayloadError) as info:
        d.decode(confluent_frame(3, avro_body(other, {"ts": "x"})))
    assert info.value.reason == REASON_MISFIT


# ------------------------------------------------------------------- instances, order key


@given(st.integers(1, 64), st.integers(1, 8))
def test_instances_split_the_partitions_exactly(partitions: int, instances: int) -> None:
    parts = [owned(partitions, i, instances) for i in range(instances)]
    flat = sorted(p for part in parts for p in part)
    assert flat == list(range(partitions))


def test_an_instance_outside_the_count_is_refused() -> None:
    with pytest.raises(SubstreamsError, match="instance 2 of 2"):
        owned(4, 2, 2)


def test_the_error_for_an_untracked_topic_says_what_to_do() -> None:
    """A plain producer's JSON on a data topic: the reader's error points at `source:` and
    `substreams ingest`."""
    from substreams.errors import ForeignRecordError

    with pytest.raises(ForeignRecordError) as info:
        Codec(SCHEMA).decode_single(b'{"user": "a", "ts": 5}')
    message = str(info.value)
    assert "no C3 01 marker" in message
    assert "streams[].source" in message and "substreams ingest" in message


def test_a_stream_without_order_key_keeps_its_own_ingest_time() -> None:
    """Event times out of order and no order key field: the publisher writes them (no
    OrderKeyRegressionError, no field added), each record's order key its clock in ms,
    non-decreasing also when the clock steps back."""
    from substreams.config.loader import load_config_text
    from substreams.kafka.clock import SimClock
    from substreams.kafka.memory import MemoryLog
    from substreams.kafka.memproducer import MemoryProducers
    from substreams.streams.publisher import Publisher
    from substreams.streams.schemas import Codec, envelope_schema
    from tests.unit.test_publisher_memory import ROOT, delivered_records

    config = load_config_text(
        "streams:\n  - {name: clicks, schema: avro/click.avsc, partitions: 1}\n"
        "substreams:\n  - {name: w, stream: clicks, kind: tumbling, field: ts, size_ms: 10}\n",
        ROOT / "substreams.yaml",
    )
    class Skewed(SimClock):
        """A wall clock that can step back (NTP), as the real one can."""

        skew = 0

        def now_ms(self) -> int:
            return super().now_ms() + self.skew

    clock = Skewed()
    log = MemoryLog(clock)
    log.create_topics({"clicks": 1})
    pub = Publisher(config, "clicks", "web", bootstrap="memory/p", mechanisms={},
                    producers=MemoryProducers(log, lambda *_: None), schemas=lambda *_: None,
                    clock=clock)
    start = clock.now_ms()
    pub.publish({"user": "a", "url": "/1", "ts": 50})
    clock.advance_ms(5)
    pub.publish_many([{"user": "a", "url": "/2", "ts": 20},
                      {"user": "a", "url": "/3", "ts": 35}])
    clock.skew = -3  # the wall clock steps back: the key does not
    pub.publish({"user": "a", "url": "/4", "ts": 10})
    pub.flush()
    codec = Codec(envelope_schema(config.stream("clicks").schema))
    got = [codec.decode_single(r.value) for r in delivered_records(log, "clicks", 1)]
    assert [g["payload"]["ts"] for g in got] == [50, 20, 35, 10]
    assert [g["order_key"] for g in got] == [start, start + 5, start + 5, start + 5]
