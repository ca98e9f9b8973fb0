"""A :class:`Config` travels with a Spark job: it pickles (plain ``pickle`` and the
``cloudpickle`` PySpark ships tasks with) and is equal, and behaves the same, after a round
trip -- without the YAML file or the ``.avsc`` files it was loaded from."""

from __future__ import annotations

import json
import pickle
import shutil
import textwrap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substreams.config import (
    AckerConfig,
    Config,
    KafkaConfig,
    StageConfig,
    StreamConfig,
    SubstreamConfig,
    load_config,
)

cloudpickle = pytest.importorskip("pyspark.cloudpickle")

ROUND_TRIPS = [
    pytest.param(lambda c: pickle.loads(pickle.dumps(c)), id="pickle"),
    pytest.param(
        lambda c: pickle.loads(pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL)), id="pickle-5"
    ),
    pytest.param(lambda c: pickle.loads(cloudpickle.dumps(c)), id="cloudpickle"),
]

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "test",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "epoch", "type": "int"},
    ],
}

YAML = """\
kafka:
  bootstrap: "k1:9092,k2:9092"
  replication_factor: 3
  min_insync_replicas: 2
  client: {compression.type: lz4, linger.ms: 5, enable.idempotence: true, x: 0.5}
streams:
  - {name: events, schema: avro/event.avsc, order_key: ts, partitions: 4, retention_ms: -1}
  - {name: enriched, schema: avro/event.avsc, order_key: epoch}
substreams:
  - {name: w, stream: events, kind: tumbling, size_ms: 1000}
  - {name: s, stream: events, kind: session, key: user, gap_ms: 500}
  - {name: e, stream: enriched, kind: epoch, field: epoch, mechanism: punctuations}
stages:
  - {name: enrich, input: events, output: enriched}
acker:
  name: acker-2
  heartbeat_ms: 100
  standby_timeout_ms: 1000
"""


@pytest.fixture
def loaded(tmp_path: Path) -> Config:
    (tmp_path / "avro").mkdir()
    (tmp_path / "avro" / "event.avsc").write_text(json.dumps(SCHEMA))
    path = tmp_path / "substreams.yaml"
    path.write_text(textwrap.dedent(YAML))
    return load_config(path)


@pytest.mark.parametrize("round_trip", ROUND_TRIPS)
def test_a_loaded_config_round_trips_without_its_files(
    loaded: Config, round_trip: Any, tmp_path: Path
) -> None:
    blob = cloudpickle.dumps(loaded)
    # The files it came from are gone (an executor on another host): nothing is re-read.
    shutil.rmtree(tmp_path / "avro")
    (tmp_path / "substreams.yaml").unlink()
    copy: Config = round_trip(loaded)
    assert copy == loaded
    assert pickle.loads(blob) == loaded
    assert copy.topics() == loaded.topics()
    assert copy.stream("events").schema == loaded.stream("events").schema
    assert copy.substream("s").gap_ms == 500
    assert isinstance(copy.kafka.client, MappingProxyType)
    assert dict(copy.kafka.client) == {
        "compression.type": "lz4",
        "linger.ms": 5,
        "enable.idempotence": True,
        "x": 0.5,
    }
    with pytest.raises(TypeError):
        copy.kafka.client["linger.ms"] = 1  # type: ignore[index]


def test_kafka_client_settings_are_a_private_read_only_copy() -> None:
    settings_ = {"linger.ms": 5}
    kafka = KafkaConfig(client=settings_)
    settings_["linger.ms"] = 50
    assert dict(kafka.client) == {"linger.ms": 5}
    assert kafka == KafkaConfig(client=MappingProxyType({"linger.ms": 5}))


# ------------------------------------------------------------------ property: any config

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)
_client_values = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
)
_kafka = st.builds(
    KafkaConfig,
    bootstrap=st.one_of(st.just("embedded"), st.just("127.0.0.1:9092")),
    replication_factor=st.one_of(st.none(), st.integers(1, 3)),
    client=st.dictionaries(st.text(min_size=1, max_size=12), _client_values, max_size=4),
    min_insync_replicas=st.one_of(st.none(), st.integers(1, 3)),
    data_retention_ms=st.one_of(st.just(-1), st.integers(60_000, 10**12)),
)
_streams = st.builds(
    StreamConfig,
    name=_names,
    schema_path=st.builds(lambda n: Path("/configs/avro") / f"{n}.avsc", _names),
    schema=st.just(SCHEMA),
    partitions=st.integers(1, 64),
    order_key=st.sampled_from(["ts", "epoch"]),
    retention_ms=st.one_of(st.none(), st.just(-1), st.integers(60_000, 10**9)),
)
_substreams = st.builds(
    SubstreamConfig,
    name=_names,
    stream=_names,
    kind=st.sampled_from(["epoch", "tumbling", "session", "per_key"]),
    field=st.one_of(st.none(), st.just("ts")),
    size_ms=st.one_of(st.none(), st.integers(1, 10**6)),
    key=st.one_of(st.none(), st.just("user")),
    gap_ms=st.one_of(st.none(), st.integers(1, 10**6)),
    mechanism=st.sampled_from(["acker", "punctuations"]),
    bound=st.sampled_from(["firm", "soft"]),
    ordered=st.booleans(),
)
_configs = st.builds(
    Config,
    path=st.builds(lambda n: Path("/configs") / f"{n}.yaml", _names),
    kafka=_kafka,
    streams=st.lists(_streams, min_size=1, max_size=3).map(tuple),
    substreams=st.lists(_substreams, max_size=3).map(tuple),
    stages=st.lists(st.builds(StageConfig, _names, _names, _names), max_size=2).map(tuple),
    acker=st.builds(
        AckerConfig,
        name=_names,
        heartbeat_ms=st.integers(1, 1000),
        snapshot_every=st.integers(1, 1000),
    ),
)


@settings(max_examples=60, deadline=None)
@given(config=_configs)
def test_any_config_is_equal_after_pickle_and_cloudpickle(config: Config) -> None:
    for blob in (pickle.dumps(config), cloudpickle.dumps(config)):
        copy = pickle.loads(blob)
        assert copy == config
        assert copy.topics() == config.topics()
        assert isinstance(copy.kafka.client, MappingProxyType)
