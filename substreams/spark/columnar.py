"""Grouping a direct unit's Arrow batches into epochs without building rows.

The columnar twin of :func:`substreams.spark.operator.groups` for a per-epoch operator
(no ``group_by``) on the direct path: the source's read task yields whole epochs in
notification order, records in read order before their notification row
(:func:`~substreams.spark.operator.sort_columns`).  This checks the same order -- an
epoch's rows contiguous and never seen again, notifications ascending, at most one
notification row per epoch and it last, records ascending by ``(order_key, partition,
offset)`` -- with numpy over whole columns, and hands each epoch's records over as one
``pyarrow.Table`` (:class:`~substreams.spark.operator.ArrowEpochOperator`).

Why: turning every row into a dict (``to_pylist``) and comparing a Python sort key per row
cost more than reading the records (bench/README.md section 4, "Part (a) throughput work").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from substreams.errors import SubstreamsError
from substreams.spark.epochs import META_COLUMNS, struct_time
from substreams.spark.operator import KEPT_META, EpochInfo, Group

_IDENT = ("control_offset", "control_index")
_ORDER = ("order_key", "partition", "offset")


def _ascending(columns: list[Any]) -> bool:
    """Whether the rows of ``columns`` (numpy arrays, no nulls) are lexicographically
    non-decreasing."""
    import numpy as np

    if len(columns[0]) < 2:
        return True
    ok = np.zeros(len(columns[0]) - 1, dtype=bool)
    tied = np.ones(len(columns[0]) - 1, dtype=bool)
    for col in columns:
        a, b = col[:-1], col[1:]
        ok |= tied & (b > a)
        tied &= b == a
    return bool((ok | tied).all())


def _numpy(table: Any, name: str) -> Any:
    col = table.column(name)
    if col.null_count:
        raise SubstreamsError(f"columnar groups: null {name} in a record row")
    return col.to_numpy()


def _group(parts: list[Any]) -> Group:
    """One epoch's consecutive slices -> its :class:`Group` (checks the order within)."""
    import pyarrow as pa

    table = pa.Table.from_batches(parts).combine_chunks()
    flags = table.column("is_notification").to_pylist()
    marks = flags.count(True)
    if marks > 1 or (marks == 1 and not flags[-1]):
        raise SubstreamsError(
            "rows out of order: an epoch's notification row must be its last and only one "
            f"(notification {table.slice(0, 1).select(list(_IDENT)).to_pylist()[0]})"
        )
    first = table.slice(0, 1).to_pylist()[0]
    info = EpochInfo(
        struct_time(first["epoch"]),
        int(first["control_offset"]),
        int(first["sealed_at_ms"] or 0),
        0,
        control_index=int(first["control_index"] or 0),
    )
    group = Group(info)
    records = table
    if marks:
        group.marker = table.slice(table.num_rows - 1, 1).to_pylist()[0]
        info.records = int(group.marker["records"] or 0)
        records = table.slice(0, table.num_rows - 1)
    if not _ascending([_numpy(records, c) for c in _ORDER]):
        raise SubstreamsError(
            f"rows out of order within notification {info.ident}: records must come in read "
            f"order {_ORDER}"
        )
    keep = [c for c in records.column_names if c not in META_COLUMNS or c in KEPT_META]
    info.table = records.select(keep)
    return group


def arrow_groups(batches: Iterable[Any]) -> Iterator[Group]:
    """Arrow batches of a direct unit (the source's schema) -> its epochs in order, each
    with its records as ``info.table``.  Raises if the rows are not in the source's order
    (a plan that lost it would otherwise split an epoch)."""
    import numpy as np

    parts: list[Any] = []
    current: tuple[int, int] | None = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        offsets = _numpy(batch, "control_offset")
        indexes = _numpy(batch, "control_index")
        cuts = np.flatnonzero((offsets[1:] != offsets[:-1]) | (indexes[1:] != indexes[:-1])) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), batch.num_rows]
        for lo, hi in zip(starts, ends, strict=True):
            ident = (int(offsets[lo]), int(indexes[lo]))
            if current is not None and ident != current:
                if ident < current:
                    raise SubstreamsError(
                        f"rows out of order: notification {ident} after {current} (the "
                        "source yields epochs in notification order)"
                    )
                yield _group(parts)
                parts = []
            current = ident
            parts.append(batch.slice(lo, hi - lo))
    if parts:
        yield _group(parts)
