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
from pathlib import Path
from typing import Any

from substreams.config import Config, load_config
from substreams.errors import SubstreamsError
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
from substreams.streams.validate import payload_mismatch

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
    config: Config | str | Path | None = None,
    output_stream: str | None = None,
) -> HarnessResult:
    """Run ``operator`` over ``epochs`` (module doc) and return its results, the
    notifications and the seals.

    With ``output_stream`` (a stream of ``config``, a loaded config or its path) every
    result is checked against that stream's schema, as the executors' publisher would
    refuse it: an :class:`OperatorOutputError` names the stream, the epoch, the result,
    the field and the value -- here, in a test, rather than in a Spark task's log."""
    op = as_operator(operator)
    schema: Mapping[str, Any] | None = None
    if output_stream is not None:
        if config is None:
            raise SubstreamsError("run_operator: output_stream needs the config that names it")
        loaded = config if isinstance(config, Config) else load_config(config)
        schema = loaded.stream(output_stream).schema
    out = run_rows(op, source_rows(epochs), units=units, output_substreams=output_substreams)
    if schema is not None:
        assert output_stream is not None
        check_results(output_stream, schema, out.results)
    return out


class OperatorOutputError(SubstreamsError):
    """An operator returned a result its output stream's schema does not accept."""


def check_results(
    stream: str, schema: Mapping[str, Any], results: Mapping[Time, Sequence[Row]]
) -> None:
    """Every result fits ``stream``'s ``schema``, or an :class:`OperatorOutputError`
    naming the first that does not (epoch, index, field, value)."""
    for epoch, rows in results.items():
        for i, row in enumerate(rows):
            why = payload_mismatch(schema, row) if isinstance(row, Mapping) else (
                f"a result must be a dict of the output's fields, not {type(row).__name__}"
            )
            if why is not None:
                raise OperatorOutputError(
                    f"stream '{stream}': epoch {epoch!r}, result {i}: {why}"
                )


__all__ = [
    "HarnessResult", "OperatorOutputError", "check_results", "run_operator", "run_rows",
    "source_rows",
]

