"""An in-memory harness: run an operator over epochs without Spark or Kafka.

``run_operator(op, {epoch: records, ...})`` builds the rows the ``substreams`` source
would give (payload plus metadata columns, one notification row per epoch), sends them to
``units`` tasks by the partitioning columns, sorts each task's rows by the same columns
the executors sort on (:func:`~substreams.spark.operator.sort_columns`) and runs the very
functions an executor task runs (:func:`~substreams.spark.operator.groups`,
:func:`~substreams.spark.operator.apply_operator`, :func:`~substreams.spark.operator.summaries`),
then the driver's :func:`~substreams.spark.operator.notifications`, calling
``on_notification`` once per epoch in notification order.  No PySpark import.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from substreams.frontier import Time
from substreams.spark.operator import (
    EpochFunction,
    EpochInfo,
    EpochNote,
    EpochOperator,
    Row,
    Summary,
    apply_operator,
    as_operator,
    groups,
    info_rows,
    notifications,
    partition_columns,
    row_order,
    summaries,
)

Epochs = Mapping[Time, Sequence[Row]] | Sequence[tuple[Time, Sequence[Row]]]
"""Epochs in notification order, each with its records (payload dicts) in read order."""


@dataclass
class HarnessResult:
    results: dict[Time, list[Row]] = field(default_factory=dict)
    """Per epoch (in notification order), the results the operator published for it."""
    notes: list[EpochNote] = field(default_factory=list)
    """What ``on_notification`` received, in order."""
    seals: list[Mapping[str, Time]] = field(default_factory=list)
    """Per epoch, the output times the driver would seal (``op.output_times``)."""


def source_rows(epochs: Epochs, *, sealed_at_ms: int = 1) -> list[Row]:
    """The source's rows for ``epochs`` (:func:`~substreams.spark.operator.info_rows`):
    epoch ``i`` is the notification at control offset ``i``; records get order keys and
    offsets in their given order."""
    items = list(epochs.items()) if isinstance(epochs, Mapping) else list(epochs)
    fields = {k for _, records in items for r in records for k in r}
    rows: list[Row] = []
    offset = 0
    for i, (t, records) in enumerate(items):
        payloads = [{**dict.fromkeys(fields), **r} for r in records]
        rows += info_rows(EpochInfo(t, i, sealed_at_ms, len(records), payloads), offset)
        offset += len(records)
    return rows


def _unit_of(row: Row, cols: Sequence[str], units: int) -> int:
    return zlib.crc32(repr(tuple(row.get(c) for c in cols)).encode()) % units


def run_rows(
    op: EpochOperator, rows: Iterable[Row], *, units: int = 2,
    output_substreams: Sequence[str] = (), notified_at_ms: int = 0,
) -> HarnessResult:
    """Run ``op`` over source rows (in any order) as a batch on ``units`` tasks."""
    cols = partition_columns(op.group_by)
    tasks: list[list[Row]] = [[] for _ in range(units)]
    for row in rows:
        tasks[_unit_of(row, cols, units)].append(row)
    out = HarnessResult()
    sums: list[Summary] = []
    results: dict[tuple[int, int], list[Row]] = {}
    times: dict[tuple[int, int], Time] = {}
    for unit, task in enumerate(tasks):
        task.sort(key=row_order(op.group_by))
        done = list(apply_operator(op, groups(task, op.group_by)))
        for r in done:
            results.setdefault(r.group.info.ident, []).extend(r.results)
            times[r.group.info.ident] = r.group.info.time
        sums += summaries(done, unit, written=True)
    out.notes = notifications(sums, notified_at_ms)
    for note in out.notes:
        out.results[note.time] = results.get(note.ident, [])
        out.seals.append(op.output_times(note.time, output_substreams))
        op.on_notification(note)
    return out


def run_operator(
    operator: EpochOperator | EpochFunction,
    epochs: Epochs,
    *,
    units: int = 2,
    output_substreams: Sequence[str] = (),
) -> HarnessResult:
    """Run ``operator`` over ``epochs`` (module doc) and return its results, the
    notifications and the seals."""
    op = as_operator(operator)
    return run_rows(op, source_rows(epochs), units=units, output_substreams=output_substreams)


__all__ = ["HarnessResult", "run_operator", "run_rows", "source_rows"]

