"""Tests of the ``substreams.yaml`` loader: the shipped example and every error class.

Error tests assert the file, line, dotted key and the salient part of the message,
since pointing the user at the exact spot is the loader's whole purpose.
"""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path
from typing import Any

import pytest

from substreams import errors
from substreams.config import (
    AckerConfig,
    Config,
    KafkaConfig,
    SealPolicy,
    StageConfig,
    StreamConfig,
    SubstreamConfig,
    TopicSpec,
    load_config,
)
from substreams.config.loader import load_config_text
from substreams.errors import ConfigError, SubstreamsError

REPO = Path(__file__).resolve().parents[2]

EVENT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "test",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "url", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "epoch", "type": "int"},
        {"name": "score", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "maybe", "type": ["null", "long"]},
    ],
}

STREAM = """\
streams:
  - name: events
    schema: avro/event.avsc
    order_key: ts
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding ``avro/event.avsc``; configs are written next to it."""
    (tmp_path / "avro").mkdir()
    (tmp_path / "avro" / "event.avsc").write_text(json.dumps(EVENT_SCHEMA))
    return tmp_path


def load(project: Path, text: str) -> Config:
    path = project / "substreams.yaml"
    path.write_text(textwrap.dedent(text))
    return load_config(path)


def fail(project: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(project, text)
    err = info.value
    assert err.file == str(project / "substreams.yaml")
    location = err.file
    if err.line is not None:
        location += f":{err.line}" + (f":{err.column}" if err.column is not None else "")
    assert str(err).startswith(f"{location}: ")
    return err


def substream(*lines: str, stream: str = "events") -> str:
    """STREAM plus one substream ``w`` (lines 6-7) followed by ``lines`` (line 8 on)."""
    body = "".join(f"    {line}\n" for line in lines)
    return STREAM + f"substreams:\n  - name: w\n    stream: {stream}\n" + body


def line_of(text: str, needle: str) -> int:
    """1-based line of the only line of ``text`` containing ``needle``."""
    hits = [i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line]
    assert len(hits) == 1, hits
    return hits[0]


# --------------------------------------------------------------------- shipped example


def test_shipped_example_loads_to_the_expected_model() -> None:
    config = load_config(REPO / "substreams.yaml")
    schema = json.loads((REPO / "avro" / "click.avsc").read_text())
    tumbling = SubstreamConfig(
        name="clicks_1s",
        stream="clicks",
        kind="tumbling",
        field="ts",
        size_ms=1000,
        mechanism="acker",
        bound="firm",
        ordered=True,
        seal=SealPolicy(lateness_ms=0, idle_ms=1000, late="raise"),
    )
    expected = Config(
        path=REPO / "substreams.yaml",
        kafka=KafkaConfig(bootstrap="embedded", replication_factor=None, client={}),
        streams=(
            StreamConfig(
                name="clicks",
                schema_path=REPO / "avro" / "click.avsc",
                schema=schema,
                partitions=4,
                order_key="ts",
            ),
        ),
        substreams=(
            tumbling,
            SubstreamConfig(
                name="clicks_1s_punct",
                stream="clicks",
                kind="tumbling",
                field="ts",
                size_ms=1000,
                mechanism="punctuations",
            ),
            SubstreamConfig(
                name="sessions",
                stream="clicks",
                kind="session",
                field="ts",
                key="user",
                gap_ms=2000,
            ),
        ),
        stages=(),
        acker=AckerConfig(),
    )
    assert config == expected
    assert config.kafka.embedded
    assert schema["name"] == "Click"
    assert schema["namespace"] == "substreams.demo"
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [
        ("user", "string"),
        ("url", "string"),
        ("ts", "long"),
    ]


def test_shipped_example_helpers_and_topics() -> None:
    config = load_config(REPO / "substreams.yaml")
    assert config.stream("clicks").partitions == 4
    assert config.substream("sessions").gap_ms == 2000
    assert [s.name for s in config.substreams_of("clicks")] == [
        "clicks_1s",
        "clicks_1s_punct",
        "sessions",
    ]
    assert config.substreams_of("nope") == ()
    assert config.acker.control_topic("clicks_1s") == "_substreams.control.clicks_1s"
    assert config.topics() == [
        ("clicks", 4),
        ("_substreams.control.clicks_1s", 1),
        ("_substreams.control.clicks_1s_punct", 1),
        ("_substreams.control.sessions", 1),
        ("_substreams.control.__acker.acker", 1),
        ("_substreams.control.__aligner.clicks_1s_punct", 1),
        ("_substreams.acks", 1),
        ("_substreams.commands", 1),
        ("_substreams.responses", 1),
        ("_substreams.dead_letter", 1),
    ]


def test_unknown_stream_and_substream_lookups_name_the_known_ones() -> None:
    config = load_config(REPO / "substreams.yaml")
    with pytest.raises(ConfigError) as info:
        config.stream("klicks")
    assert "no stream named 'klicks'; known: clicks" in str(info.value)
    assert info.value.key == "streams"
    assert info.value.line is None
    with pytest.raises(SubstreamsError, match="no substream named 'x'; known: clicks_1s, "):
        config.substream("x")


# --------------------------------------------------------------------- valid variants


def test_defaults_are_filled_in(project: Path) -> None:
    config = load(
        project,
        STREAM
        + """\
substreams:
  - {name: w, stream: events, kind: tumbling, size_ms: 10}
  - {name: s, stream: events, kind: session, key: user, gap_ms: 5, field: epoch}
  - {name: e, stream: events, kind: epoch, field: epoch, mechanism: punctuations}
  - {name: k, stream: events, kind: per_key, key: epoch, bound: soft, ordered: false}
""",
    )
    assert config.kafka == KafkaConfig()
    assert config.streams[0].partitions == 1
    assert config.streams[0].schema_path == project / "avro" / "event.avsc"
    assert config.path == project / "substreams.yaml"
    assert config.substreams == (
        SubstreamConfig("w", "events", "tumbling", field="ts", size_ms=10),
        SubstreamConfig("s", "events", "session", field="epoch", key="user", gap_ms=5),
        SubstreamConfig("e", "events", "epoch", field="epoch", mechanism="punctuations"),
        SubstreamConfig("k", "events", "per_key", key="epoch", bound="soft", ordered=False),
    )
    assert config.stages == ()
    assert config.acker == AckerConfig()


def test_stages_client_bootstrap_and_acker_overrides(project: Path) -> None:
    config = load(
        project,
        """\
kafka:
  bootstrap: "k1:9092,[::1]:9093"
  replication_factor: 3
  client: {compression.type: lz4, linger.ms: 5, enable.idempotence: true, x: 0.5}
streams:
  - {name: events, schema: avro/event.avsc, order_key: ts, partitions: 8}
  - {name: enriched, schema: avro/event.avsc, order_key: epoch}
stages:
  - {name: enrich, input: events, output: enriched}
  - {name: loop, input: enriched, output: enriched}
acker:
  name: acker-2
  acks_partitions: 4
  control_topic_prefix: ctl.
  heartbeat_ms: 100
  standby_timeout_ms: 101
""",
    )
    assert config.kafka.bootstrap == "k1:9092,[::1]:9093"
    assert not config.kafka.embedded
    assert config.kafka.replication_factor == 3
    assert dict(config.kafka.client) == {
        "compression.type": "lz4",
        "linger.ms": 5,
        "enable.idempotence": True,
        "x": 0.5,
    }
    assert config.stages == (
        StageConfig("enrich", "events", "enriched"),
        StageConfig("loop", "enriched", "enriched"),
    )
    assert config.acker.name == "acker-2"
    assert config.acker.control_topic("w") == "ctl.w"
    assert config.acker.standby_timeout_ms == 101
    assert ("_substreams.acks", 4) in config.topics()
    assert config.topics()[:2] == [("events", 8), ("enriched", 1)]


def test_empty_sections_mean_defaults(project: Path) -> None:
    config = load(project, "kafka:\nacker:\nsubstreams:\nstages:\n" + STREAM)
    assert config.kafka == KafkaConfig()
    assert config.acker == AckerConfig()
    assert config.substreams == ()


def test_yaml_merge_keys_share_settings(project: Path) -> None:
    config = load(
        project,
        STREAM
        + """\
substreams:
  - &base {name: a, stream: events, kind: tumbling, size_ms: 100, bound: soft}
  - <<: *base
    name: b
""",
    )
    assert config.substreams[1] == SubstreamConfig(
        "b", "events", "tumbling", field="ts", size_ms=100, bound="soft"
    )


def test_load_config_text_resolves_schemas_against_the_given_path(project: Path) -> None:
    config = load_config_text(STREAM, project / "any.yaml")
    assert config.stream("events").schema == EVENT_SCHEMA
    assert config.path == project / "any.yaml"


# --------------------------------------------------------------------- file and syntax


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.file == str(path)
    assert info.value.line is None
    assert str(info.value) == f"{path}: file not found"


def test_yaml_syntax_error_has_line_and_column(project: Path) -> None:
    err = fail(project, "streams:\n  - name: a\n    schema: [oops\n")
    assert err.line == 4
    assert err.column == 1
    assert err.key == ""
    assert "invalid YAML: " in str(err)
    assert str(err).startswith(f"{err.file}:4:1: invalid YAML: ")


def test_yaml_syntax_error_bad_indentation(project: Path) -> None:
    err = fail(project, "kafka:\n  bootstrap: x\n bad: 1\n")
    assert (err.line, err.column) == (3, 2)


@pytest.mark.parametrize(
    ("text", "line", "got"),
    [
        ("- a\n- b\n", 1, "got a list"),
        ("just text\n", 1, "got 'just text'"),
    ],
)
def test_top_level_must_be_a_mapping(project: Path, text: str, line: int, got: str) -> None:
    err = fail(project, text)
    assert err.line == line
    assert err.key == ""
    assert "the top level must be a mapping" in str(err)
    assert got in str(err)


def test_empty_file(project: Path) -> None:
    err = fail(project, "# only a comment\n")
    assert err.line is None
    assert "the file is empty" in str(err)


# --------------------------------------------------------------------- keys


def test_unknown_top_level_key(project: Path) -> None:
    text = STREAM + "substream: []\n"
    err = fail(project, text)
    assert err.line == line_of(text, "substream:") == 5
    assert err.key == "substream"
    assert err.allowed == "kafka, streams, substreams, stages, acker"
    assert (
        "unknown key 'substream'; allowed: kafka, streams, substreams, stages, acker;"
        " did you mean 'substreams'?"
    ) in str(err)


def test_unknown_nested_key(project: Path) -> None:
    text = substream("kind: tumbling", "sise_ms: 1")
    err = fail(project, text)
    assert err.line == 9
    assert err.key == "substreams[0].sise_ms"
    assert "unknown key 'sise_ms'" in str(err)
    assert "did you mean 'size_ms'?" in str(err)


def test_duplicate_key(project: Path) -> None:
    text = "streams:\n  - name: a\n    name: b\n"
    err = fail(project, text)
    assert err.line == 3
    assert err.key == "streams[0].name"
    assert "duplicate key 'name' (first at line 2)" in str(err)


def test_missing_required_key_is_reported_at_the_mapping(project: Path) -> None:
    text = "streams:\n  - schema: avro/event.avsc\n    order_key: ts\n"
    err = fail(project, text)
    assert err.line == 2
    assert err.key == "streams[0].name"
    assert str(err) == f"{err.file}:2: streams[0].name: missing required key 'name'"


def test_missing_streams(project: Path) -> None:
    err = fail(project, "\n\nkafka: {}\n")
    assert err.line == 3
    assert err.key == "streams"
    assert "missing required key 'streams'" in str(err)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("streams: []\n", "at least one stream is required"),
        ("streams: events\n", "expected a list, got 'events'"),
        ("streams:\n- events\n", "expected a mapping, got 'events'"),
    ],
)
def test_streams_shape(project: Path, text: str, problem: str) -> None:
    err = fail(project, text)
    assert err.key in ("streams", "streams[0]")
    assert problem in str(err)


