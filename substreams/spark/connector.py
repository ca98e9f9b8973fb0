"""Spark's own Kafka connector (``format("kafka")``) for jobs and for baselines.

Why it is here although substreams has its own source: a user who does not want firm bounds
reads a data topic with Spark's connector and ``withWatermark`` -- the baseline that
``substreams bench spark`` compares against -- and a job may mix both.  The connector is a
JVM package that PySpark does not ship: ``spark.jars.packages`` names it and Spark resolves
it with Ivy when the JVM starts, looking in ``~/.m2`` first.  :func:`ensure_kafka_connector`
fetches it there with Maven once, so Ivy finds it offline afterwards.

Why one version: the connector and ``spark-avro`` are JVM code compiled against one Spark
release, so they are asked for at exactly ``pyspark.__version__``.  ``pyproject.toml`` pins
PySpark to the newest release whose ``spark-sql-kafka-0-10_2.13`` and ``spark-avro_2.13``
Maven Central serves (4.2.0: 4.2.1 and 4.3.0 were on PyPI but not on Maven Central when this
was written), so nothing runs a connector of another Spark version.

Records on a data topic are substreams envelopes (schemaless Avro, the writer schema's
fingerprint in the ``ss.fp`` header, punctuations marked ``ss.type: punct``):
:func:`decode_envelopes` turns the connector's ``value``/``headers`` rows into the stream's
payload columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyspark

from substreams import jvm
from substreams.config import StreamConfig
from substreams.spark.schema import PayloadLayout

_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
_AVRO_ARTIFACT = "org.apache.spark:spark-avro_2.13"
KAFKA_CONNECTOR = f"{_ARTIFACT}:{pyspark.__version__}"
"""Spark's Kafka connector, at the installed PySpark's version."""
AVRO_PACKAGE = f"{_AVRO_ARTIFACT}:{pyspark.__version__}"
"""``spark-avro`` (``from_avro``), at the installed PySpark's version."""
PACKAGES = "spark.jars.packages"

ENVELOPE_COLUMNS = ("order_key", "partition", "offset")
"""Columns :func:`decode_envelopes` adds after the payload's (the envelope's order key and
the record's Kafka partition and offset)."""


def ensure_kafka_connector(progress: jvm.Progress = jvm.stderr_progress) -> str:
    """Fetch the connector and its dependencies into ``~/.m2`` (once) and return its
    coordinates (``group:artifact:version``) for ``spark.jars.packages`` / ``--packages``.

    Raises :class:`BrokerError` (with the fix) when Maven is missing or cannot fetch it."""
    jvm.fetch_artifact(KAFKA_CONNECTOR, progress)
    return KAFKA_CONNECTOR


def ensure_jvm_packages(progress: jvm.Progress = jvm.stderr_progress) -> list[str]:
    """The packages of the JVM read path (:mod:`substreams.spark.jvm_read`): Spark's Kafka
    connector and ``spark-avro``, fetched into ``~/.m2`` once."""
    jvm.fetch_artifact(AVRO_PACKAGE, progress)
    return [ensure_kafka_connector(progress), AVRO_PACKAGE]


def merge_packages(existing: str | None, *coords: str) -> str:
    """A ``spark.jars.packages`` value: ``existing`` (comma-separated) plus ``coords``, each
    package once.  Another version of the same ``group:artifact`` already there is
    replaced: Ivy would put both on the classpath."""
    items = [p.strip() for p in (existing or "").split(",") if p.strip()]
    for c in coords:
        ga = c.rsplit(":", 1)[0]
        items = [p for p in items if p.rsplit(":", 1)[0] != ga]
        items.append(c)
    return ",".join(items)


def kafka_connector_conf(
    existing: str | None = None, progress: jvm.Progress = jvm.stderr_progress
) -> dict[str, str]:
    """``{"spark.jars.packages": ...}`` with the connector and ``spark-avro`` merged into
    ``existing``: the keyword settings for :func:`substreams.spark.session.session`
    (``**conf``); what the JVM read path needs."""
    return {PACKAGES: merge_packages(existing, *ensure_jvm_packages(progress))}


def add_kafka_connector(builder: Any, progress: jvm.Progress = jvm.stderr_progress) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with the connector (and ``spark-avro``) added to its
    ``spark.jars.packages``, keeping the packages it already names.

    Effective only before the first JVM of the process starts (the first ``getOrCreate()``):
    Ivy resolves packages when the JVM is launched, a running JVM ignores the setting."""
    options: Mapping[str, Any] = getattr(builder, "_options", {})
    existing = options.get(PACKAGES)
    conf = kafka_connector_conf(None if existing is None else str(existing), progress)
    return builder.config(PACKAGES, conf[PACKAGES])


def _header(name: str) -> Any:
    """The value (binary) of the first Kafka header ``name`` of a row, or null."""
    from pyspark.sql import functions as F

    matching = F.filter("headers", lambda h: h["key"] == F.lit(name))
    # try_element_at: null on an empty array (element_at raises under ANSI mode).
    return F.try_element_at(matching, F.lit(1))["value"]


def decode_envelopes(kafka: Any, stream: StreamConfig) -> Any:
    """The stream's payload columns (typed as the ``substreams`` source types them) plus
    :data:`ENVELOPE_COLUMNS`, from a ``format("kafka")`` DataFrame of the stream's topic
    read with ``includeHeaders=true``.  Punctuation records are dropped; a record written
    with another schema fails the query (``SchemaMismatchError``), as every substreams
    reader does.  Works on batch and streaming DataFrames.

    Why ``mapInPandas`` with the project's :class:`~substreams.streams.schemas.Codec` and
    not ``from_avro``: ``from_avro`` needs a second JVM package (spark-avro), would decode
    without checking the writer fingerprint (garbage instead of an error on a schema
    change) and could not tell punctuations from data; the Codec is the decoder every
    other substreams reader uses, and Arrow batches keep the Python cost per batch, not
    per row, of the JVM-Python hand-over."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    layout = PayloadLayout(stream)
    schema = StructType(
        [
            *(StructField(n, t, True) for n, t in zip(layout.names, layout.types, strict=True)),
            StructField("order_key", LongType(), False),
            StructField("partition", IntegerType(), False),
            StructField("offset", LongType(), False),
        ]
    )
    framed = kafka.select(
        "value",
        "partition",
        "offset",
        _header("ss.fp").alias("fp"),
        _header("ss.type").alias("kind"),
    )
    return framed.mapInPandas(
        _decoder(stream.name, dict(stream.schema), layout, schema.fieldNames()), schema
    )


def _decoder(
    name: str, payload_schema: dict[str, Any], layout: PayloadLayout, columns: list[str]
) -> Any:
    """The ``mapInPandas`` function (plain data in its closure: it is pickled to workers)."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        from substreams.streams.schemas import TYPE_PUNCTUATION, Codec, envelope_schema

        codec = Codec(envelope_schema(payload_schema), label=f"stream '{name}'")
        for batch in batches:
            rows: list[list[Any]] = []
            for value, fp, kind, partition, offset in zip(
                batch["value"],
                batch["fp"],
                batch["kind"],
                batch["partition"],
                batch["offset"],
                strict=True,
            ):
                if kind is not None and bytes(kind) == TYPE_PUNCTUATION:
                    continue
                rec = codec.decode(bytes(value), b"<none>" if fp is None else bytes(fp))
                rows.append(
                    [*layout.values(rec["payload"]), rec["order_key"], int(partition), int(offset)]
                )
            yield pd.DataFrame(rows, columns=columns)

    return decode
