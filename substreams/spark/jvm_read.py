"""The JVM read path: a batch's completed epochs read by Spark's own Kafka source and decoded
by ``from_avro``, so no record passes through a Python worker on its way in.

The ``substreams`` source (option ``read=notes``) still follows the control topic on the
driver and puts each batch's notifications -- with their data ranges -- in Spark's offset
log, so a replayed batch names the same epochs; only the records' read moves here:

* Spark's Kafka batch read -- what ``spark.read.format("kafka")`` does with ``assign`` /
  ``startingOffsets`` / ``endingOffsets`` (per-partition JSON, end exclusive), but with its
  ``KafkaSourceRDD`` built directly (:func:`direct_frame`: no per-call offset resolution or
  nested query on the driver) -- over the hull of the batch's ranges,
  ``kafka.isolation.level=read_committed`` (aborted records and markers skipped) and a
  stable ``kafka.group.id`` (Spark pools executor consumers by group id and partition: a
  fresh id per batch would open new consumers every batch);
* record values are Avro single-object encoded (:mod:`substreams.streams.schemas`): the
  first 10 bytes (``substring(value, 1, 10)``, Spark's ``substring`` of a BINARY counts
  bytes from 1) are the marker and the writer fingerprint.  Punctuation records (the
  punctuation schema's prefix) are dropped; each record's body (``substring(value, 11,
  ...)``) is decoded with ``from_avro`` using the writer schema its prefix names (every
  schema the stream registered, :mod:`substreams.streams.evolution`) and the config's
  schema as the reader schema (``avroSchema`` option: Avro resolution, so schema
  evolution keeps working).  A record that does not decode -- no single-object prefix
  (``foreign_bytes``), a fingerprint no registered schema has (``unknown_schema``), a body
  ``from_avro`` cannot read (``undecodable``: its ``PERMISSIVE`` mode's struct of nulls)
  -- is kept
  out of every epoch and carried in the ``_bad`` (reason) and ``_raw`` (bytes) columns to
  the task, which dead-letters it or, under the stream's ``on_bad_record: fail``, fails
  the batch naming its partition and offset (:func:`bad_rows`).  Headers are not read;
* a record belongs to the notification whose time its envelope's ``times[substream]``
  equals (a session's or a window's: between its ``time`` and ``until``).  A one-unit
  batch of ``run`` finds it in its unit task (:func:`placed_table`: the plan has no notes
  in it); otherwise (``run_frames``, a shuffled batch) a literal lookup built on the
  driver from the batch's few notifications finds it (a broadcast join for a backlog's
  many), which also gives every record its epoch's columns.

The result has the ``substreams`` source's columns (payload, then
:data:`~substreams.spark.schema.META_FIELDS`); :func:`epoch_rows` adds the notification rows.

Where the JVM cannot serve (the Python read path stays, :func:`jvm_unsupported`): soft mode
(records before their epoch is complete, with data offsets in the offset log); a payload with
nested or multi-branch fields (the Python source gives them as JSON text, ``from_avro`` as
structs: the same job would see other values); a config with ``kafka.client`` settings
other than the security ones (librdkafka properties the Java client does not take by the same
names).  ``kafka.security`` and the librdkafka security keys of ``kafka.client`` are mapped
onto the Java client's (:func:`security_options`), so a secured cluster is read in the JVM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from substreams.config import Config
from substreams.control.messages import OffsetRange
from substreams.kafka import security
from substreams.spark.schema import PayloadLayout
from substreams.streams.schemas import (
    PREFIX_BYTES,
    SINGLE_OBJECT_MARKER,
    UNTRACKED_HINT,
    envelope_schema,
    expanded,
    protocol_prefixes,
)

FETCH_MAX_WAIT_MS = 10
"""The executor consumers' ``fetch.max.wait.ms`` (see :func:`kafka_options`)."""

NOTE_META = (
    "epoch", "epoch_label", "epoch_int", "epoch_key", "control_offset", "control_index",
    "sealed_at_ms",
)
"""A notification's columns that every record of its epoch carries."""


