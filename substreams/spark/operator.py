"""The operator API and the pure functions that run it: grouping, ordering, application.

User code sees each completed epoch once, in notification order: ``on_epoch(epoch, rows)``
with every record of the epoch and none of any other (or, for an operator that declares an
input key with ``group_by``, once per key of the epoch with that key's records).  Results
are plain dicts shaped like the output stream's schema.

Why pure functions here: the same code runs on the executors (over the rows of one Spark
partition, sorted by the JVM on :func:`sort_columns`) and in the in-memory harness
(:mod:`substreams.spark.testing`, which sorts with :func:`row_order`, the same columns in
Python), so a unit test of an operator exercises exactly the grouping and ordering the
cluster uses.  Nothing here imports PySpark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from substreams.control.notes import EpochNote as EpochNote
from substreams.errors import SubstreamsError
from substreams.frontier import Time
from substreams.spark.epochs import (
    META_COLUMNS,
    epoch_int,
    epoch_key,
    epoch_struct,
    format_time,
    parse_time,
    struct_time,
)

Row = dict[str, Any]

KEPT_META = ("order_key", "partition", "offset")
"""The source's metadata columns an operator's rows keep (read position and order key)."""


@dataclass
class EpochInfo:
    """One completed epoch (or, with ``group_by``, one key of it) as the operator sees it."""

    time: Time
    control_offset: int
    sealed_at_ms: int
    records: int
    rows: list[Row] = field(default_factory=list)
    notified_at_ms: int = 0
    """When the notification reached the driver (wall clock): latency = this - sealed_at_ms."""
    control_index: int = 0
    key: Any = None
    """The ``group_by`` value of this group (None for a per-epoch operator)."""
    table: Any = None
    """The records as a ``pyarrow.Table`` (payload columns and :data:`KEPT_META`) when
    they came columnar (:func:`substreams.spark.columnar.arrow_groups`); ``rows`` is then
    empty."""

    @property
    def ident(self) -> tuple[int, int]:
        """The notification's identity and order: (control offset, index in its record)."""
        return self.control_offset, self.control_index


class EpochOperator:
    """Subclass and override :meth:`on_epoch` (and optionally the other hooks).

    ``on_epoch`` and ``on_record`` run on the executors, on a copy of the operator shipped
    with each task: state kept in ``self`` does not survive from one epoch to the next (two
    epochs may run in different processes).  They may be called again for an epoch whose
    batch is replayed after a crash; the results are then written only if they were not
    committed before, so they must be a function of the rows.  ``on_notification`` runs on
    the driver, once per epoch, in notification order."""

    key_field: str | None = None
    """Result field used as the Kafka key (partitioning) of published results."""

    group_by: str | None = None
    """An input field: when set, ``on_epoch`` is called once per value of it within each
    epoch, with that value's records only (and never with none), and the groups of one
    epoch may run in parallel on different executors."""

    def on_record(self, row: Row) -> Iterable[Row] | None:
        """Called for each record, in order, before its group's ``on_epoch``."""
        return None

    def on_epoch(self, epoch: Time, rows: list[Row]) -> Iterable[Row]:
        """All records of ``epoch`` (or of one key of it); returns the results to publish."""
        raise NotImplementedError

    def output_times(self, epoch: Time, output_substreams: Sequence[str]) -> Mapping[str, Time]:
        """Which time to seal in each output substream once ``epoch``'s results are
        written (default: the same time, for jobs that keep the input's time domain).
        Runs on the driver."""
        return {name: epoch for name in output_substreams}

    def on_notification(self, note: EpochNote) -> None:
        """Driver side: ``note``'s epoch is complete, its results durable and sealed."""


class ArrowEpochOperator(EpochOperator):
    """A columnar operator: override :meth:`on_epoch_table` instead of ``on_epoch``.

    Why: a per-record Python loop (a dict per row, ``on_epoch`` over a list) costs more
    than reading the record; an operator that computes with pyarrow (or pandas / numpy)
    over a whole epoch's columns gets them without rows ever being built.  On the direct
    path (no ``group_by``) ``run()`` hands each epoch's records over as the ``pyarrow.Table``
    the source's Arrow batches form, in read order (payload columns plus ``order_key``,
    ``partition``, ``offset``); ``on_record`` is not called there.  Everywhere else (a
    ``group_by`` operator, the in-memory harness, :meth:`EpochBatchHandler.handle`) the
    rows are made into a table with ``pyarrow.Table.from_pylist`` first -- the same
    records, column types inferred, and an epoch without records may come as a table
    without columns: check ``table.num_rows``."""

    def on_epoch_table(self, epoch: Time, table: Any) -> Iterable[Row]:
        """Every record of ``epoch`` (or of one key of it) as a ``pyarrow.Table``."""
        raise NotImplementedError

    def on_epoch(self, epoch: Time, rows: list[Row]) -> Iterable[Row]:
        import pyarrow as pa

        return self.on_epoch_table(epoch, pa.Table.from_pylist(rows))


