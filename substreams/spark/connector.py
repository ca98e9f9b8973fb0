"""Spark's own Kafka connector (``format("kafka")``) for jobs and for baselines.

Why it is here although substreams has its own source: a user who does not want firm bounds
reads a data topic with Spark's connector and ``withWatermark`` -- the baseline that
``substreams bench spark`` compares against -- and a job may mix both.  The connector is a
JVM package that PySpark does not ship: ``spark.jars.packages`` names it and Spark resolves
it with Ivy when the JVM starts, looking in ``~/.m2`` first.  :func:`ensure_kafka_connector`
fetches it there with Maven once, so Ivy finds it offline afterwards.

Why a jar cache on top: Ivy resolves ``spark.jars.packages`` again at every JVM start
(seconds each, every ``substreams run``/``submit`` job pays it) and two JVMs resolving at
once race on Ivy's cache.  :func:`resolved_jars` lets Spark's own Ivy resolve the packages
once per machine, copies the jars it chose into ``cache_home()/spark-jars/`` (keyed by the
coordinates) and later starts name them in ``spark.jars`` (``--jars``) instead: the jars
Spark would have resolved, so no second version of anything lands on the classpath.  A
user's own ``spark.jars.packages`` keeps the old way (everything resolved together by Ivy),
so one resolution picks the versions of the dependencies both share.

Why one version: the connector and ``spark-avro`` are JVM code compiled against one Spark
release, so they are asked for at exactly ``pyspark.__version__``.  ``pyproject.toml`` pins
PySpark to the newest release whose ``spark-sql-kafka-0-10_2.13`` and ``spark-avro_2.13``
Maven Central serves (4.2.0: 4.2.1 and 4.3.0 were on PyPI but not on Maven Central when this
was written), so nothing runs a connector of another Spark version.

Records on a data topic are substreams envelopes (Avro single-object encoding: the writer
schema's fingerprint before the body; a punctuation is a record with the punctuation
schema's fingerprint): :func:`decode_envelopes` turns the connector's ``value`` rows into
the stream's payload columns.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyspark

from substreams import jvm
from substreams.config import Config, StreamConfig
from substreams.errors import SubstreamsError
from substreams.kafka import client
from substreams.spark.schema import PayloadLayout

_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
_AVRO_ARTIFACT = "org.apache.spark:spark-avro_2.13"
KAFKA_CONNECTOR = f"{_ARTIFACT}:{pyspark.__version__}"
"""Spark's Kafka connector, at the installed PySpark's version."""
AVRO_PACKAGE = f"{_AVRO_ARTIFACT}:{pyspark.__version__}"
"""``spark-avro`` (``from_avro``), at the installed PySpark's version."""
PACKAGES = "spark.jars.packages"
JARS = "spark.jars"
JVM_PACKAGES = (KAFKA_CONNECTOR, AVRO_PACKAGE)
"""What the JVM read path needs on the classpath."""
MANIFEST = "jars.txt"
"""In a cached jar folder: the jar file names, in Ivy's order, written last."""

log = logging.getLogger(__name__)

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


def merge_jars(existing: str | None, jars: Sequence[str]) -> str:
    """A ``spark.jars`` value: ``existing`` (comma-separated) plus ``jars``, each once."""
    items = [j.strip() for j in (existing or "").split(",") if j.strip()]
    return ",".join([*items, *(j for j in jars if j not in items)])


def kafka_connector_conf(
    existing: str | None = None,
    progress: jvm.Progress = jvm.stderr_progress,
    jars: str | None = None,
) -> dict[str, str]:
    """The settings that put the connector and ``spark-avro`` on a new JVM's classpath: the
    keyword settings for :func:`substreams.spark.session.session` (``**conf``); what the JVM
    read path needs.

    ``existing`` is the caller's ``spark.jars.packages`` and ``jars`` its ``spark.jars``.
    Without packages of the caller's: ``{"spark.jars": ...}``, the cached jars of
    :func:`resolved_jars` added to ``jars`` (no Ivy at start).  With them, or when the cache
    cannot be built: ``{"spark.jars.packages": ...}`` with ours merged into ``existing``."""
    if not (existing or "").strip():
        try:
            return {JARS: merge_jars(jars, resolved_jars(progress))}
        except SubstreamsError as exc:
            progress(f"no cached Spark jars ({exc}); Spark resolves the packages at start")
    return {PACKAGES: merge_packages(existing, *ensure_jvm_packages(progress))}


def resolved_jars(progress: jvm.Progress = jvm.stderr_progress) -> list[str]:
    """Local paths of the jars of :data:`JVM_PACKAGES` for ``spark.jars``: resolved by Spark's
    own Ivy once per machine and copied into ``cache_home()/spark-jars/<version>-<digest>``
    (the digest of the coordinates).

    Invariants: the folder is complete or absent (built in a temporary sibling, renamed into
    place after its manifest is written); one process resolves at a time (a lock file), so
    Ivy's cache never sees two resolutions of ours at once; a folder missing a listed jar is
    resolved again.  Jars PySpark already ships at the same version (Hadoop's client, lz4,
    ...) are left out: the same classes are on the classpath already.

    Raises :class:`SubstreamsError` when Spark cannot resolve the packages."""
    digest = hashlib.sha256(",".join(sorted(JVM_PACKAGES)).encode()).hexdigest()[:12]
    name = f"{pyspark.__version__}-{digest}"  # keyed by the coordinates
    dest = jvm.cache_home() / "spark-jars" / name
    cached = _cached_jars(dest)
    if cached is not None:
        return cached
    with jvm.file_lock(dest.parent / f".{name}.lock"):
        cached = _cached_jars(dest)  # another process may have built it while we waited
        if cached is not None:
            return cached
        ensure_jvm_packages(progress)  # in ~/.m2 first: Ivy resolves offline from there
        progress(f"resolving {', '.join(JVM_PACKAGES)} with Spark's Ivy (once; cached in {dest})")
        shipped = {p.name for p in _spark_jars_dir().glob("*.jar")}
        # Ivy names a jar <organisation>_<artifact>-<version>.jar; PySpark <artifact>-<version>.jar.
        keep = [j for j in _ivy_resolve(JVM_PACKAGES) if j.name.split("_", 1)[-1] not in shipped]
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{name}-") as tmp:
            work = Path(tmp) / "jars"
            work.mkdir()
            for jar in keep:
                shutil.copyfile(jar, work / jar.name)
            (work / MANIFEST).write_text("".join(f"{j.name}\n" for j in keep))
            if dest.exists():
                shutil.rmtree(dest)
            work.rename(dest)
    progress(f"cached {len(keep)} Spark jars in {dest}")
    return [str(dest / j.name) for j in keep]