# --------------------------------------------------------------------- values

RF = "kafka.replication_factor"


@pytest.mark.parametrize(
    ("snippet", "key", "problem"),
    [
        ("kafka: {replication_factor: true}", RF, "expected an integer, got true"),
        ("kafka: {replication_factor: '2'}", RF, "expected an integer, got '2'"),
        ("kafka: {replication_factor: 1.5}", RF, "expected an integer, got 1.5"),
        ("kafka: {bootstrap: 9092}", "kafka.bootstrap", "expected a string, got 9092 (quote it"),
        (
            "kafka: {client: {linger.ms: [1]}}",
            "kafka.client.linger.ms",
            "a string, number or boolean, got a list",
        ),
        ("kafka: {client: [a]}", "kafka.client", "expected a mapping, got a list"),
        ("acker: {flush_ms: null}", "acker.flush_ms", "expected an integer, got null"),
        ("acker: {name: 7}", "acker.name", "expected a string, got 7"),
    ],
)
def test_wrong_type(project: Path, snippet: str, key: str, problem: str) -> None:
    text = STREAM + snippet + "\n"
    err = fail(project, text)
    assert err.line == 5
    assert err.key == key
    assert problem in str(err)


def test_wrong_type_in_substream(project: Path) -> None:
    text = STREAM + "substreams:\n  - {name: w, stream: events, kind: tumbling, size_ms: 5,\n"
    text += "     ordered: 'yes'}\n"
    err = fail(project, text)
    assert err.line == 7
    assert err.key == "substreams[0].ordered"
    assert err.value == "yes"
    assert "expected a boolean (true/false), got 'yes'" in str(err)