EpochFunction = Callable[[Time, list[Row]], Iterable[Row] | None]


class FunctionOperator(EpochOperator):
    """A plain function as an operator (``run(fn, ...)``, in the Bytewax way):
    ``fn(epoch, rows) -> results``."""

    def __init__(
        self,
        fn: EpochFunction,
        *,
        key_field: str | None = None,
        group_by: str | None = None,
        on_notification: Callable[[EpochNote], None] | None = None,
    ) -> None:
        self.fn = fn
        self.key_field = key_field
        self.group_by = group_by
        self._notify = on_notification

    def on_epoch(self, epoch: Time, rows: list[Row]) -> Iterable[Row]:
        return list(self.fn(epoch, rows) or ())

    def on_notification(self, note: EpochNote) -> None:
        if self._notify is not None:
            self._notify(note)


def as_operator(op: EpochOperator | EpochFunction) -> EpochOperator:
    if isinstance(op, EpochOperator):
        return op
    if callable(op):
        return FunctionOperator(op)
    raise SubstreamsError(f"not an operator or a function: {op!r}")


# -- ordering and grouping (the same on executors and in the harness) ------------------------


def partition_columns(group_by: str | None) -> tuple[str, ...]:
    """The columns that send a group's rows to one task: the notification's identity (and
    the key).  Hash partitioning on them is deterministic, so a replayed batch sends every
    row to the same task as before."""
    ident = ("control_offset", "control_index")
    return ident if group_by is None else (*ident, group_by)


def sort_columns(group_by: str | None) -> tuple[str, ...]:
    """The order of rows within a task: by notification, (key,) records before their
    epoch's notification row, then in read order (order key, partition, offset)."""
    return (*partition_columns(group_by), "is_notification", "order_key", "partition", "offset")


def row_order(group_by: str | None) -> Callable[[Row], tuple[Any, ...]]:
    """:func:`sort_columns` as a Python sort key, with Spark's ascending order: nulls
    first, False before True."""
    cols = sort_columns(group_by)

    def key(row: Row) -> tuple[Any, ...]:
        return tuple((row.get(c) is not None, row.get(c)) for c in cols)

    return key


@dataclass
class Group:
    """Consecutive sorted rows of one notification (and key): the records, and the
    notification row (the epoch's marker) when this task holds it."""

    info: EpochInfo
    marker: Row | None = None


def _strip(row: Row, drop: frozenset[str]) -> Row:
    return {k: v for k, v in row.items() if k not in drop}


_DROP = frozenset(n for n in META_COLUMNS if n not in KEPT_META)


def groups(rows: Iterable[Row], group_by: str | None = None) -> Iterator[Group]:
    """Rows sorted by :func:`sort_columns` -> groups in that order.  Raises if the rows are
    not sorted (a plan that lost the order would otherwise split an epoch)."""
    order = row_order(group_by)
    current: Group | None = None
    last: tuple[Any, ...] | None = None
    cols = len(partition_columns(group_by))
    for row in rows:
        pos = order(row)
        if last is not None and pos < last:
            raise SubstreamsError(
                f"rows out of order: {pos} after {last} (the plan must sort by "
                f"{sort_columns(group_by)})"
            )
        if current is None or last is None or pos[:cols] != last[:cols]:
            if current is not None:
                yield current
            current = Group(
                EpochInfo(
                    struct_time(row["epoch"]),
                    int(row["control_offset"]),
                    int(row["sealed_at_ms"] or 0),
                    0,
                    control_index=int(row["control_index"] or 0),
                    key=None if group_by is None else row.get(group_by),
                )
            )
        last = pos
        if row["is_notification"]:
            current.marker = row
            current.info.records = int(row["records"] or 0)
        else:
            current.info.rows.append(_strip(row, _DROP))
    if current is not None:
        yield current


