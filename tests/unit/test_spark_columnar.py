"""The columnar read path against the per-row one it replaced.

* :func:`~substreams.spark.source.epoch_batch` gives exactly the Arrow batch PySpark builds
  from the per-row tuples (``row`` of ``_record_meta`` / ``_marker_meta``) with its own
  converter, for any payload, epoch kind and record count (hypothesis);
* :func:`~substreams.spark.columnar.arrow_groups` gives the same epochs as
  :func:`~substreams.spark.operator.groups` over the same rows, however Spark re-batches
  them, and refuses rows out of the source's order;
* the bench's columnar windowed counts equal the per-row operator's.
"""

from __future__ import annotations

import types
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from substreams.control.messages import OffsetRange
from substreams.errors import SubstreamsError
from substreams.frontier import Keyed, Time
from substreams.spark.columnar import arrow_groups
from substreams.spark.offsets import Notification
from substreams.spark.operator import apply_operator, groups
from substreams.spark.schema import PayloadLayout, row
from substreams.spark.source import (
    SOURCE_NAME,
    _marker_meta,
    _record_meta,
    arrow_schema,
    epoch_batch,
)
from substreams.streams.records import Entry
from substreams_bench.spark import ArrowWindowCounts, WindowCounts

SCHEMA = {
    "type": "record",
    "name": "Rec",
    "fields": [
        {"name": "ts", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "body", "type": "string"},
        {"name": "score", "type": ["null", "double"]},
        {"name": "flag", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
LAYOUT = PayloadLayout(types.SimpleNamespace(name="s", schema=SCHEMA))  # type: ignore[arg-type]


class _Source:
    @staticmethod
    def name() -> str:
        return SOURCE_NAME


payloads = st.fixed_dictionaries(
    {
        "ts": st.integers(-(2**63), 2**63 - 1),
        "n": st.integers(-(2**31), 2**31 - 1),
        "body": st.text(max_size=12),
        "score": st.none() | st.floats(allow_nan=False),
        "flag": st.booleans(),
        "blob": st.binary(max_size=8),
        "tags": st.lists(st.text(max_size=4), max_size=3),
    }
)
times: st.SearchStrategy[Time] = (
    st.integers(0, 10**6)
    | st.tuples(st.integers(0, 99), st.integers(0, 99))
    | st.builds(Keyed, st.text(min_size=1, max_size=5), st.integers(0, 10**6))
)


def _entries(pays: list[dict[str, Any]], t: Time) -> list[Entry]:
    return [
        Entry("s", i % 2, 100 + i, 1000 + i, i, "src", {"w": t}, p) for i, p in enumerate(pays)
    ]


def _note(t: Time, records: int, offset: int = 7, index: int = 1) -> Notification:
    return Notification(offset, t, (OffsetRange("s", 0, 0, records),), records, 123, None, index)


def _row_batches(rows: list[tuple[Any, ...]]) -> pa.Table:
    """What PySpark makes of the per-row path's tuples."""
    batches = list(records_to_arrow_batches(iter(rows), 10_000, LAYOUT.struct(), _Source()))
    return pa.Table.from_batches(batches, schema=arrow_schema(LAYOUT))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pays=st.lists(payloads, max_size=20), t=times, marker=st.booleans())
def test_epoch_batch_equals_the_per_row_path(
    pays: list[dict[str, Any]], t: Time, marker: bool
) -> None:
    entries = _entries(pays, t)
    note = _note(t, len(entries))
    rows = [row(LAYOUT, e.payload, _record_meta(t, e, note)) for e in entries]
    if marker:
        rows.append(row(LAYOUT, None, _marker_meta(note)))
    if not rows:
        return
    batch = epoch_batch(LAYOUT, arrow_schema(LAYOUT), note, entries, marker)
    assert batch.schema.equals(arrow_schema(LAYOUT))
    assert pa.Table.from_batches([batch]).equals(_row_batches(rows))


def _epoch_rows(epochs: list[tuple[Time, list[dict[str, Any]]]]) -> list[pa.RecordBatch]:
    schema = arrow_schema(LAYOUT)
    out = []
    for k, (t, pays) in enumerate(epochs):
        entries = _entries(pays, t)
        out.append(epoch_batch(LAYOUT, schema, _note(t, len(entries), 10 + k, 0), entries, True))
    return out


def _rebatched(batches: list[pa.RecordBatch], size: int) -> list[pa.RecordBatch]:
    """The same rows cut into batches of ``size`` (Spark's Arrow batches do not follow the
    source's)."""
    return pa.Table.from_batches(batches).to_batches(max_chunksize=size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epochs=st.lists(st.tuples(times, st.lists(payloads, max_size=8)), min_size=1, max_size=5),
    size=st.integers(1, 12),
)
def test_arrow_groups_equal_row_groups(
    epochs: list[tuple[Time, list[dict[str, Any]]]], size: int
) -> None:
    batches = _rebatched(_epoch_rows(epochs), size)
    rows = [r for b in batches for r in b.to_pylist()]
    expected = list(groups(rows))
    got = list(arrow_groups(batches))
    assert [g.info.ident for g in got] == [g.info.ident for g in expected]
    assert [g.info.time for g in got] == [g.info.time for g in expected]
    assert [g.info.records for g in got] == [g.info.records for g in expected]
    assert [g.marker for g in got] == [g.marker for g in expected]
    # every record once, in read order, with the columns the row path keeps
    assert [g.info.table.to_pylist() for g in got] == [g.info.rows for g in expected]


def test_arrow_groups_refuse_rows_out_of_order() -> None:
    pays = [{"ts": i, "n": 0, "body": "k", "score": None, "flag": False, "blob": b"",
             "tags": []} for i in range(3)]
    first, second = _epoch_rows([(1, pays), (2, pays)])
    with pytest.raises(SubstreamsError, match="out of order"):
        list(arrow_groups([second, first]))  # notifications descending
    table = pa.Table.from_batches([first])
    swapped = pa.concat_tables([table.slice(1, 1), table.slice(0, 1), table.slice(2)])
    with pytest.raises(SubstreamsError, match="out of order"):
        list(arrow_groups(swapped.to_batches()))  # records not in read order
    marker_first = pa.concat_tables([table.slice(3, 1), table.slice(0, 3)])
    with pytest.raises(SubstreamsError, match="out of order"):
        list(arrow_groups(marker_first.to_batches()))  # notification row before records


@settings(max_examples=40, deadline=None)
@given(bodies=st.lists(st.sampled_from(["k001x", "k002yy", "k003", "k1", ""]), max_size=40))
def test_columnar_window_counts_equal_the_row_operator(bodies: list[str]) -> None:
    pays = [{"ts": 0, "n": 0, "body": b, "score": None, "flag": False, "blob": b"",
             "tags": []} for b in bodies]
    [batch] = _epoch_rows([(4, pays)])
    [expected] = apply_operator(WindowCounts(100), groups(batch.to_pylist()))
    [got] = apply_operator(ArrowWindowCounts(100), arrow_groups([batch]))
    assert got.results == expected.results
    # the row path of the columnar operator (harness, group_by): the same again
    [via_rows] = apply_operator(ArrowWindowCounts(100), groups(batch.to_pylist()))
    assert via_rows.results == expected.results