@pytest.mark.parametrize(
    ("snippet", "key", "value", "minimum"),
    [
        ("kafka: {replication_factor: 0}", "kafka.replication_factor", 0, 1),
        ("acker: {acks_partitions: -1}", "acker.acks_partitions", -1, 1),
        ("acker: {snapshot_every: 0}", "acker.snapshot_every", 0, 1),
    ],
)
def test_out_of_range(project: Path, snippet: str, key: str, value: int, minimum: int) -> None:
    err = fail(project, STREAM + snippet + "\n")
    assert (err.line, err.key, err.value) == (5, key, value)
    assert f"{value} is out of range; must be >= {minimum}" in str(err)


def test_out_of_range_partitions_and_sizes(project: Path) -> None:
    err = fail(project, STREAM + "    partitions: 0\n")
    assert (err.line, err.key) == (5, "streams[0].partitions")
    text = substream("kind: tumbling", "size_ms: 0")
    err = fail(project, text)
    assert (err.line, err.key) == (9, "substreams[0].size_ms")
    assert "0 is out of range; must be >= 1" in str(err)


@pytest.mark.parametrize("bad", ["my stream", "_hidden", "-x", "a/b", "'é'"])
def test_bad_name(project: Path, bad: str) -> None:
    text = f"streams:\n  - name: {bad}\n    schema: avro/event.avsc\n    order_key: ts\n"
    err = fail(project, text)
    assert (err.line, err.key) == (2, "streams[0].name")
    assert "is not a valid name; names must match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in str(err)


def test_bad_topic_name(project: Path) -> None:
    err = fail(project, STREAM + "acker:\n  acks_topic: 'a b'\n")
    assert (err.line, err.key) == (6, "acker.acks_topic")
    assert "'a b' is not a valid Kafka topic name" in str(err)


@pytest.mark.parametrize("bad", ["localhost", "host:", "host:99999", "a:1,,b:2", "a:1 ,b:2"])
def test_bad_bootstrap(project: Path, bad: str) -> None:
    err = fail(project, f"kafka:\n  bootstrap: '{bad}'\n" + STREAM)
    assert (err.line, err.key) == (2, "kafka.bootstrap")
    assert "is not a valid bootstrap; expected 'embedded' or host:port[,host:port...]" in str(err)