def jvm_unsupported(config: Config, stream: str) -> str | None:
    """Why the JVM path cannot read ``stream`` of ``config`` (None when it can)."""
    layout = PayloadLayout(config.stream(stream))
    nested = [n for n, j in zip(layout.names, layout.as_json, strict=True) if j]
    if nested:
        return f"stream '{stream}' has nested or multi-branch fields {nested} (JSON text)"
    unmapped = security.unmapped_client_keys(config.kafka.client)
    if unmapped:
        return f"the config sets kafka.client {unmapped} (librdkafka properties)"
    return None


def security_options(config: Config) -> dict[str, str]:
    """The Java client's security options of ``config`` (``kafka.security``, else the
    security keys of ``kafka.client``) for Spark's Kafka source."""
    if config.kafka.security is not None:
        return security.java_options(config.kafka.security)
    return security.java_client_options(config.kafka.client)


def kafka_options(
    bootstrap: str, topic: str, ranges: Sequence[OffsetRange], group_id: str,
    secured: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The Kafka source's options for one batch read of ``ranges`` of ``topic``: per
    partition, from the lowest start to the highest end (records of other epochs in
    between are dropped by the join with the notifications, as the Python read drops
    them)."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for r in ranges:
        if r.stream == topic and r.end > r.start:
            lo[r.partition] = min(lo.get(r.partition, r.start), r.start)
            hi[r.partition] = max(hi.get(r.partition, r.end), r.end)
    parts = sorted(lo)
    return {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({topic: parts}),
        "startingOffsets": json.dumps({topic: {str(p): lo[p] for p in parts}}),
        "endingOffsets": json.dumps({topic: {str(p): hi[p] for p in parts}}),
        "kafka.isolation.level": "read_committed",
        "kafka.group.id": group_id,
        # A range is exact: a missing offset (retention) must fail, not silently shrink.
        "failOnDataLoss": "true",
        # Spark's executor consumer asks the broker for the partition's earliest and latest
        # offsets after every poll (KafkaDataConsumer.fetch -> getAvailableOffsetRange).  The
        # poll has already sent the next fetch, which at the log's end the broker parks for
        # fetch.max.wait.ms (Kafka's default: 500 ms), and a broker answers one connection's
        # requests in order: the offsets request waited behind it, up to 500 ms per task
        # (the JVM read's per-call floor; substreams_bench.spark_read_floor).
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
        **(secured or {}),  # :func:`security_options`
    }


POLL_TIMEOUT_MS = 120_000
"""The executor consumer's poll timeout (Spark's default: ``spark.network.timeout``)."""


def direct_frame(spark: Any, options: Mapping[str, str]) -> Any:
    """What ``spark.read.format("kafka").options(**options).load()`` reads (the
    :func:`kafka_options` of a batch), as a DataFrame over Spark's own ``KafkaSourceRDD``
    (the same executor consumers, pool and record-to-row converter) built here instead of
    by the Kafka relation.

    Why: the relation resolves offsets on the driver per call -- an ``AdminClient`` made,
    asked for the partitions and closed -- and hands its scan over as an ``RDD[Row]``
    (``internalCreateDataFrame(...).rdd``), planned as a query of its own: together most
    of a call's driver time for a 100-record read, though the ranges here are exact and
    already checked against the control record.  The executor side is unchanged, so a
    missing offset still fails the task (``failOnDataLoss``).  The classes are Spark's
    internal ones (``private[kafka010]``, public in bytecode): one Spark version is pinned
    (:mod:`substreams.spark.connector`), and :func:`substreams.spark.session.jvm_read_available`
    checks they load.  What does not change between calls (the consumers' settings, the
    converter, the schema) is made once per session and settings: each py4j call costs a
    round trip."""
    from pyspark.sql import DataFrame

    return DataFrame(direct_jdf(spark, options), spark)


def direct_jdf(spark: Any, options: Mapping[str, str]) -> Any:
    """:func:`direct_frame`'s JVM Dataset.  Every JVM class it names is looked up once per
    session (a class reached through the gateway's package path is a round trip per use)."""
    consts = _DirectConsts.of(spark, options)
    assign = json.loads(options["assign"])
    starts = json.loads(options["startingOffsets"])
    ends = json.loads(options["endingOffsets"])
    ranges = [
        consts.offset_range(consts.partition(topic, int(p)), int(starts[topic][str(p)]),
                            int(ends[topic][str(p)]), consts.none)
        for topic, parts in assign.items() for p in parts
    ]
    # a Python list of Java objects reaches Java as a java.util.List (the gateway's
    # auto-conversion), and PythonUtils.toSeq makes it a Scala Seq
    seq = consts.to_seq(ranges)
    rdd = consts.source_rdd(consts.sc, consts.params, seq, POLL_TIMEOUT_MS,
                            consts.fail_on_data_loss)
    return consts.session.internalCreateDataFrame(
        rdd.map(consts.to_row, consts.tag), consts.schema, False)


@dataclass(frozen=True)
class _DirectConsts:
    """The JVM objects :func:`direct_frame` reuses across calls."""

    jvm: Any
    kafka: Any
    sc: Any
    session: Any
    partition: Any
    offset_range: Any
    source_rdd: Any
    to_seq: Any
    params: Any
    none: Any
    to_row: Any
    tag: Any
    schema: Any
    fail_on_data_loss: bool

    @staticmethod
    def of(spark: Any, options: Mapping[str, str]) -> _DirectConsts:
        settings = {key[len("kafka."):]: v for key, v in options.items()
                    if key.startswith("kafka.")}
        headers = options.get("includeHeaders", "false") == "true"
        fail = options.get("failOnDataLoss", "true") == "true"
        # keyed by the context: a streaming query's batches each get another session wrapper
        key = (id(spark.sparkContext), tuple(sorted(settings.items())), headers, fail)
        cached = _DIRECT.get(key)
        if cached is not None:
            return cached
        jvm = spark.sparkContext._jvm
        k = jvm.org.apache.spark.sql.kafka010
        deser = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
        params = jvm.java.util.HashMap()
        executor: dict[str, str | int] = {
            **settings,
            # what KafkaSourceProvider.kafkaParamsForExecutors sets
            "key.deserializer": deser, "value.deserializer": deser,
            "auto.offset.reset": "none", "enable.auto.commit": "false",
            "receive.buffer.bytes": 65536,  # an Integer, as Spark's
        }
        for name, value in executor.items():
            params.put(name, value)
        conv = k.KafkaRecordToRowConverter()
        made = _DirectConsts(
            jvm=jvm, kafka=k, sc=spark.sparkContext._jsc.sc(),
            session=spark._jsparkSession,
            partition=jvm.org.apache.kafka.common.TopicPartition,
            offset_range=k.KafkaOffsetRange, source_rdd=k.KafkaSourceRDD,
            to_seq=jvm.PythonUtils.toSeq,
            params=params, none=jvm.scala.Option.apply(None),
            to_row=(conv.toInternalRowWithHeaders() if headers
                    else conv.toInternalRowWithoutHeaders()),
            tag=jvm.scala.reflect.ClassTag.apply(
                jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.InternalRow")),
            schema=k.KafkaRecordToRowConverter.kafkaSchema(headers),
            fail_on_data_loss=fail,
        )
        _DIRECT[key] = made
        return made


_DIRECT: dict[tuple[Any, ...], _DirectConsts] = {}


@dataclass(frozen=True)
class Decoding:
    """The stream's reader envelope schema and every writer envelope schema by
    fingerprint (hex), as JSON for ``from_avro``."""

    reader: str
    writers: Mapping[str, str]

    @staticmethod
    def of(config: Config, stream: str, registered: Mapping[str, Mapping[str, Any]]) -> Decoding:
        """``registered``: the stream's payload schemas by fingerprint (the schema topic's);
        the config's own schema is always one of the writers."""
        from substreams.streams.evolution import stream_fingerprint

        own = config.stream(stream).schema
        payloads = {**dict(registered), stream_fingerprint(own): own}
        return Decoding(
            json.dumps(expanded(envelope_schema(own))),
            {fp: json.dumps(expanded(envelope_schema(p))) for fp, p in payloads.items()},
        )


def decoded(kafka: Any, decoding: Decoding, label: str) -> Any:
    """``kafka`` (a ``format("kafka")`` DataFrame) -> its data records as
    ``env`` (the envelope in the reader's shape), ``partition``, ``offset``; punctuations
    dropped, an unknown fingerprint fails the query naming it (the benchmarks' baseline
    decode: the firm read keeps bad records instead, :func:`unplaced_records`)."""
    keep, decode = _decode_columns(decoding, label, strict=True)
    return kafka.where(keep).select(*decode)


REASON_FOREIGN = "foreign_bytes"
REASON_UNKNOWN_SCHEMA = "unknown_schema"
REASON_UNDECODABLE = "undecodable"
"""The dead-letter reasons (:mod:`substreams.streams.deadletter`'s), as the JVM states them."""


def _decode_columns(
    decoding: Decoding, label: str, strict: bool = False
) -> tuple[Any, list[Any]]:
    """:func:`decoded`'s filter and columns; not ``strict``: a record that does not decode
    gets a null ``env`` and its reason in ``_bad``, its bytes in ``_raw``."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    head = F.substring(F.col("value"), 1, PREFIX_BYTES)
    body = F.substring(F.col("value"), PREFIX_BYTES + 1, _TO_THE_END)
    punct = sorted(protocol_prefixes("punctuation"))
    # a null value is not a punctuation: kept, and refused below like any record without
    # a prefix
    keep = F.coalesce(~head.isin(*(_binary(p) for p in punct)), F.lit(True))
    env: Any = None
    known: Any = None
    options = {"avroSchema": decoding.reader, "mode": "FAILFAST" if strict else "PERMISSIVE"}
    for writer_fp, writer in sorted(decoding.writers.items()):
        branch = from_avro(body, writer, options)
        match = head == _binary(SINGLE_OBJECT_MARKER + bytes.fromhex(writer_fp))
        env = F.when(match, branch) if env is None else env.when(match, branch)
        known = match if known is None else known | match
    if strict:
        unknown = F.raise_error(F.concat(
            F.lit(f"{label}: record whose single-object prefix (C3 01 marker, schema "
                  "fingerprint) is "),
            F.coalesce(F.lower(F.hex(head)), F.lit("<none>")),
            F.lit(", which no registered schema of the stream has; refusing to decode it"),
        ))
        return keep, [env.otherwise(unknown).alias("env"), F.col("partition"),
                      F.col("offset")]
    return keep, [env.alias("env"), F.col("partition"), F.col("offset"), F.col("value"),
                  (known if known is not None else F.lit(False)).alias("_known")]


def _bad_columns() -> list[Any]:
    """Over the decode's projection (``env``, ``value``, ``_known``): ``_bad``, null when
    the value decoded, else the reason it did not (the Python decoder's rule), and
    ``_raw``, the bytes of a bad record (null for a good one: nothing else carries them)."""
    from pyspark.sql import functions as F

    value = F.col("value")
    prefixed = (F.length(value) >= PREFIX_BYTES) & (
        F.substring(value, 1, len(SINGLE_OBJECT_MARKER)) == _binary(SINGLE_OBJECT_MARKER))
    bad = (
        F.when(F.coalesce(~prefixed, F.lit(True)), F.lit(REASON_FOREIGN))
        .when(~F.col("_known"), F.lit(REASON_UNKNOWN_SCHEMA))
        # from_avro's PERMISSIVE mode gives a struct of nulls for a body it cannot read;
        # a decoded envelope always has its order key
        .when(F.col("env").isNull() | F.col("env.order_key").isNull(),
              F.lit(REASON_UNDECODABLE))
    )
    return [bad.alias("_bad"), F.when(bad.isNotNull(), value).alias("_raw")]


_TO_THE_END = 2**31 - 1
"""``substring``'s length for "to the end" (its SQL default)."""


def _binary(value: bytes) -> Any:
    """A BINARY literal column."""
    from pyspark.sql import functions as F

    return F.expr(f"X'{value.hex()}'")


def _barrier() -> Any:
    """A column that keeps the optimizer from pushing a filter below the decode.

    Spark pushes a filter through a projection of deterministic expressions by inlining
    them into its condition: a filter on the decoded envelope (``_t`` present, the
    record's epoch found) became a filter calling ``from_avro`` once per reference -- five
    decodes of every record, and five ``from_avro`` instances per task, each parsing its
    schemas and building a Hadoop configuration -- before the projection decoded it once
    more.  A non-deterministic expression in the decode's projection stops the pushdown
    (``PushPredicateThroughNonJoin`` moves a filter only through deterministic ones); the
    partition id is the cheapest one.

    A filter must read the column (:func:`_barrier_kept`): a column nothing above reads is
    pruned from the projection (``ColumnPruning`` drops unread columns whatever their
    determinism), and with it the barrier -- the epoch filter was then pushed below the
    decode again and every record decoded twice (once in the filter, once in the
    projection)."""
    from pyspark.sql import functions as F

    return F.spark_partition_id().alias("_barrier")


def _barrier_kept() -> Any:
    """The filter that keeps :func:`_barrier` in the plan: true for every row (a partition
    id is never negative), and not foldable (it reads a non-deterministic column).  The
    filters above the decode combine with it, over the decoded columns."""
    from pyspark.sql import functions as F

    return F.col("_barrier") >= 0


@dataclass(frozen=True)
class _RecordColumns:
    """The expressions of :func:`records` that do not change between batches of a stream
    (decode, the source's columns), made once per session and writer schemas: a Column is
    a JVM expression any batch's DataFrame can use, and building one is a py4j round trip
    per call (hundreds per plan otherwise)."""

    keep: Any
    decode: list[Any]
    fields: list[Any]
    present: Any
    out: list[Any]
    jvm_steps: tuple[Any, Any, Any, Any]
    """``keep``, ``decode``, the barrier's filter and ``fields`` as JVM objects (two
    Columns, two Seqs of them): each Python-side ``select`` of a column list is a round
    trip per column."""

    @staticmethod
    def of(spark: Any, config: Config, stream: str, substream: str,
           decoding: Decoding) -> _RecordColumns:
        from pyspark.sql import functions as F

        key = (id(spark.sparkContext), stream, substream, decoding.reader,
               tuple(sorted(decoding.writers.items())))
        cached = _COLUMNS.get(key)
        if cached is not None:
            return cached
        layout = PayloadLayout(config.stream(stream))
        keep, decode = _decode_columns(decoding, f"stream '{stream}'")
        decode = [*decode, _barrier()]
        fields = [
            *(F.col("env.payload")[n].cast(t).alias(n)
              for n, t in zip(layout.names, layout.types, strict=True)),
            F.col("env.order_key").alias("order_key"),
            F.col("partition").cast("int").alias("partition"),
            F.col("offset"),
            F.col("env.times")[substream].alias("_t"),
            *_bad_columns(),
        ]
        to_seq = spark.sparkContext._jvm.PythonUtils.toSeq
        made = _RecordColumns(
            keep=keep, decode=decode, fields=fields,
            jvm_steps=(keep._jc, to_seq([c._jc for c in decode]), _barrier_kept()._jc,
                       to_seq([c._jc for c in fields])),
            present=F.col("_t").isNotNull(),
            out=[
                *(F.col(n) for n in layout.names),
                *(F.col(c) for c in NOTE_META[:4]),
                F.col("order_key"), F.col("partition"), F.col("offset"),
                *(F.col(c) for c in NOTE_META[4:]),
                F.lit(None).cast("long").alias("records"),
                F.lit(False).alias("is_notification"),
            ],
        )
        _COLUMNS[key] = made
        return made


_COLUMNS: dict[tuple[Any, ...], _RecordColumns] = {}


LITERAL_NOTES = 64
"""Up to this many notifications in a batch (every steady-state batch), a record finds its
epoch by a literal lookup built on the driver (:func:`_literal_epochs`); above, by a
broadcast join with the notifications (a backlog's batch, where a lookup evaluated per
record would cost more than the join)."""


def _sql_str(value: Any) -> str:
    """``value`` as a Spark SQL string literal (default parser: backslash escapes)."""
    if value is None:
        return "CAST(NULL AS STRING)"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _sql_num(value: Any, kind: str) -> str:
    return f"CAST({'NULL' if value is None else int(value)} AS {kind})"


def _sql_coords(coords: Sequence[Any]) -> str:
    return f"CAST(array({', '.join(f'{int(c)}L' for c in coords)}) AS ARRAY<BIGINT>)"


def _literal_epochs(recs: Any, notes: Sequence[Mapping[str, Any]]) -> Any:
    """``recs`` (with ``_t``, the record's time) joined to ``notes`` without a join: each
    record's notification index found by an expression built here -- a ``CASE`` chain
    over the exact times, a filter over the span notifications (a record may belong to
    several, as a hopping window's pane does: one row each) -- and the notification's
    columns taken from a literal array by that index.  Why: the notes are a handful of
    driver-side values; as a DataFrame they cost a broadcast (a job of its own) and a
    join in every batch's plan."""
    from pyspark.sql import functions as F

    metas = []
    for n in notes:
        e = n["epoch"]
        metas.append(
            "named_struct('epoch', named_struct('key', " + _sql_str(e.get("key"))
            + ", 'coords', " + _sql_coords(e["coords"]) + ", 'kind', " + _sql_str(e["kind"])
            + "), 'epoch_label', " + _sql_str(n.get("epoch_label"))
            + ", 'epoch_int', " + _sql_num(n.get("epoch_int"), "BIGINT")
            + ", 'epoch_key', " + _sql_str(n.get("epoch_key"))
            + ", 'control_offset', " + _sql_num(n.get("control_offset"), "BIGINT")
            + ", 'control_index', " + _sql_num(n.get("control_index"), "INT")
            + ", 'sealed_at_ms', " + _sql_num(n.get("sealed_at_ms"), "BIGINT") + ")")
    exact = [
        f"WHEN _t.kind = {_sql_str(n['epoch']['kind'])} "
        f"AND _t.key <=> {_sql_str(n['epoch'].get('key'))} "
        f"AND _t.coords = {_sql_coords(n['epoch']['coords'])} THEN {i}"
        for i, n in enumerate(notes) if n.get("until_coords") is None
    ]
    spans = [
        f"named_struct('i', {i}, 'key', {_sql_str(n['epoch'].get('key'))}, "
        f"'kind', {_sql_str(n['epoch']['kind'])}, 'lo', {_sql_coords(n['epoch']['coords'])}, "
        f"'hi', {_sql_coords(n['until_coords'])})"
        for i, n in enumerate(notes) if n.get("until_coords") is not None
    ]
    parts = []
    if exact:
        parts.append(recs.select("*", F.expr(f"CASE {' '.join(exact)} END").alias("_n"))
                     .where(F.col("_n").isNotNull()))
    if spans:
        matching = (
            f"transform(filter(array({', '.join(spans)}), n -> _t.key <=> n.key "
            "AND _t.kind = n.kind "
            "AND forall(zip_with(_t.coords, n.lo, (a, b) -> a >= b), v -> v) "
            "AND forall(zip_with(_t.coords, n.hi, (a, b) -> a <= b), v -> v)), n -> n.i)"
        )
        parts.append(recs.select("*", F.expr(f"explode({matching})").alias("_n")))
    joined = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    meta = F.expr(f"array({', '.join(metas)})")
    return joined.select("*", F.element_at(meta, F.col("_n") + 1).alias("_m")).select(
        *(c for c in recs.columns), "_m.*")


def records(
    spark: Any,
    config: Config,
    stream: str,
    substream: str,
    bootstrap: str,
    ranges: Sequence[OffsetRange],
    notes: Sequence[Mapping[str, Any]],
    decoding: Decoding,
    group_id: str,
    notes_frame: Any,
) -> Any:
    """The records of ``notes`` (the source's notification rows as JSON values by column,
    with ``until_coords``: a session's or a window's span, else None), with the source's
    columns, read and decoded in the JVM.  ``notes_frame``: a function giving the notes as
    a DataFrame (the join a batch of more than :data:`LITERAL_NOTES` uses)."""
    cols = _RecordColumns.of(spark, config, stream, substream, decoding)
    recs = unplaced_records(
        spark, config, stream, substream, bootstrap, ranges, decoding, group_id
    ).where(cols.present)
    if len(notes) <= LITERAL_NOTES:
        joined = _literal_epochs(recs, notes)
    else:
        joined = _joined_epochs(recs, notes_frame(),
                                any(n.get("until_coords") is not None for n in notes))
    return joined.select(*cols.out)


def unplaced_records(
    spark: Any,
    config: Config,
    stream: str,
    substream: str,
    bootstrap: str,
    ranges: Sequence[OffsetRange],
    decoding: Decoding,
    group_id: str,
) -> Any:
    """The batch's data records read and decoded in the JVM -- payload, ``order_key``,
    ``partition``, ``offset`` and ``_t`` (the record's time in ``substream``, null when it
    has none) -- not yet matched to their epochs: :func:`placed_table` does that in the
    task.  Why: matching in the plan puts the batch's notifications into it as literals,
    so every batch is a new plan to analyse and optimise (and a union with the notification
    rows and a sort); this plan has the same shape every batch."""
    from pyspark.sql import DataFrame

    keep, decode, kept, fields = _RecordColumns.of(
        spark, config, stream, substream, decoding).jvm_steps
    kafka = direct_jdf(
        spark, kafka_options(bootstrap, stream, ranges, group_id, security_options(config))
    )
    return DataFrame(kafka.filter(keep).select(decode).filter(kept).select(fields), spark)


_BAD_DETAIL = {
    REASON_FOREIGN: "not a single-object encoded record (no C3 01 marker and 8-byte schema "
                    f"fingerprint before the body). {UNTRACKED_HINT}",
    REASON_UNKNOWN_SCHEMA: "written with a schema fingerprint no registered schema of the "
                           "stream has",
    REASON_UNDECODABLE: "its body does not decode with the writer schema its fingerprint "
                        "names (truncated or garbled)",
}


def bad_rows(batches: Sequence[Any]) -> list[tuple[int, int, bytes, str]]:
    """The records of :func:`unplaced_records`' Arrow ``batches`` that did not decode:
    (partition, offset, raw bytes, reason) each."""
    out: list[tuple[int, int, bytes, str]] = []
    for batch in batches:
        if "_bad" not in batch.schema.names or batch.column("_bad").null_count == len(batch):
            continue
        reasons = batch.column("_bad").to_pylist()
        parts, offsets = batch.column("partition"), batch.column("offset")
        raws = batch.column("_raw")
        for i, why in enumerate(reasons):
            if why is not None:
                raw = raws[i].as_py()
                out.append((int(parts[i].as_py()), int(offsets[i].as_py()), raw or b"", why))
    return out


def dead_letter_rows(
    config: Config, stream: str, reader: str, bootstrap: str,
    bad: Sequence[tuple[int, int, bytes, str]],
) -> int:
    """Dead-letter the :func:`bad_rows` of a task (their letters durable before it
    returns), or raise :class:`~substreams.errors.BadRecordError` under the stream's
    ``on_bad_record: fail``.  At least once: a retried task writes them again, with the
    same topic, partition and offset (docs/design.md, "Bad records")."""
    if not bad:
        return 0
    from substreams.streams.badrecords import BadRecords

    letters = BadRecords(config, reader, bootstrap=bootstrap)
    try:
        for partition, offset, raw, why in sorted(bad, key=lambda b: (b[0], b[1])):
            letters.bad(stream, partition, offset, raw,
                        f"stream '{stream}': {_BAD_DETAIL.get(why, why)} (read by Spark)",
                        reason=why)
    finally:
        letters.close()
    return len(bad)


def _covers(t: Mapping[str, Any], n: Mapping[str, Any]) -> bool:
    """Whether time ``t`` (a record's ``_t``) lies in span notification ``n``'s times:
    same key and kind, every coordinate between the notification's and its ``until``'s."""
    e, lo, hi = n["epoch"], n["epoch"]["coords"], n["until_coords"]
    coords = t["coords"]
    return (t["key"] == e.get("key") and t["kind"] == e["kind"]
            and len(coords) == len(lo) == len(hi)
            and all(a >= b for a, b in zip(coords, lo, strict=True))
            and all(a <= b for a, b in zip(coords, hi, strict=True)))


def placed_table(
    batches: Sequence[Any], notes: Sequence[Mapping[str, Any]], schema: Any,
    sort: Sequence[str],
) -> Any:
    """:func:`unplaced_records`' Arrow batches and the batch's ``notes`` (notification rows
    as JSON values by column, with ``until_coords``) -> what :func:`records` and the notes'
    rows give, as one ``pyarrow.Table`` of the source's Arrow ``schema`` sorted by ``sort``
    (Spark's ascending order: nulls first).  A record joins the notification whose time
    equals its ``_t`` and every span notification (a session's, a window's) whose times
    hold it -- one row each; a record of no notification (another epoch's, inside the
    read's hull) is dropped."""
    import pyarrow as pa

    exact: dict[tuple[Any, Any, tuple[int, ...]], int] = {}
    spans: list[int] = []
    for i, n in enumerate(notes):
        e = n["epoch"]
        if n.get("until_coords") is None:
            exact.setdefault((e["kind"], e.get("key"), tuple(e["coords"])), i)
        else:
            spans.append(i)
    which: list[int] = []
    note_of: list[int] = []
    row = 0
    kept: list[Any] = []
    for batch in batches:
        for t in batch.column("_t").to_pylist():
            if t is not None:
                hit = exact.get((t["kind"], t["key"], tuple(t["coords"])))
                if hit is not None:
                    which.append(row)
                    note_of.append(hit)
                for j in spans:
                    if _covers(t, notes[j]):
                        which.append(row)
                        note_of.append(j)
            row += 1
        kept.append(batch)
    meta_names = [f.name for f in schema if f.name in NOTE_META or f.name in (
        "records", "is_notification")]
    marks = pa.Table.from_pylist(
        [{c: n.get(c) for c in meta_names} for n in notes],
        schema=pa.schema([schema.field(c) for c in meta_names]),
    )
    if kept:
        recs = pa.Table.from_batches(kept).take(pa.array(which, pa.int64()))
        of = marks.take(pa.array(note_of, pa.int64()))
        n_rows = recs.num_rows
        columns = []
        for f in schema:
            if f.name == "records":
                columns.append(pa.nulls(n_rows, f.type))
            elif f.name == "is_notification":
                columns.append(pa.array([False] * n_rows, f.type))
            elif f.name in NOTE_META:
                columns.append(of.column(f.name))
            else:
                columns.append(recs.column(f.name).cast(f.type))
        records_part = pa.Table.from_arrays(columns, schema=schema)
    else:
        records_part = schema.empty_table()
    notes_part = pa.Table.from_arrays(
        [marks.column(f.name) if f.name in meta_names else pa.nulls(len(notes), f.type)
         for f in schema], schema=schema)
    table = pa.concat_tables([records_part, notes_part])
    return table.take(_ascending_nulls_first(table, sort))


def _ascending_nulls_first(table: Any, sort: Sequence[str]) -> Any:
    """The indices that sort ``table`` by ``sort`` as Spark's ascending sort does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:  # pyarrow >= 25: null placement per key (the table-wide option is deprecated)
        return pc.sort_indices(table, sort_keys=[(c, "ascending", "at_start") for c in sort])
    except (TypeError, ValueError, pa.ArrowInvalid):
        return pc.sort_indices(table, sort_keys=[(c, "ascending") for c in sort],
                               null_placement="at_start")


def _joined_epochs(recs: Any, notes: Any, spans: bool) -> Any:
    """``recs`` joined to ``notes`` (a DataFrame of notification rows plus
    ``until_coords``) by a broadcast join: a session's or window's notification (with an
    ``until``) holds the times between its own and its ``until``, coordinate-wise."""
    from pyspark.sql import functions as F

    meta = notes.select(*NOTE_META, "until_coords")
    t, e = F.col("_t"), F.col("epoch")
    exact = meta.where(F.col("until_coords").isNull())
    joined = recs.join(
        F.broadcast(exact), t["key"].eqNullSafe(e["key"]) & (t["coords"] == e["coords"])
        & (t["kind"] == e["kind"]), "inner",
    )
    if spans:
        between = (
            t["key"].eqNullSafe(e["key"]) & (t["kind"] == e["kind"])
            & F.forall(F.zip_with(t["coords"], e["coords"], lambda a, b: a >= b), lambda v: v)
            & F.forall(F.zip_with(t["coords"], F.col("until_coords"), lambda a, b: a <= b),
                       lambda v: v)
        )
        ranged = meta.where(F.col("until_coords").isNotNull())
        joined = joined.unionByName(recs.join(F.broadcast(ranged), between, "inner"))
    return joined.drop("until_coords")


__all__ = ["Decoding", "bad_rows", "dead_letter_rows", "decoded", "jvm_unsupported",
           "kafka_options", "placed_table", "records", "unplaced_records"]