def _cached_jars(folder: Path) -> list[str] | None:
    """The jar paths a complete cache folder lists, or None (absent, or a jar is missing)."""
    try:
        names = (folder / MANIFEST).read_text().split()
    except OSError:
        return None
    paths = [folder / n for n in names]
    if not names or not all(p.is_file() for p in paths):
        log.warning("cached Spark jars in %s are incomplete; resolving them again", folder)
        return None
    return [str(p) for p in paths]


def _spark_jars_dir() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "jars"


def _ivy_resolve(packages: Sequence[str]) -> list[Path]:
    """The jars Spark's Ivy resolves for ``packages``: what ``spark-submit --packages`` puts
    in ``spark.jars``, read from a Py4J gateway JVM (no SparkContext is started)."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launch_gateway would join that JVM instead
        raise SubstreamsError("a Spark JVM is already running in this process")
    conf = SparkConf(loadDefaults=False).set(PACKAGES, ",".join(packages))
    with tempfile.TemporaryFile() as out:
        try:
            gateway = launch_gateway(  # type: ignore[no-untyped-call]
                conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT}
            )
        except Exception as exc:
            out.seek(0)
            tail = out.read().decode(errors="replace").strip().splitlines()[-15:]
            raise SubstreamsError(
                "Spark could not resolve " + ", ".join(packages) + ":\n" + "\n".join(tail)
            ) from exc
        try:
            value = str(gateway.jvm.System.getProperty(JARS) or "")
        finally:
            gateway.shutdown()
            proc = gateway.proc
            proc.stdin.close()  # the gateway JVM exits when its stdin closes
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    jars = [Path(unquote(urlparse(u).path)) for u in value.split(",") if u.strip()]
    if not jars or not all(j.is_file() for j in jars):
        raise SubstreamsError(f"Spark resolved {', '.join(packages)} to {value!r}")
    return jars


def decode_envelopes(kafka: Any, stream: StreamConfig, config: Config | None = None) -> Any:
    """The stream's payload columns (typed as the ``substreams`` source types them) plus
    ``order_key``, ``partition`` and ``offset`` (the envelope's order key, the record's Kafka
    partition and offset), from a ``format("kafka")`` DataFrame of the stream's topic.
    Punctuation records are dropped.  With ``config`` (the deployment ``stream`` is of), a
    record written with an earlier schema of the stream is decoded into ``stream``'s shape,
    its writer schema looked up in the schema topic as a listener does
    (:class:`~substreams.streams.listener.StreamDecoder`); without, only ``stream``'s own
    schema decodes.  A record no schema decodes (an unknown fingerprint, no single-object
    prefix, a truncated body) follows the stream's ``on_bad_record`` with ``config``, as
    every substreams reader does (dead-lettered from the task and left out, or a
    ``BadRecordError`` naming topic, partition and offset); without a config (no
    dead-letter topic known) it fails the query (``SchemaMismatchError``).
    Works on batch and streaming DataFrames.

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
    framed = kafka.select("value", "partition", "offset")
    bootstrap = None if config is None else client.resolve_bootstrap(config)
    return framed.mapInPandas(
        _decoder(stream.name, dict(stream.schema), layout, schema.fieldNames(), config,
                 bootstrap),
        schema,
    )


def _decoder(
    name: str, payload_schema: dict[str, Any], layout: PayloadLayout, columns: list[str],
    config: Config | None, bootstrap: str | None,
) -> Any:
    """The ``mapInPandas`` function (plain data and the picklable config in its closure: it
    is pickled to workers)."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        from substreams.errors import DecodeError
        from substreams.streams.badrecords import BadRecords
        from substreams.streams.listener import StreamDecoder
        from substreams.streams.schemas import Codec, envelope_schema, is_punctuation

        codec = (
            Codec(envelope_schema(payload_schema), label=f"stream '{name}'") if config is None
            else StreamDecoder(config, name, bootstrap).codec
        )
        bad = None if config is None else BadRecords(config, f"spark.decode:{name}",
                                                     bootstrap=bootstrap)
        try:
            for batch in batches:
                rows: list[list[Any]] = []
                for value, partition, offset in zip(
                    batch["value"], batch["partition"], batch["offset"], strict=True
                ):
                    data = bytes(value) if value is not None else b""
                    if is_punctuation(data):
                        continue
                    try:
                        rec = codec.decode_single(data)
                    except DecodeError as exc:
                        if bad is None:
                            raise
                        bad.bad(name, int(partition), int(offset), data, exc)
                        continue
                    rows.append([*layout.values(rec["payload"]), rec["order_key"],
                                 int(partition), int(offset)])
                yield pd.DataFrame(rows, columns=columns)
        finally:
            if bad is not None:
                bad.close()  # the task's letters delivered before it ends

    return decode