# --------------------------------------------------------------------- names and references


def test_duplicate_stream_names(project: Path) -> None:
    text = STREAM + "  - {name: events, schema: avro/event.avsc, order_key: ts}\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (5, "streams[1].name", "events")
    assert "duplicate stream name 'events' (first defined at line 2)" in str(err)


def test_duplicate_substream_names(project: Path) -> None:
    text = STREAM + (
        "substreams:\n"
        "  - {name: w, stream: events, kind: per_key, key: user}\n"
        "  - {name: w, stream: events, kind: per_key, key: url}\n"
    )
    err = fail(project, text)
    assert (err.line, err.key) == (7, "substreams[1].name")
    assert "duplicate substream name 'w' (first defined at line 6)" in str(err)


def test_duplicate_stage_names(project: Path) -> None:
    text = STREAM + (
        "stages:\n"
        "  - {name: s, input: events, output: events}\n"
        "  - {name: s, input: events, output: events}\n"
    )
    err = fail(project, text)
    assert (err.line, err.key) == (7, "stages[1].name")
    assert "duplicate stage name 's'" in str(err)


def test_dangling_substream_stream(project: Path) -> None:
    text = substream("kind: per_key", "key: user", stream="evnts")
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (7, "substreams[0].stream", "evnts")
    assert err.allowed == "events"
    assert "no stream named 'evnts'; streams: events" in str(err)


@pytest.mark.parametrize(("key", "line"), [("input", 7), ("output", 8)])
def test_dangling_stage_streams(project: Path, key: str, line: int) -> None:
    ref = {"input": "events", "output": "events", key: "ghost"}
    text = STREAM + (
        f"stages:\n  - name: s\n    input: {ref['input']}\n    output: {ref['output']}\n"
    )
    err = fail(project, text)
    assert (err.line, err.key) == (line, f"stages[0].{key}")
    assert "no stream named 'ghost'; streams: events" in str(err)


def test_stage_missing_output(project: Path) -> None:
    err = fail(project, STREAM + "stages:\n  - {name: s, input: events}\n")
    assert (err.line, err.key) == (6, "stages[0].output")
    assert "missing required key 'output'" in str(err)


# --------------------------------------------------------------------- substream kinds


def test_bad_kind_lists_the_allowed_kinds(project: Path) -> None:
    text = STREAM + "substreams:\n  - name: w\n    stream: events\n    kind: tumblin\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (8, "substreams[0].kind", "tumblin")
    assert err.allowed == "epoch, tumbling, hopping, session, per_key"
    assert str(err) == (
        f"{err.file}:8: substreams[0].kind: 'tumblin' is not allowed;"
        " allowed: epoch, tumbling, hopping, session, per_key"
    )


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [("mechanism", "ack", "acker, punctuations"), ("bound", "hard", "firm, soft")],
)
def test_bad_enumerations(project: Path, key: str, value: str, allowed: str) -> None:
    text = substream("kind: per_key", "key: user", f"{key}: {value}")
    err = fail(project, text)
    assert (err.line, err.key, err.allowed) == (10, f"substreams[0].{key}", allowed)
    assert f"'{value}' is not allowed; allowed: {allowed}" in str(err)


def test_on_bad_record_defaults_to_dead_letter_and_names_a_bad_value(project: Path) -> None:
    assert load(project, STREAM).streams[0].on_bad_record == "dead_letter"
    assert load(project, STREAM + "    on_bad_record: fail\n").streams[0].on_bad_record == "fail"
    err = fail(project, STREAM + "    on_bad_record: skip\n")
    assert (err.line, err.key, err.value) == (5, "streams[0].on_bad_record", "skip")
    assert err.allowed == "dead_letter, fail"
    assert "'skip' is not allowed; allowed: dead_letter, fail" in str(err)


@pytest.mark.parametrize(
    ("kind", "extra", "missing"),
    [
        ("tumbling", "", "size_ms"),
        ("session", "    gap_ms: 5\n", "key"),
        ("session", "    key: user\n", "gap_ms"),
        ("epoch", "", "field"),
        ("per_key", "", "key"),
    ],
)
def test_kind_specific_key_missing(project: Path, kind: str, extra: str, missing: str) -> None:
    text = STREAM + f"substreams:\n  - name: w\n    stream: events\n    kind: {kind}\n" + extra
    err = fail(project, text)
    assert (err.line, err.key) == (6, f"substreams[0].{missing}")
    assert f"missing required key '{missing}' (required for kind '{kind}')" in str(err)


@pytest.mark.parametrize(
    ("kind", "extra", "bad", "only"),
    [
        ("session", "    key: user\n    gap_ms: 5\n    size_ms: 5\n", "size_ms",
         "tumbling, hopping"),
        ("tumbling", "    size_ms: 5\n    gap_ms: 5\n", "gap_ms", "session"),
        ("tumbling", "    size_ms: 5\n    key: user\n", "key", "session, per_key"),
        ("per_key", "    key: user\n    field: ts\n", "field", "epoch, tumbling, hopping, session"),
        ("tumbling", "    size_ms: 5\n    slide_ms: 5\n", "slide_ms", "hopping"),
    ],
)
def test_kind_specific_key_not_allowed(
    project: Path, kind: str, extra: str, bad: str, only: str
) -> None:
    text = STREAM + f"substreams:\n  - name: w\n    stream: events\n    kind: {kind}\n" + extra
    err = fail(project, text)
    assert err.line == line_of(text, f"    {bad}:")
    assert err.key == f"substreams[0].{bad}"
    assert f"'{bad}' is not allowed for kind '{kind}'; only for: {only}" in str(err)


