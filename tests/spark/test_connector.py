"""Spark's own Kafka connector (``format("kafka")``) on the session broker: it reads a data
topic written by a substreams Publisher, and ``decode_envelopes`` turns its rows into the
stream's payload columns -- punctuations dropped, aborted transactions invisible under
``read_committed`` -- in a batch read and in a streaming query.

The session-scoped SparkSession (tests/spark/conftest.py) is built with the connector's
cached jars in ``spark.jars``; without them ``format("kafka")`` fails with "Failed to find
data source: kafka"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession

from substreams.app import Application
from substreams.config import Config
from substreams.spark import connector
from substreams.spark.connector import (
    AVRO_PACKAGE,
    JARS,
    KAFKA_CONNECTOR,
    PACKAGES,
    decode_envelopes,
    kafka_connector_conf,
    merge_jars,
    merge_packages,
    resolved_jars,
)
from tests.conftest import ConfigFactory
from tests.spark.conftest import window_clicks

pytestmark = pytest.mark.spark

Key = tuple[str, str, int, int]


def test_merge_packages_keeps_others_and_replaces_another_version() -> None:
    c = "org.apache.spark:spark-sql-kafka-0-10_2.13:9.9.9"
    assert merge_packages(None, c) == c
    assert merge_packages("", c) == c
    assert merge_packages("a:b:1, c:d:2", c) == f"a:b:1,c:d:2,{c}"
    assert merge_packages(f"a:b:1,{c}", c) == f"a:b:1,{c}"
    assert merge_packages("org.apache.spark:spark-sql-kafka-0-10_2.13:1.0,a:b:1", c) == (
        f"a:b:1,{c}"
    )


def test_with_packages_of_the_callers_ours_are_merged_into_them() -> None:
    notes: list[str] = []
    conf = kafka_connector_conf("a:b:1", notes.append)
    assert conf[PACKAGES].split(",") == ["a:b:1", KAFKA_CONNECTOR, AVRO_PACKAGE]
    assert notes == []  # no version-mismatch warning: connector and PySpark are one version


def test_without_packages_of_the_callers_the_cached_jars_go_to_spark_jars() -> None:
    conf = kafka_connector_conf(None, [].append, jars="/mine.jar")
    assert PACKAGES not in conf
    jars = conf[JARS].split(",")
    assert jars[0] == "/mine.jar" and jars[1:] == resolved_jars()
    names = [Path(j).name for j in jars[1:]]
    assert "org.apache.spark_spark-sql-kafka-0-10_2.13-" + pyspark.__version__ + ".jar" in names
    assert not any("hadoop-client" in n for n in names)  # PySpark ships it at that version
    assert merge_jars(",".join(jars), jars[1:]) == ",".join(jars)


def test_the_jar_cache_is_built_once_and_rebuilt_when_a_jar_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ivy = tmp_path / "ivy"
    ivy.mkdir()
    spark_jars = tmp_path / "spark"
    spark_jars.mkdir()
    for name in ("org.a_a-1.jar", "org.b_b-2.jar", "org.c_c-3.jar"):
        (ivy / name).write_bytes(name.encode())
    (spark_jars / "c-3.jar").write_bytes(b"shipped")
    resolutions: list[int] = []

    def ivy_resolve(packages: Any) -> list[Path]:
        resolutions.append(1)
        return sorted(ivy.iterdir())

    monkeypatch.setenv("SUBSTREAMS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(connector, "_ivy_resolve", ivy_resolve)
    monkeypatch.setattr(connector, "_spark_jars_dir", lambda: spark_jars)
    monkeypatch.setattr(connector, "ensure_jvm_packages", lambda progress: [])
    first = resolved_jars([].append)
    assert [Path(j).name for j in first] == ["org.a_a-1.jar", "org.b_b-2.jar"]
    assert all(Path(j).parent.parent == tmp_path / "cache" / "spark-jars" for j in first)
    assert resolved_jars([].append) == first and len(resolutions) == 1
    Path(first[1]).unlink()
    assert resolved_jars([].append) == first and len(resolutions) == 2
    assert Path(first[1]).read_bytes() == b"org.b_b-2.jar"


def test_connectors_are_at_the_installed_pyspark_version() -> None:
    assert KAFKA_CONNECTOR.endswith(f":{pyspark.__version__}")
    assert AVRO_PACKAGE.endswith(f":{pyspark.__version__}")


def _publish(config: Config) -> tuple[list[Key], int]:
    """Sealed windows (punctuation records on the data topic between them), then an aborted
    transaction of another source.  Returns the committed records and the aborted count."""
    w, stream = config.substreams[0].name, config.streams[0].name
    sent: list[Key] = []
    with Application(config).publisher(stream, "src") as pub:
        for window, n in [(0, 5), (1, 3), (2, 4)]:
            for c in window_clicks(window, n):
                rec = pub.publish(c, key=str(c["user"]))
                sent.append((str(c["user"]), str(c["url"]), int(c["ts"]), rec.partition))
            pub.seal(w, window)
    ghost = Application(config).publisher(stream, "ghost")
    aborted = window_clicks(3, 6)
    for c in aborted:
        ghost.publish(c, key=str(c["user"]))
    ghost._producer.flush(10)  # on the topic, uncommitted
    ghost.abort()
    return sent, len(aborted)


def _keys(rows: list[Any]) -> list[Key]:
    return sorted((r["user"], r["url"], r["ts"], r["partition"]) for r in rows)


def test_official_connector_reads_a_publisher_topic(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [
            {
                "name": "w",
                "stream": "clicks",
                "kind": "tumbling",
                "size_ms": 1000,
                "mechanism": "punctuations",
            }
        ],
    )
    stream = config.stream(config.streams[0].name)
    sent, aborted = _publish(config)

    def reader(isolation: str) -> Any:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka.bootstrap)
            .option("subscribe", stream.name)
            .option("kafka.isolation.level", isolation)
            .load()
        )

    raw = reader("read_committed").collect()
    # 12 records and at least one punctuation per partition and seal (the exact count is the
    # punctuation mechanism's business)
    assert len(raw) >= len(sent) + 3 * stream.partitions

    rows = decode_envelopes(reader("read_committed"), stream).collect()
    assert _keys(rows) == sorted(sent)
    assert sorted(r["order_key"] for r in rows) == sorted(k[2] for k in sent)  # order key: ts
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows)
    # the aborted records are on the topic: read_uncommitted sees them, read_committed not
    assert len(decode_envelopes(reader("read_uncommitted"), stream).collect()) == (
        len(sent) + aborted
    )

    # the same through a streaming query (the path the watermark baseline takes)
    batches: list[list[Any]] = []
    query = (
        decode_envelopes(
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka.bootstrap)
            .option("subscribe", stream.name)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .load(),
            stream,
        )
        .writeStream.foreachBatch(lambda df, _bid: batches.append(df.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert _keys([r for b in batches for r in b]) == sorted(sent)


def test_records_of_an_earlier_schema_are_decoded_into_the_new_shape(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    """Schema evolution: records written with v1 and with v2 of the stream's schema, read
    by a v2 reader through the connector, as a listener reads them."""
    import json

    from tests.integration.test_schema_evolution import V1, V2, with_schema

    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    v1 = make_config([{"name": "clicks", "partitions": 1, "schema": "v1.avsc"}])
    name = v1.streams[0].name
    with Application(v1).publisher(name, "old") as pub:
        for ts in range(3):
            pub.publish({"user": "u", "url": f"/{ts}", "ts": ts, "agent": f"a{ts}"})
    v2 = with_schema(v1, V2, "v2")
    with Application(v2).publisher(name, "new") as pub:  # registers v2
        for ts in range(3, 5):
            pub.publish({"user": "u", "url": f"/{ts}", "ts": ts, "ref": f"r{ts}"})
    kafka = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", v2.kafka.bootstrap)
        .option("subscribe", name)
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    rows = decode_envelopes(kafka, v2.stream(name), v2).collect()
    assert sorted((r["ts"], r["url"], r["ref"]) for r in rows) == [
        (0, "/0", "-"), (1, "/1", "-"), (2, "/2", "-"), (3, "/3", "r3"), (4, "/4", "r4"),
    ]
    # without the deployment, only the reader's own schema decodes: the v1 records fail
    with pytest.raises(Exception, match="UnknownSchemaError"):
        decode_envelopes(kafka, v2.stream(name)).collect()
