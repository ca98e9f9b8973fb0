"""Read limits of the firm source (#15 item 4): ``maxEpochsPerTrigger`` and
``maxRecordsPerTrigger`` cut a backlog into batches of whole epochs.

The cut itself is a pure function over the notifications (unit tests, hypothesis); the
integration test queues a backlog while no query runs and drains it with availableNow."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from substreams.errors import SubstreamsError
from substreams.spark.limits import ReadLimits, batch_end, cut
from substreams.spark.offsets import Notification


def note(offset: int, records: int, time: int | None = None) -> Notification:
    return Notification(offset, offset if time is None else time, (), records, 0)


# --- the cut (no Spark) -----------------------------------------------------------------


def test_no_limit_takes_everything() -> None:
    notes = [note(o, 10) for o in range(5)]
    assert cut(notes, ReadLimits()) == 5
    assert batch_end(0, 9, notes, ReadLimits()) == 9


def test_epoch_limit_stops_after_the_nth_notification() -> None:
    notes = [note(o, 10) for o in (3, 5, 8, 9)]
    assert cut(notes, ReadLimits(max_epochs=2)) == 2
    # the end is the control position after the 2nd notification, not the readable end
    assert batch_end(3, 12, notes, ReadLimits(max_epochs=2)) == 6


def test_record_limit_stops_before_the_epoch_that_would_exceed_it() -> None:
    notes = [note(0, 40), note(1, 50), note(2, 10), note(3, 1)]
    assert cut(notes, ReadLimits(max_records=90)) == 2  # 40 + 50 = 90 fits, +10 does not
    assert cut(notes, ReadLimits(max_records=89)) == 1
    assert cut(notes, ReadLimits(max_records=101)) == 4


def test_an_epoch_larger_than_the_record_limit_still_progresses_alone() -> None:
    notes = [note(0, 1_000_000), note(1, 5)]
    assert cut(notes, ReadLimits(max_records=100)) == 1
    assert cut(notes[1:], ReadLimits(max_records=100)) == 1


def test_both_limits_the_tighter_wins() -> None:
    notes = [note(o, 10) for o in range(10)]
    assert cut(notes, ReadLimits(max_epochs=3, max_records=1000)) == 3
    assert cut(notes, ReadLimits(max_epochs=30, max_records=45)) == 4


def test_notifications_of_one_control_record_are_never_split() -> None:
    # batched completions: one control record (offset 7) carrying three notifications
    notes = [note(5, 10), note(7, 10, time=1), note(7, 10, time=2), note(7, 10, time=3)]
    assert cut(notes, ReadLimits(max_epochs=2)) == 1
    assert batch_end(5, 8, notes, ReadLimits(max_epochs=2)) == 6
    # a record alone over the limit still goes whole (progress), and ends the batch
    assert cut(notes[1:], ReadLimits(max_epochs=2)) == 3
    assert cut(notes[1:], ReadLimits(max_records=5)) == 3


def test_no_notifications_means_an_empty_cut() -> None:
    assert cut([], ReadLimits(max_epochs=1)) == 0
    assert batch_end(4, 4, [], ReadLimits(max_epochs=1)) == 4


@st.composite
def backlogs(draw: st.DrawFn) -> list[Notification]:
    """Notifications at increasing control offsets, some sharing a control record."""
    out: list[Notification] = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 30))):
        offset += draw(st.sampled_from([0, 1, 1, 1, 2, 5])) if out else 0
        out.append(note(offset, draw(st.integers(0, 200)), time=len(out)))
    return out


limits_st = st.builds(
    ReadLimits, st.none() | st.integers(1, 8), st.none() | st.integers(1, 500)
)


@given(backlogs(), limits_st)
def test_draining_a_backlog_gives_whole_records_within_the_limits_in_order(
    notes: list[Notification], limits: ReadLimits
) -> None:
    start = notes[0].control_offset if notes else 0
    latest = (notes[-1].control_offset + 1) if notes else start
    batches: list[list[Notification]] = []
    while start < latest:
        pending = [n for n in notes if n.control_offset >= start]
        end = batch_end(start, latest, pending, limits)
        assert start < end <= latest  # always progress, never past what is readable
        batch = [n for n in pending if n.control_offset < end]
        assert batch, "a batch takes at least one control record"
        batches.append(batch)
        start = end
    # the union is exactly the backlog, in order
    assert [n for b in batches for n in b] == notes
    for b in batches:
        # whole control records: no record's notifications straddle two batches
        offsets = {n.control_offset for n in b}
        assert all(
            n.control_offset not in offsets for other in batches if other is not b for n in other
        )
        records = sum(n.records for n in b)
        over = (limits.max_epochs is not None and len(b) > limits.max_epochs) or (
            limits.max_records is not None and records > limits.max_records
        )
        if over:  # allowed only for a batch of one control record (progress)
            assert len(offsets) == 1
    # maximal: no batch could have taken the next control record as well
    for b, nxt in itertools.pairwise(batches):
        head = [n for n in nxt if n.control_offset == nxt[0].control_offset]
        grown = b + head
        assert (limits.max_epochs is not None and len(grown) > limits.max_epochs) or (
            limits.max_records is not None
            and sum(n.records for n in grown) > limits.max_records
        )


# --- options ------------------------------------------------------------------------------


def test_options_are_validated_naming_the_option_and_value(make_config: Any) -> None:
    from substreams.spark.options import SourceOptions, ship_config

    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    base = {"configPickle": ship_config(config), "substream": config.substreams[0].name}
    opts = SourceOptions.parse({**base, "maxEpochsPerTrigger": "5", "maxRecordsPerTrigger": "9"})
    assert (opts.max_epochs, opts.max_records) == (5, 9)
    assert SourceOptions.parse(base).max_epochs is None
    for name, bad in (("maxEpochsPerTrigger", "0"), ("maxRecordsPerTrigger", "lots"),
                      ("maxEpochsPerTrigger", "-3"), ("maxRecordsPerTrigger", "1.5")):
        with pytest.raises(SubstreamsError) as err:
            SourceOptions.parse({**base, name: bad})
        assert f"'{name}'" in str(err.value) and repr(bad) in str(err.value)
    with pytest.raises(SubstreamsError, match="firm mode only"):
        SourceOptions.parse({**base, "mode": "soft", "maxEpochsPerTrigger": "2"})


# --- a backlog drained by a real query ------------------------------------------------------

EPOCHS = 40
PER_EPOCH = 500  # 20 000 records queued while no query runs


@pytest.fixture
def backlog(make_config: Any) -> Any:
    """40 sealed windows of 500 clicks each, written (with their EpochCompletes) before any
    query starts."""
    from substreams.app import DIRECT, Application

    config = make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    w = config.substreams[0].name
    app = Application(config, mechanisms=DIRECT)
    with app.publisher(config.streams[0].name, "src", batch_size=5000) as pub:
        for window in range(EPOCHS):
            step = 1000 // PER_EPOCH
            pub.publish_many(
                [{"user": f"u{i % 3}", "url": "/", "ts": window * 1000 + i * step}
                 for i in range(PER_EPOCH)]
            )
            pub.seal(w, window)
        pub.flush()
    return config


def _drain(spark: Any, config: Any, checkpoint: Path, **options: str) -> list[list[dict[str, Any]]]:
    from substreams.spark.options import ship_config

    batches: list[list[dict[str, Any]]] = []
    reader = (
        spark.readStream.format("substreams")
        .option("configPickle", ship_config(config))
        .option("substream", config.substreams[0].name)
        .option("markers", "true")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .select("epoch_int", "is_notification", "records", "control_offset")
        .writeStream.foreachBatch(
            lambda df, bid: batches.append([r.asDict() for r in df.collect()])
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "availableNow query did not finish"
    assert query.exception() is None
    return [b for b in batches if b]


def _check(batches: list[list[dict[str, Any]]], max_epochs: int | None, max_records: int | None
           ) -> None:
    seen: list[int] = []
    for rows in batches:
        records = Counter(r["epoch_int"] for r in rows if not r["is_notification"])
        marks = {r["epoch_int"]: r["records"] for r in rows if r["is_notification"]}
        epochs = sorted(marks, key=lambda e: next(
            r["control_offset"] for r in rows if r["epoch_int"] == e))
        # whole epochs: every record of each notified epoch, and only those
        assert set(records) <= set(marks)
        assert all(records[e] == marks[e] == PER_EPOCH for e in marks), (records, marks)
        if max_epochs is not None:
            assert len(epochs) <= max_epochs
        if max_records is not None:
            assert sum(records.values()) <= max_records
        seen += epochs
    assert seen == list(range(EPOCHS))  # the union is exactly every epoch, in order


@pytest.mark.spark
@pytest.mark.parametrize(
    ("options", "expected_batches"),
    [
        ({"maxEpochsPerTrigger": "7"}, math.ceil(EPOCHS / 7)),
        # 1 800 records fit 3 epochs of 500
        ({"maxRecordsPerTrigger": "1800"}, math.ceil(EPOCHS / 3)),
        ({"maxEpochsPerTrigger": "9", "maxRecordsPerTrigger": "6000"}, math.ceil(EPOCHS / 9)),
        # a record limit below one epoch: one epoch per batch, the backlog still drains
        ({"maxRecordsPerTrigger": "100"}, EPOCHS),
        ({}, 1),
    ],
)
def test_a_backlog_drains_in_batches_of_whole_epochs_within_the_limit(
    spark: Any, backlog: Any, tmp_path: Path, options: dict[str, str], expected_batches: int
) -> None:
    batches = _drain(spark, backlog, tmp_path / "ck", **options)
    _check(
        batches,
        int(options["maxEpochsPerTrigger"]) if "maxEpochsPerTrigger" in options else None,
        int(options["maxRecordsPerTrigger"])
        if "maxRecordsPerTrigger" in options and int(options["maxRecordsPerTrigger"]) >= PER_EPOCH
        else None,
    )
    assert len(batches) == expected_batches


def test_the_default_read_limit_carries_the_options_and_read_all_ignores_them(
    make_config: Any,
) -> None:
    """Spark hands getDefaultReadLimit() back to latestOffset (availableNow, processing
    time) and ReadAllAvailable when a trigger must read everything: then no limit."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

    from substreams.spark.options import SourceOptions, ship_config
    from substreams.spark.schema import PayloadLayout
    from substreams.spark.source import SubstreamsStreamReader

    config = make_config(
        [{"name": "clicks", "partitions": 1}],
        [{"name": "w", "stream": "clicks", "kind": "tumbling", "size_ms": 1000}],
    )
    base = {"configPickle": ship_config(config), "substream": config.substreams[0].name}

    def reader(**options: str) -> SubstreamsStreamReader:
        opts = SourceOptions.parse({**base, **options})
        return SubstreamsStreamReader(opts, PayloadLayout(config.streams[0]))

    assert isinstance(reader().getDefaultReadLimit(), ReadAllAvailable)
    assert reader(maxEpochsPerTrigger="4").getDefaultReadLimit() == ReadMaxFiles(4)
    both = reader(maxEpochsPerTrigger="4", maxRecordsPerTrigger="900")
    assert both.getDefaultReadLimit() == ReadMaxRows(900)
    assert both._limits_for(both.getDefaultReadLimit()) == ReadLimits(4, 900)
    assert both._limits_for(ReadAllAvailable()).unlimited
    assert reader()._limits_for(ReadMaxRows(50)) == ReadLimits(None, 50)
    soft = reader(mode="soft")
    assert isinstance(soft.getDefaultReadLimit(), ReadAllAvailable)