# --------------------------------------------------------------------- schemas and fields


def _schema_error(project: Path, content: str | None) -> ConfigError:
    if content is not None:
        (project / "avro" / "bad.avsc").write_text(content)
    text = "streams:\n  - name: events\n    schema: avro/bad.avsc\n    order_key: ts\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (3, "streams[0].schema", "avro/bad.avsc")
    return err


def test_schema_file_missing(project: Path) -> None:
    err = _schema_error(project, None)
    assert "schema file 'avro/bad.avsc' not found (looked for " in str(err)
    assert str(project / "avro" / "bad.avsc") in str(err)


def test_schema_not_json(project: Path) -> None:
    err = _schema_error(project, '{"type": "record",\n  name: x}')
    assert "schema file 'avro/bad.avsc' is not valid JSON: " in str(err)
    assert "at line 2, column 3" in str(err)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('"string"', "it is 'string'"),
        ('["null", "string"]', "it is a union"),
        ('{"type": "enum", "name": "E", "symbols": ["a"]}', "its type is 'enum', expected"),
    ],
)
def test_schema_not_a_record(project: Path, content: str, why: str) -> None:
    err = _schema_error(project, content)
    assert f"schema file 'avro/bad.avsc' is not an Avro record schema: {why}" in str(err)


def test_schema_invalid_avro(project: Path) -> None:
    bad = {"type": "record", "name": "R", "fields": [{"name": "ts", "type": "lon"}]}
    err = _schema_error(project, json.dumps(bad))
    assert "schema file 'avro/bad.avsc' is not a valid Avro schema: " in str(err)
    assert "lon" in str(err)


def test_order_key_not_in_schema(project: Path) -> None:
    text = "streams:\n  - name: events\n    schema: avro/event.avsc\n    order_key: time\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (4, "streams[0].order_key", "time")
    assert (
        "'time' is not a field of stream 'events'; its fields are: user (string), url (string),"
        " ts (long), epoch (int), score (double), at (long (timestamp-millis)),"
        " maybe (null | long)"
    ) in str(err)


@pytest.mark.parametrize(
    ("field", "label"),
    [
        ("user", "string"),
        ("score", "double"),
        ("maybe", "null | long"),
        ("at", "long (timestamp-millis)"),
    ],
)
def test_order_key_of_wrong_type(project: Path, field: str, label: str) -> None:
    text = f"streams:\n  - name: events\n    schema: avro/event.avsc\n    order_key: {field}\n"
    err = fail(project, text)
    assert (err.line, err.key) == (4, "streams[0].order_key")
    assert (
        f"field '{field}' of stream 'events' has type {label}; the order key must be a plain"
        " int or long"
    ) in str(err)
    assert "fields of that type: ts, epoch" in str(err)
    assert err.allowed == "ts, epoch"


def test_substream_event_time_field_checked(project: Path) -> None:
    text = substream("kind: tumbling", "size_ms: 1", "field: url")
    err = fail(project, text)
    assert (err.line, err.key) == (10, "substreams[0].field")
    assert "the event-time field must be a plain int or long" in str(err)


def test_epoch_field_not_in_schema(project: Path) -> None:
    text = substream("kind: epoch", "field: epok")
    err = fail(project, text)
    assert (err.line, err.key) == (9, "substreams[0].field")
    assert "'epok' is not a field of stream 'events'; its fields are: user (string)" in str(err)


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("usr", "'usr' is not a field of stream 'events'"),
        ("score", "the key must be a plain string, bytes, int, long, boolean"),
    ],
)
def test_session_key_checked(project: Path, key: str, problem: str) -> None:
    text = substream("kind: session", "gap_ms: 1", f"key: {key}")
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (10, "substreams[0].key", key)
    assert problem in str(err)


# --------------------------------------------------------------------- acker and topics


def test_standby_timeout_must_exceed_heartbeat(project: Path) -> None:
    text = STREAM + "acker:\n  heartbeat_ms: 500\n  standby_timeout_ms: 500\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (7, "acker.standby_timeout_ms", 500)
    assert "standby_timeout_ms (500) must be greater than heartbeat_ms (500)" in str(err)


def test_heartbeat_above_default_standby_timeout_blames_heartbeat(project: Path) -> None:
    err = fail(project, STREAM + "acker:\n  heartbeat_ms: 5000\n")
    assert (err.line, err.key) == (6, "acker.heartbeat_ms")
    assert "standby_timeout_ms (3000) must be greater than heartbeat_ms (5000)" in str(err)


def test_topics_must_be_distinct(project: Path) -> None:
    err = fail(project, STREAM + "acker:\n  command_topic: events\n")
    assert (err.line, err.key) == (6, "acker.command_topic")
    assert "topic 'events' is also used by streams[0].name" in str(err)


def test_topic_collision_with_a_default_blames_the_written_value(project: Path) -> None:
    err = fail(project, STREAM + "acker:\n  acks_topic: _substreams.commands\n")
    assert (err.line, err.key) == (6, "acker.acks_topic")
    assert "topic '_substreams.commands' is also used by acker.command_topic" in str(err)


