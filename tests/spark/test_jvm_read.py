"""The JVM read path: a batch's records read by Spark's own Kafka source (exact ranges,
read_committed) and decoded by ``from_avro``, for both ways of writing epoch work -- Spark
DataFrame operations (``run_frames``) and an ``ArrowEpochOperator`` (``run``) -- with the
same exactly-once write, and schema evolution across the writer schemas a stream used."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from substreams.app import DIRECT, Application
from substreams.control.messages import OffsetRange
from substreams.kafka.read import drain
from substreams.spark import ArrowEpochOperator
from substreams.spark.frames import run_frames
from substreams.spark.jvm_read import Decoding, jvm_unsupported, kafka_options
from substreams.spark.operator import EpochNote
from substreams.spark.options import CONFIG_PICKLE, ship_config
from substreams.spark.runner import JvmRead, run
from substreams.streams.evolution import stream_fingerprint
from substreams.streams.schemas import Codec, envelope_schema
from tests.conftest import CLICK_SCHEMA, ConfigFactory, read_dead_letters
from tests.integration.test_schema_evolution import V1, V2, with_schema
from tests.spark.conftest import running_acker, wait_for_epochs, window_clicks
from tests.spark.jobs import out_stream

pytestmark = pytest.mark.spark


def test_kafka_options_read_the_hull_of_each_partitions_ranges() -> None:
    ranges = [OffsetRange("t", 0, 5, 9), OffsetRange("t", 0, 2, 4), OffsetRange("t", 1, 7, 8),
              OffsetRange("other", 0, 0, 100), OffsetRange("t", 2, 3, 3)]
    opts = kafka_options("b:1", "t", ranges, "g")
    assert json.loads(opts["assign"]) == {"t": [0, 1]}
    assert json.loads(opts["startingOffsets"]) == {"t": {"0": 2, "1": 7}}
    assert json.loads(opts["endingOffsets"]) == {"t": {"0": 9, "1": 8}}
    assert opts["kafka.isolation.level"] == "read_committed"
    assert opts["kafka.group.id"] == "g"
    # the offsets request after each poll must not wait behind a parked fetch
    assert int(opts["kafka.fetch.max.wait.ms"]) <= 50


def test_direct_frame_reads_what_spark_kafka_relation_reads(
    spark: SparkSession, make_config: ConfigFactory
) -> None:
    """The Kafka RDD built without the relation (no per-call offset resolution on the
    driver) gives the relation's rows: same offsets and values, transaction markers
    skipped, and a sub-range cut exactly; no headers are read (the values carry the
    writer schema's fingerprint)."""
    from confluent_kafka import TopicPartition

    from substreams.kafka import client
    from substreams.spark.jvm_read import direct_frame

    config = make_config([{"name": "clicks", "partitions": 2}])
    (clicks,) = (s.name for s in config.streams)
    with Application(config).publisher(clicks, "src") as pub:
        for i in range(3):  # three flushes: transaction markers between the records
            for c in window_clicks(i, 7):
                pub.publish(c, key=str(c["user"]))
            pub.flush()
    bootstrap = config.kafka.bootstrap
    probe = client.consumer(bootstrap, config)
    ends = [probe.get_watermark_offsets(TopicPartition(clicks, p), timeout=10)[1]
            for p in (0, 1)]
    probe.close()
    def rows(df: DataFrame) -> list[Any]:
        return sorted(tuple(r) for r in df.select("partition", "offset", "value").collect())

    for ranges in ([OffsetRange(clicks, p, 0, ends[p]) for p in (0, 1)],
                   [OffsetRange(clicks, 0, 2, max(3, ends[0] - 3))]):
        # one group id each: Spark's consumer pool is keyed by group and partition
        rel = kafka_options(bootstrap, clicks, ranges, "substreams.spark.test.relation")
        want = rows(spark.read.format("kafka").options(**rel).load())
        opts = kafka_options(bootstrap, clicks, ranges, "substreams.spark.test.direct")
        direct = direct_frame(spark, opts)
        assert "headers" not in direct.columns
        assert want and rows(direct) == want


class UrlCounts(ArrowEpochOperator):
    """Clicks per (window, url), computed columnar on the executors."""

    key_field = "url"

    def __init__(self) -> None:
        self.notes: list[EpochNote] = []

    def on_notification(self, note: EpochNote) -> None:  # the driver's copy
        self.notes.append(note)

    def on_epoch_table(self, epoch: Any, table: Any) -> list[dict[str, Any]]:
        counts = Counter(table.column("url").to_pylist())
        return [{"window": int(epoch), "url": u, "clicks": n} for u, n in counts.items()]


def _downstream(spark: SparkSession, config: Any, substream: str, path: Path) -> list[Any]:
    """A firm read of an output substream: its rows, collected on the driver."""
    got: list[tuple[int, str, int]] = []
    query = (
        spark.readStream.format("substreams")
        .option(CONFIG_PICKLE, ship_config(config)).option("substream", substream).load()
        .writeStream.foreachBatch(lambda df, _: got.extend(
            (int(r["window"]), str(r["url"]), int(r["clicks"])) for r in df.collect()))
        .option("checkpointLocation", str(path)).trigger(availableNow=True).start()
    )
    assert query.awaitTermination(300)
    return got


def test_dataframe_ops_and_arrow_operator_on_the_jvm_read(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path
) -> None:
    config = make_config(
        [{"name": "clicks", "partitions": 2},
         out_stream("df_counts", "url_count.avsc", partitions=2),
         out_stream("op_counts", "url_count.avsc", partitions=2)],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000},
         {"name": "dw", "stream": "df_counts", "kind": "epoch", "field": "window"},
         {"name": "ow", "stream": "op_counts", "kind": "epoch", "field": "window"}],
    )
    w, dw, ow = (s.name for s in config.substreams)
    clicks, df_out, op_out = (s.name for s in config.streams)
    windows = [(0, 10), (1, 6), (2, 0), (3, 9)]  # window 2 sealed without records
    want: Counter[tuple[int, str]] = Counter()
    for window, n in windows:
        for c in window_clicks(window, n):
            want[(window, str(c["url"]))] += 1
    df_notes: list[EpochNote] = []
    op = UrlCounts()

    def counts(df: DataFrame) -> DataFrame:  # Spark operations only: never leaves the JVM
        return (df.where(~F.col("is_notification"))
                .groupBy("control_offset", "control_index", "epoch", "url")
                .agg(F.count("*").alias("clicks"))
                .withColumn("window", F.col("epoch.coords")[0]))

    with running_acker(config), Application(config).publisher(clicks, "src") as pub:
        for window, n in windows:
            for c in window_clicks(window, n):
                pub.publish(c, key=str(c["user"]))
            pub.seal(w, window)
        for c in window_clicks(4, 3):  # window 4 stays open: nobody may see it
            pub.publish(c, key=str(c["user"]))
        pub.flush()
        wait_for_epochs(config, w, len(windows), timeout=60)
        run_frames(counts, config, w, df_out, name="jvm-df", key_field="url", spark=spark,
                   once=True, checkpoint=tmp_path / "df", on_notification=df_notes.append)
        run(op, config, w, op_out, spark=spark, once=True, checkpoint=tmp_path / "op",
            # one epoch a batch: window 2's batch has no record to read
            query_name="jvm-op", options={"maxEpochsPerTrigger": "1"}, read="jvm")
        for sub in (dw, ow):
            wait_for_epochs(config, sub, len(windows), timeout=120)
        got_df = _downstream(spark, config, dw, tmp_path / "d1")
        got_op = _downstream(spark, config, ow, tmp_path / "d2")
    truth = sorted((win, u, n) for (win, u), n in want.items())
    assert sorted(got_df) == truth
    assert sorted(got_op) == truth
    assert [n.time for n in df_notes] == [0, 1, 2, 3]
    assert [n.records for n in df_notes] == [n for _, n in windows]
    assert all(n.sealed_at_ms > 0 for n in df_notes)
    assert [(n.time, n.records) for n in op.notes] == [(n.time, n.records) for n in df_notes]
    assert sum(n.results for n in op.notes) == len(truth)