def info_rows(info: EpochInfo, first_offset: int = 0) -> list[Row]:
    """The source's rows of one epoch: its records (``info.rows``, payload dicts, in read
    order) then its notification row -- what a firm batch holds for it."""
    key, coords, kind = epoch_struct(info.time)
    meta = {
        "epoch": {"key": key, "coords": coords, "kind": kind},
        "epoch_label": format_time(info.time),
        "epoch_int": epoch_int(info.time),
        "epoch_key": epoch_key(info.time),
        "control_offset": info.control_offset,
        "control_index": info.control_index,
        "sealed_at_ms": info.sealed_at_ms,
    }
    fields = {k for r in info.rows for k in r if k not in META_COLUMNS}
    out: list[Row] = []
    for k, r in enumerate(info.rows):
        out.append({
            **dict.fromkeys(fields), **r, **meta, "order_key": r.get("order_key", k),
            "partition": r.get("partition", 0), "offset": r.get("offset", first_offset + k),
            "records": None, "is_notification": False,
        })
    out.append({
        **dict.fromkeys(fields), **meta, "order_key": None, "partition": None,
        "offset": None, "records": len(info.rows) or info.records, "is_notification": True,
    })
    return out


@dataclass
class GroupResult:
    group: Group
    results: list[Row]


def apply_operator(op: EpochOperator, grouped: Iterable[Group]) -> Iterator[GroupResult]:
    """Run ``op`` over ``grouped`` in order: ``on_record`` per record, then ``on_epoch``
    (for a per-epoch operator also on an epoch without records; for a per-key one only on a
    group with records)."""
    for g in grouped:
        out: list[Row] = []
        for row in g.info.rows:
            out += list(op.on_record(row) or ())
        table = g.info.table
        if table is not None:
            if op.group_by is None or table.num_rows > 0:
                if not isinstance(op, ArrowEpochOperator):
                    raise SubstreamsError("columnar groups need an ArrowEpochOperator")
                out += list(op.on_epoch_table(g.info.time, table) or ())
        elif op.group_by is None or g.info.rows:
            out += list(op.on_epoch(g.info.time, g.info.rows) or ())
        yield GroupResult(g, out)


@dataclass(frozen=True)
class Summary:
    """One task's word about one notification (what goes back to the driver: no records)."""

    control_offset: int
    control_index: int
    epoch_label: str
    is_notification: bool
    records: int
    sealed_at_ms: int
    results: int
    unit: int
    written: bool


def summaries(results: Iterable[GroupResult], unit: int, written: bool) -> list[Summary]:
    """Per notification seen by this task: its marker's counts (if here) and the number of
    results this task wrote for it."""
    out: dict[tuple[int, int], Summary] = {}
    for r in results:
        info = r.group.info
        prev = out.get(info.ident)
        marker = r.group.marker is not None or (prev is not None and prev.is_notification)
        out[info.ident] = Summary(
            info.control_offset,
            info.control_index,
            format_time(info.time),
            marker,
            info.records if r.group.marker is not None else (prev.records if prev else 0),
            info.sealed_at_ms,
            len(r.results) + (prev.results if prev else 0),
            unit,
            written,
        )
    return list(out.values())


def notifications(
    parts: Iterable[Summary], notified_at_ms: int, replayed: bool = False
) -> list[EpochNote]:
    """The tasks' summaries of a batch -> one note per epoch, in notification order.  Every
    epoch has exactly one notification row (the source emits it), so exactly one summary
    with ``is_notification``; the others add results."""
    marks: dict[tuple[int, int], Summary] = {}
    results: dict[tuple[int, int], int] = {}
    for s in parts:
        ident = (s.control_offset, s.control_index)
        results[ident] = results.get(ident, 0) + s.results
        if s.is_notification:
            if ident in marks:
                raise SubstreamsError(f"notification {ident} summarised twice")
            marks[ident] = s
    missing = sorted(set(results) - set(marks))
    if missing:
        raise SubstreamsError(f"no notification row for {missing} (is the 'markers' option on?)")
    return [
        EpochNote(
            parse_time(marks[i].epoch_label),
            i[0],
            i[1],
            marks[i].records,
            marks[i].sealed_at_ms,
            notified_at_ms,
            results[i],
            replayed,
        )
        for i in sorted(marks)
    ]