def test_topic_too_long(project: Path) -> None:
    name = "x" * 250
    err = fail(project, f"streams:\n  - {{name: {name}, schema: avro/event.avsc, order_key: ts}}\n")
    assert (err.line, err.key) == (2, "streams[0].name")
    assert "is 250 characters long; Kafka allows at most 249" in str(err)


# --------------------------------------------------------------------- the error classes


def test_config_error_message_format_and_pickling() -> None:
    err = ConfigError(
        "substreams.yaml",
        14,
        "substreams[1].kind",
        "'tumblin' is not allowed; allowed: epoch, tumbling, hopping, session, per_key",
        value="tumblin",
        allowed="epoch, tumbling, hopping, session, per_key",
    )
    assert str(err) == (
        "substreams.yaml:14: substreams[1].kind: 'tumblin' is not allowed;"
        " allowed: epoch, tumbling, hopping, session, per_key"
    )
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, ConfigError)
    assert (copy.file, copy.line, copy.key, copy.value, copy.allowed, str(copy)) == (
        err.file,
        err.line,
        err.key,
        err.value,
        err.allowed,
        str(err),
    )


@pytest.mark.parametrize(
    "name",
    [
        "ConfigError",
        "SchemaMismatchError",
        "OrderKeyRegressionError",
        "PublisherFencedError",
        "PublisherAlreadyAcquiredError",
        "BrokerError",
        "ProtocolError",
    ],
)
def test_user_facing_errors_derive_from_substreams_error(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, SubstreamsError)
    assert cls.__doc__


# --------------------------------------------------------------------- topic settings

WEEK_MS = 7 * 24 * 3_600_000


def test_topic_settings_defaults_per_kind(project: Path) -> None:
    """Replication and min ISR are automatic by default; each kind has its own retention."""
    config = load(project, STREAM + "substreams:\n  - {name: w, stream: events, kind: per_key,"
                  " key: user}\n")  # fmt: skip
    assert config.kafka.replication_factor is None
    assert config.kafka.min_insync_replicas is None
    specs = {t.name: t for t in config.topics()}
    kinds = {name: spec.kind for name, spec in specs.items()}
    assert kinds == {
        "events": "data",
        "_substreams.control.w": "control",
        "_substreams.control.__acker.acker": "checkpoint",
        "_substreams.acks": "acks",
        "_substreams.commands": "command",
        "_substreams.responses": "response",
        "_substreams.dead_letter": "dead_letter",
    }
    retention = {name: spec.configs["retention.ms"] for name, spec in specs.items()}
    assert retention == {
        "events": str(WEEK_MS),
        "_substreams.control.w": "-1",
        "_substreams.control.__acker.acker": "-1",
        "_substreams.acks": str(WEEK_MS),
        "_substreams.commands": "-1",
        "_substreams.responses": str(24 * 3_600_000),
        "_substreams.dead_letter": str(30 * 24 * 3_600_000),
    }
    assert all(s.configs["cleanup.policy"] == "delete" for s in specs.values())
    checkpoint = specs["_substreams.control.__acker.acker"].configs
    assert (checkpoint["retention.bytes"], checkpoint["segment.bytes"]) == (
        str(64 << 20),
        str(16 << 20),
    )
    others = [s for n, s in specs.items() if s.kind != "checkpoint"]
    assert all(s.configs["retention.bytes"] == "-1" for s in others)
    assert all(s.replication_factor is None and s.min_insync_replicas is None for s in others)


def test_topic_specs_are_still_name_partition_pairs(project: Path) -> None:
    config = load(project, STREAM)
    spec = config.topics()[0]
    name, partitions = spec
    assert (name, partitions) == ("events", 1) == spec
    assert dict(config.topics())["_substreams.acks"] == 1
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec != TopicSpec("events", 1, "control")
    with pytest.raises(AttributeError):
        spec.kind = "acks"  # type: ignore[misc]
    assert config.topic_spec("_substreams.responses").kind == "response"
    other_acker = config.topic_spec("_substreams.control.__acker.standby-2")
    assert other_acker.kind == "checkpoint"
    with pytest.raises(ConfigError, match="no topic named 'nope'"):
        config.topic_spec("nope")


def test_topic_settings_overrides(project: Path) -> None:
    config = load(
        project,
        """\
kafka:
  replication_factor: 3
  min_insync_replicas: 3
  data_retention_ms: 3_600_000
streams:
  - {name: events, schema: avro/event.avsc, order_key: ts, retention_ms: -1}
  - {name: other, schema: avro/event.avsc, order_key: ts}
acker:
  acks_retention_ms: 120000
  response_retention_ms: 60000
  dead_letter_retention_ms: -1
  checkpoint_retention_bytes: 16777216
""",
    )
    assert (config.kafka.replication_factor, config.kafka.min_insync_replicas) == (3, 3)
    specs = {t.name: t for t in config.topics()}
    assert specs["events"].configs["retention.ms"] == "-1"
    assert specs["other"].configs["retention.ms"] == "3600000"
    assert config.retention_of(config.stream("other")) == 3_600_000
    assert specs["_substreams.acks"].configs["retention.ms"] == "120000"
    assert specs["_substreams.responses"].configs["retention.ms"] == "60000"
    assert specs["_substreams.dead_letter"].configs["retention.ms"] == "-1"
    assert specs["_substreams.control.__acker.acker"].configs["segment.bytes"] == "4194304"
    assert all((s.replication_factor, s.min_insync_replicas) == (3, 3) for s in specs.values())