def test_the_jvm_read_decodes_every_writer_schema_and_dead_letters_an_unknown_one(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    v1 = make_config([{"name": "clicks", "partitions": 2, "schema": "v1.avsc"}],
                     [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}])
    w, stream = v1.substreams[0].name, v1.streams[0].name
    with Application(v1, mechanisms=DIRECT).publisher(stream, "old") as pub:
        for c in window_clicks(0, 4):
            pub.publish({**c, "agent": "a"}, key=str(c["user"]))
        pub.seal(w, 0)
    v2 = with_schema(v1, V2, "v2")
    with Application(v2, mechanisms=DIRECT).publisher(stream, "new") as pub:
        for c in window_clicks(1, 3):
            pub.publish({**c, "ref": "r"}, key=str(c["user"]))
        pub.seal(w, 1)
    wait_for_epochs(v2, w, 2, timeout=60)
    seen: list[tuple[int, str]] = []

    def refs(df: DataFrame) -> DataFrame:
        return df.where(~F.col("is_notification")).select(
            "control_offset", "control_index", "epoch", "epoch_int", "ref")

    def collect(df: DataFrame, _: int) -> None:
        seen.extend((int(r["epoch_int"]), str(r["ref"])) for r in df.collect())

    # v2's reader: the old records in the new shape ('ref' takes its default)
    run_frames(refs, v2, w, name="jvm-evolve", spark=spark, once=True,
               checkpoint=tmp_path / "ev", on_results=collect)
    assert sorted(seen) == [(0, "-")] * 4 + [(1, "r")] * 3
    # a record whose fingerprint no registered schema has fails the query, naming it
    assert jvm_unsupported(v2, stream) is None
    odd = {**CLICK_SCHEMA, "fields": [*CLICK_SCHEMA["fields"],
                                       {"name": "zzz", "type": "long", "default": 0}]}
    v3 = with_schema(v1, odd, "v3")
    with Application(v3, mechanisms=DIRECT).publisher(stream, "odd") as pub:
        for c in window_clicks(2, 2):
            pub.publish({**c, "zzz": 1}, key=str(c["user"]))
        pub.seal(w, 2)
    wait_for_epochs(v2, w, 3, timeout=60)
    # a reader that never saw v3 registered (the schema topic read before it was)
    known = Decoding.of(v2, stream, {stream_fingerprint(V1): V1})
    monkeypatch.setattr(JvmRead, "decoding", lambda self: known)
    offsets = sorted(m.offset() for p in (0, 1)
                     for m in drain(v2.kafka.bootstrap, v2, stream, partition=p)
                     if m.value()[:10] == Codec(envelope_schema(odd)).prefix)
    # on_bad_record: fail -- the query fails, naming topic, partition and offset
    failing = dataclasses.replace(v2, streams=tuple(
        dataclasses.replace(sc, on_bad_record="fail") for sc in v2.streams))
    with pytest.raises(Exception, match=rf"{stream}\[\d\]@\d+ \(unknown_schema\)"):
        run_frames(refs, failing, w, name="jvm-evolve", spark=spark, once=True,
                   checkpoint=tmp_path / "ev", on_results=collect)
    # the default: its records are dead-lettered (never decoded into garbage), the query
    # goes on and the epoch holds none of them
    run_frames(refs, v2, w, name="jvm-evolve", spark=spark, once=True,
               checkpoint=tmp_path / "ev", on_results=collect)
    assert sorted(seen) == [(0, "-")] * 4 + [(1, "r")] * 3
    letters = [d for d in read_dead_letters(v2) if d.service == "spark.jvm-evolve"]
    assert {d.reason for d in letters} == {"unknown_schema"}
    assert sorted(d.offset for d in letters) == offsets and len(offsets) == 2