MISR = "kafka.min_insync_replicas"


@pytest.mark.parametrize(
    ("kafka", "problem"),
    [
        (
            "{replication_factor: 2, min_insync_replicas: 3}",
            "3 is more than kafka.replication_factor (2): no write could ever be acknowledged",
        ),
        (
            "{min_insync_replicas: 4}",
            "4 is more than the automatic replication factor can be (min(3, brokers in the"
            " cluster)); set kafka.replication_factor",
        ),
        ("{min_insync_replicas: 0}", "0 is out of range; must be >= 1"),
        ("{min_insync_replicas: two}", "expected an integer, got 'two'"),
    ],
)
def test_min_insync_replicas_validated(project: Path, kafka: str, problem: str) -> None:
    err = fail(project, STREAM + f"kafka: {kafka}\n")
    assert (err.line, err.key) == (5, MISR)
    assert problem in str(err)


def test_min_insync_replicas_error_names_its_own_line(project: Path) -> None:
    text = "kafka:\n  replication_factor: 1\n  min_insync_replicas: 2\n" + STREAM
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (3, MISR, 2)
    assert load(project, text.replace("min_insync_replicas: 2", "min_insync_replicas: 1"))


RETENTION_PROBLEM = "must be -1 (keep forever) or >= 60000 (one minute, in ms)"


@pytest.mark.parametrize(
    ("snippet", "key", "value"),
    [
        ("kafka: {data_retention_ms: 59999}", "kafka.data_retention_ms", 59999),
        ("kafka: {data_retention_ms: 0}", "kafka.data_retention_ms", 0),
        ("acker: {acks_retention_ms: 1000}", "acker.acks_retention_ms", 1000),
        ("acker: {response_retention_ms: 5}", "acker.response_retention_ms", 5),
        ("acker: {dead_letter_retention_ms: 0}", "acker.dead_letter_retention_ms", 0),
    ],
)
def test_retention_ms_range(project: Path, snippet: str, key: str, value: int) -> None:
    err = fail(project, STREAM + snippet + "\n")
    assert (err.line, err.key, err.value) == (5, key, value)
    assert f"{value} is out of range; {RETENTION_PROBLEM}" in str(err)


@pytest.mark.parametrize(
    ("snippet", "key", "problem"),
    [
        ("kafka: {data_retention_ms: -2}", "kafka.data_retention_ms", "must be >= -1"),
        ("kafka: {data_retention_ms: 7d}", "kafka.data_retention_ms", "expected an integer"),
        ("acker: {acks_retention_ms: true}", "acker.acks_retention_ms", "expected an integer"),
        (
            "acker: {checkpoint_retention_bytes: 1048576}",
            "acker.checkpoint_retention_bytes",
            "1048576 is out of range; must be >= 16777216",
        ),
        ("acker: {acks_retention: 1}", "acker.acks_retention", "did you mean 'acks_retention_ms'"),
        ("kafka: {retention_ms: 1}", "kafka.retention_ms", "did you mean 'data_retention_ms'"),
    ],
)
def test_topic_setting_keys_checked(project: Path, snippet: str, key: str, problem: str) -> None:
    err = fail(project, STREAM + snippet + "\n")
    assert (err.line, err.key) == (5, key)
    assert problem in str(err)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("999", "999 is out of range; must be >= 1000"),
        ("60001", "60001 is out of range; must be <= 60000"),
        ("5s", "expected an integer"),
    ],
)
def test_commit_timeout_ms_range(project: Path, value: str, problem: str) -> None:
    assert load(project, STREAM).kafka.commit_timeout_ms == 30_000
    short = load(project, STREAM + "kafka: {commit_timeout_ms: 1000}\n")
    assert short.kafka.commit_timeout_ms == 1000
    err = fail(project, STREAM + f"kafka: {{commit_timeout_ms: {value}}}\n")
    assert (err.line, err.key) == (5, "kafka.commit_timeout_ms")
    assert problem in str(err)


def test_stream_retention_checked_at_its_line(project: Path) -> None:
    err = fail(project, STREAM + "    retention_ms: 10\n")
    assert (err.line, err.key, err.value) == (5, "streams[0].retention_ms", 10)
    assert RETENTION_PROBLEM in str(err)


def test_dead_letters_must_outlive_punctuated_data(project: Path) -> None:
    punct = substream("kind: epoch", "field: epoch", "mechanism: punctuations")
    # A written dead-letter retention is blamed first...
    text = punct + "acker:\n  dead_letter_retention_ms: 86400000\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (12, "acker.dead_letter_retention_ms", 86400000)
    assert (
        "acker.dead_letter_retention_ms (86400000) is shorter than the retention of stream"
        " 'events' (604800000), which has a punctuation substream"
    ) in str(err)
    # ...else the data retention that made it too short: the stream's own...
    text = punct.replace("order_key: ts\n", "order_key: ts\n    retention_ms: -1\n", 1)
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (5, "streams[0].retention_ms", -1)
    assert "retention of stream 'events' (-1 (forever))" in str(err)
    # ...or the kafka-wide one.
    err = fail(project, "kafka:\n  data_retention_ms: 5184000000\n" + punct)
    assert (err.line, err.key) == (2, "kafka.data_retention_ms")
    # Fine when long enough, or when the stream has no punctuation substream.
    assert load(project, text + "acker:\n  dead_letter_retention_ms: -1\n")
    acked = substream("kind: epoch", "field: epoch")
    assert load(project, acked + "acker:\n  dead_letter_retention_ms: 60000\n")



def test_source_timeout_must_exceed_the_source_heartbeat(project: Path) -> None:
    text = STREAM + "acker:\n  source_heartbeat_ms: 1000\n  source_timeout_ms: 500\n"
    err = fail(project, text)
    assert (err.line, err.key, err.value) == (7, "acker.source_timeout_ms", 500)
    assert "source_timeout_ms (500) must be greater than source_heartbeat_ms (1000)" in str(err)
    assert "live sources would be evicted" in str(err)


def test_session_substreams_need_the_acker(project: Path) -> None:
    text = substream("kind: session", "gap_ms: 1", "key: user", "mechanism: punctuations")
    err = fail(project, text)
    assert (err.key, err.value) == ("substreams[0].mechanism", "punctuations")
    assert err.line == line_of(text, "    mechanism:")
    assert "a session substream is tracked by the acker" in str(err)


def test_the_unsealed_timeout_is_off_by_default_and_a_positive_integer(project: Path) -> None:
    assert load(project, STREAM).acker.unsealed_timeout_ms is None
    assert load(project, STREAM + "acker:\n  unsealed_timeout_ms: null\n").acker \
        .unsealed_timeout_ms is None
    assert load(project, STREAM + "acker:\n  unsealed_timeout_ms: 60000\n").acker \
        .unsealed_timeout_ms == 60000
    for bad, value in (("0", 0), ("'1m'", "1m"), ("true", True)):
        err = fail(project, STREAM + f"acker:\n  unsealed_timeout_ms: {bad}\n")
        assert (err.line, err.key, err.value) == (6, "acker.unsealed_timeout_ms", value)
        assert err.allowed == "null (off, the default) or an integer >= 1"


def test_a_misspelt_key_is_reported_before_the_key_it_hides(project: Path) -> None:
    err = fail(project, "acker: {heartbeat_ms: 100}\nstreamz: []\n")
    assert (err.line, err.key) == (2, "streamz")
    assert "did you mean 'streams'?" in str(err)


def test_keys_the_loader_fills_in_are_not_keys_of_the_file(project: Path) -> None:
    err = fail(project, STREAM + "    schema_path: /etc/passwd\n")
    assert (err.line, err.key) == (5, "streams[0].schema_path")
    assert "unknown key 'schema_path'; allowed: name, schema, partitions, order_key," in str(err)
    err = fail(project, STREAM + "path: x\n")
    assert (err.line, err.key) == (5, "path")


def test_keys_must_be_strings(project: Path) -> None:
    err = fail(project, STREAM + "acker: {1: x}\n")
    assert (err.line, err.key, err.value) == (5, "acker.1", 1)
    assert "unknown key 1; allowed: name, acks_topic," in str(err)
    err = fail(project, STREAM + "kafka:\n  client:\n    1: x\n")
    assert (err.line, err.key) == (7, "kafka.client")
    assert "keys must be strings, got 1" in str(err)


def test_a_merged_mapping_reused_by_an_alias_is_no_duplicate(project: Path) -> None:
    # The second visit sees the mapping already merged (lateness_ms twice): not a mistake.
    text = STREAM
    text += "substreams:\n"
    text += "  - {name: w, stream: events, kind: tumbling, size_ms: 5,\n"
    text += "     seal: &p {<<: {lateness_ms: 1, late: dead_letter}, lateness_ms: 5}}\n"
    text += "  - {name: v, stream: events, kind: tumbling, size_ms: 5, seal: *p}\n"
    config = load(project, text)
    policy = SealPolicy(lateness_ms=5, late="dead_letter")
    assert [s.seal for s in config.substreams] == [policy, policy]


# --------------------------------------------------------------------- hopping windows


def test_hopping_loads_with_its_panes(project: Path) -> None:
    config = load(project, substream("kind: hopping", "size_ms: 30", "slide_ms: 10"))
    sub = config.substream("w")
    assert sub == SubstreamConfig("w", "events", "hopping", field="ts", size_ms=30, slide_ms=10)
    assert (sub.pane_ms, sub.panes_per_window) == (10, 3)
    tumbling = SubstreamConfig("t", "events", "tumbling", field="ts", size_ms=30)
    assert (tumbling.pane_ms, tumbling.panes_per_window) == (30, 1)


@pytest.mark.parametrize(("size", "slide"), [(25, 10), (10, 30)])
def test_hopping_size_must_be_a_multiple_of_slide(project: Path, size: int, slide: int) -> None:
    text = substream("kind: hopping", f"size_ms: {size}", f"slide_ms: {slide}")
    err = fail(project, text)
    assert err.line == line_of(text, "size_ms:")
    assert err.key == "substreams[0].size_ms"
    assert f"size_ms {size} is not a multiple of slide_ms {slide}" in str(err)


def test_hopping_needs_a_slide(project: Path) -> None:
    err = fail(project, substream("kind: hopping", "size_ms: 30"))
    assert (err.line, err.key) == (6, "substreams[0].slide_ms")
    assert "missing required key 'slide_ms' (required for kind 'hopping')" in str(err)