class EpochCount(ArrowEpochOperator):
    """One result per epoch: its record count (the unit checks it against the
    notification's announced count before anything is written)."""

    def __init__(self) -> None:
        self.notes: list[EpochNote] = []

    def on_notification(self, note: EpochNote) -> None:
        self.notes.append(note)

    def on_epoch_table(self, epoch: Any, table: Any) -> list[dict[str, Any]]:
        return [{"epoch": int(epoch), "n": table.num_rows}]


def test_read_limits_bound_the_jvm_batches_of_a_backlog(
    spark: SparkSession, make_config: ConfigFactory, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import re

    from substreams_bench.workload import open_publishers

    # 20,000 records in epochs of 1,000: batches of 3 whole epochs within the limit, 7
    # batches (the rule's edges are unit-tested in test_read_limits.py; a larger backlog --
    # this test published 200,000 -- only takes longer, the same batches 10x larger)
    total, windows, limit = 20_000, 20, 3_000
    per = total // windows
    config = make_config([{"name": "clicks", "partitions": 2}],
                         [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}])
    w, clicks = config.substreams[0].name, config.streams[0].name
    (pub,) = open_publishers(config, clicks, ["src"], config.kafka.bootstrap,
                             mechanisms=DIRECT, batch_size=5000)
    try:
        for window in range(windows):
            pub.publish_many([{"user": f"u{i % 7}", "url": "/",
                               "ts": window * 1000 + i * 1000 // per} for i in range(per)])
            pub.seal(w, window)
        pub.flush()
    finally:
        pub.close()
    wait_for_epochs(config, w, windows, timeout=300)
    op = EpochCount()
    caplog.set_level(logging.INFO, logger="substreams.spark.runner")
    run(op, config, w, spark=spark, once=True, checkpoint=tmp_path / "ck",
        query_name="jvm-limits", options={"maxRecordsPerTrigger": str(limit)}, read="jvm")
    started = [(int(e), int(r)) for e, r in re.findall(
        r"batch \d+: started \((\d+) epochs, (\d+) records, JVM read", caplog.text)]
    assert [n.time for n in op.notes] == list(range(windows))  # each once, in order
    assert all(n.records == per and n.results == 1 for n in op.notes)
    assert sum(r for _, r in started) == total
    assert all(r <= limit for _, r in started), started  # whole epochs, within the limit
    assert len(started) == -(-windows // (limit // per))


def test_batch_offsets_come_from_the_checkpoints_offset_log(tmp_path: Path) -> None:
    """A batch spans from the control offset its predecessor ended at to its own end, as
    Spark logged them before running it; the first batch starts at the topic's start only
    when the query starts there; a missing or foreign offset file gives None (collect)."""
    from substreams.spark.runner import logged_span

    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, control in ((0, 3), (1, 5), (2, 9)):
        (offsets / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":1}}\n{{"control":{control},"tasks":1}}\n')
    (offsets / "4").write_text('v1\n{}\n{"logOffset":7}\n')
    assert logged_span(tmp_path, 0, earliest=True) == (0, 3)
    assert logged_span(tmp_path, 0, earliest=False) is None
    assert logged_span(tmp_path, 1, earliest=True) == (3, 5)
    assert logged_span(tmp_path, 2, earliest=False) == (5, 9)
    assert logged_span(tmp_path, 3, earliest=True) is None  # not logged
    assert logged_span(tmp_path, 4, earliest=True) is None  # not this source's offset


def test_each_record_is_decoded_once_under_the_epoch_filters(
    spark: SparkSession, make_config: ConfigFactory
) -> None:
    """The records' filters over the decoded envelope (time present, the epoch lookup) run
    above the decode, not inlined into a filter below it: the physical plan calls
    ``from_avro`` once per writer schema (a filter pushed below the projection decoded every
    record once more, and a pruned barrier column let it be pushed)."""
    from substreams.spark.jvm_read import _literal_epochs, unplaced_records

    config = make_config([{"name": "clicks", "partitions": 2}],
                         [{"name": "w", "stream": "clicks", "kind": "tumbling",
                           "size_ms": 1000}])
    stream, w = config.streams[0].name, config.substreams[0].name
    decoding = Decoding.of(config, stream, {})
    recs = unplaced_records(spark, config, stream, w, config.kafka.bootstrap,
                            [OffsetRange(stream, 0, 0, 10)], decoding, "g")
    notes = [{"epoch": {"key": None, "coords": [i], "kind": "int"}, "epoch_label": str(i),
              "epoch_int": i, "epoch_key": None, "control_offset": i, "control_index": 0,
              "sealed_at_ms": 0, "until_coords": None} for i in range(3)]
    for df in (recs.where(F.col("_t").isNotNull()),
               _literal_epochs(recs.where(F.col("_t").isNotNull()), notes)
               .groupBy("epoch", "user").count()):
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert plan.count("from_avro(") == len(decoding.writers), plan


def test_the_literal_epoch_lookup_gives_what_the_join_gives(spark: SparkSession) -> None:
    """Records find their notification by the driver-built lookup (few notes) exactly as by
    the broadcast join (many notes): exact times, keyed times, quotes and backslashes in
    labels and keys, and span notifications a record belongs to several of."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    from substreams.spark.jvm_read import NOTE_META, _joined_epochs, _literal_epochs
    from substreams.spark.runner import local_frame
    from substreams.spark.schema import EPOCH_TYPE, META_FIELDS

    def note(i: int, key: str | None, coords: list[int], kind: str,
             until: list[int] | None = None) -> dict[str, Any]:
        return {"epoch": {"key": key, "coords": coords, "kind": kind},
                "epoch_label": f"it's {i} \\ ok", "epoch_int": coords[0], "epoch_key": key,
                "control_offset": 10 + i, "control_index": i % 2, "sealed_at_ms": 1000 + i,
                "until_coords": until}

    exact = [note(0, None, [1], "w"), note(1, None, [2], "w"), note(2, "a'b\\c", [2], "s")]
    spans = [note(3, None, [4], "h", [6]), note(4, None, [5], "h", [7])]
    times = [(None, [1], "w"), (None, [2], "w"), (None, [3], "w"), ("a'b\\c", [2], "s"),
             ("x", [2], "s"), (None, [5], "h"), (None, [7], "h"), (None, [9], "h")]
    recs = local_frame(
        spark, [{"offset": n, "_t": {"key": k, "coords": c, "kind": kd}}
                for n, (k, c, kd) in enumerate(times)],
        StructType([StructField("offset", LongType()), StructField("_t", EPOCH_TYPE)]))
    meta = dict(META_FIELDS)
    schema = StructType([StructField(c, meta[c]) for c in NOTE_META]
                        + [StructField("until_coords", ArrayType(LongType()))])
    notes = exact + spans
    cols = ["offset", *NOTE_META]
    by_lookup = sorted(map(tuple, _literal_epochs(recs, notes).select(*cols).collect()))
    by_join = sorted(map(tuple, _joined_epochs(
        recs, local_frame(spark, notes, schema), True).select(*cols).collect()))
    assert by_lookup == by_join
    # time 1 and 2 exactly; the key with quote and backslash; time 5 in both windows, 7 in
    # the second only; 3, key x and 9 in none
    assert [r[0] for r in by_lookup] == [0, 1, 3, 5, 5, 6]


def test_the_task_side_placement_gives_what_the_literal_lookup_gives(
    spark: SparkSession,
) -> None:
    """A one-unit batch finds its records' epochs in the task (``placed_table``), not in
    the plan: the same rows as the literal lookup and the notification rows, in the
    units' order (by notification, records before their notification row), for exact,
    keyed and span notifications; a record of no notification is dropped."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from substreams.spark.jvm_read import NOTE_META, _literal_epochs, placed_table
    from substreams.spark.operator import sort_columns
    from substreams.spark.runner import local_frame
    from substreams.spark.schema import EPOCH_TYPE, META_FIELDS

    def note(i: int, key: str | None, coords: list[int], kind: str,
             until: list[int] | None = None) -> dict[str, Any]:
        return {"epoch": {"key": key, "coords": coords, "kind": kind},
                "epoch_label": f"e{i}", "epoch_int": coords[0], "epoch_key": key,
                "control_offset": 10 + i // 2, "control_index": i % 2,
                "sealed_at_ms": 1000 + i, "records": 2, "is_notification": True,
                "until_coords": until}

    notes = [note(0, None, [1], "w"), note(1, None, [2], "w"), note(2, "k", [2], "s"),
             note(3, None, [4], "h", [6]), note(4, None, [5], "h", [7])]
    times = [(None, [2], "w"), (None, [1], "w"), (None, [3], "w"), ("k", [2], "s"),
             ("x", [2], "s"), (None, [5], "h"), (None, [7], "h"), None]
    payload = StructType([StructField("user", StringType())])
    struct = StructType([*payload.fields, *(StructField(n, t) for n, t in META_FIELDS)])
    rec_schema = StructType([*payload.fields, StructField("order_key", LongType()),
                             StructField("partition", LongType()),
                             StructField("offset", LongType()), StructField("_t", EPOCH_TYPE)])
    rows = [{"user": f"u{n}", "order_key": 5 - n % 3, "partition": n % 2, "offset": n,
             "_t": None if t is None else {"key": t[0], "coords": t[1], "kind": t[2]}}
            for n, t in enumerate(times)]
    batches = [pa.RecordBatch.from_pylist(rows[:3], schema=to_arrow_schema(rec_schema)),
               pa.RecordBatch.from_pylist(rows[3:], schema=to_arrow_schema(rec_schema))]
    table = placed_table(batches, notes, to_arrow_schema(struct), sort_columns(None))
    got = table.to_pylist()
    assert table.schema == to_arrow_schema(struct)
    # the literal lookup's record rows, plus one notification row per note
    recs = local_frame(spark, [r for r in rows if r["_t"] is not None], rec_schema)
    want = {(r["offset"], r["user"], r["epoch_label"])
            for r in _literal_epochs(recs, notes).collect()}
    assert {(r["offset"], r["user"], r["epoch_label"]) for r in got
            if not r["is_notification"]} == want
    assert [r["epoch_label"] for r in got if r["is_notification"]] == [
        f"e{i}" for i in range(5)]
    # in the units' order: by notification, its records by (order key, partition, offset)
    # before its notification row, which carries the note's columns
    keys = [(r["control_offset"], r["control_index"], r["is_notification"],
             r["order_key"] is not None, r["order_key"], r["partition"], r["offset"])
            for r in got]
    assert keys == sorted(keys)
    marks = [r for r in got if r["is_notification"]]
    assert all(r["user"] is None and r["records"] == 2 for r in marks)
    assert {c: marks[2][c] for c in NOTE_META} == {
        c: v for c, v in notes[2].items() if c in NOTE_META}
    assert [r["offset"] for r in got if not r["is_notification"]] == [1, 0, 3, 5, 5, 6]
